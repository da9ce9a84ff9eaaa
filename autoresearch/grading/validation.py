"""Submission validation: check a submission CSV against a task and align it with the answers.

Every failure raises :class:`SubmissionError` with a machine-readable ``code`` and a sentence an
agent (or a person) can act on. Codes:

``no_file``, ``unreadable``, ``empty``, ``wrong_columns``, ``duplicate_ids``, ``wrong_row_count``,
``missing_ids``, ``extra_ids``, ``missing_values``, ``non_finite``, ``wrong_type``, ``out_of_range``.

Ids are compared as text, exactly as written (``"7"`` and ``"7.0"`` are different ids), because ids
are names, not numbers. Target values are converted according to the metric's prediction kind.

A Kaggle-style answers file may carry a ``Usage`` column (``Public``/``Private``) that assigns each
test row to the public or the private leaderboard; it is returned as ``usage``.

**Memory bound.** A submission is untrusted input of any size, so it is checked before it is
parsed and parsed in one streaming pass (the standard library's ``csv`` reader, one row at a
time), never loaded whole:

1. its size against :func:`submission_byte_limit` (1 MiB + 1 KiB per expected cell, at most
   :data:`MAX_SUBMISSION_BYTES`) and for holes (a sparse file), from ``stat`` alone;
2. while reading, at most ``2 n + 1`` data rows are kept (``n`` = the answers' rows): a longer
   file is refused as ``wrong_row_count`` as soon as row ``2 n + 2`` is seen, unread beyond it.

So the grader holds at most the kept rows (``(2 n + 1) x columns`` short strings, each at most
``csv.field_size_limit()`` characters) plus the answers -- bounded by the task, never by the
submission. ``benchmarks/grader_memory.py`` measures it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.autoresearch.grading.metrics import Metric, get_metric
from wmrl.autoresearch.tasks.model import Task

__all__ = [
    "BYTES_PER_CELL",
    "MAX_SUBMISSION_BYTES",
    "USAGE_COLUMN",
    "AlignedSubmission",
    "SubmissionError",
    "read_answers",
    "submission_byte_limit",
    "validate_submission",
]

#: A submission larger than this is refused unread, whatever the task.
MAX_SUBMISSION_BYTES = 512 * 1024 * 1024
#: Per expected cell (row x required column), the room a submission gets: generous for any
#: number or label (a float's repr is at most 24 characters), far below what a flood needs.
BYTES_PER_CELL = 1024
_HEADER_ALLOWANCE = 1024 * 1024
#: Kaggle's column marking each answer row as ``Public`` or ``Private``.
USAGE_COLUMN = "Usage"
_SHOWN = 3  # how many offending ids / values a message quotes


class SubmissionError(ValueError):
    """A submission that cannot be graded. ``code`` says which rule it broke."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class AlignedSubmission:
    """A valid submission aligned row-for-row with the answers.

    Attributes:
        ids: the id of each row, shape ``(n,)`` (composite ids joined with ``"|"``).
        y_true: answers, shape ``(n,)`` or ``(n, k)`` (``k`` target columns).
        y_pred: predictions, same shape, converted for the metric.
        usage: ``"Public"``/``"Private"`` per row when the answers say so, else None.
    """

    ids: np.ndarray
    y_true: np.ndarray
    y_pred: np.ndarray
    usage: np.ndarray | None


def _read_csv(path: Path, what: str):
    import pandas as pd

    try:
        # Everything as text: ids stay exactly as written, values are converted per metric below.
        return pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise SubmissionError("empty", f"the {what} file is empty (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SubmissionError("unreadable", f"the {what} file is not a readable CSV: {first}") from None


def submission_byte_limit(task: Task, expected_rows: int) -> int:
    """The largest submission file (bytes) graded for ``task`` with ``expected_rows`` test rows."""
    cells = max(1, expected_rows) * (len(task.id_columns) + len(task.target_columns))
    return min(MAX_SUBMISSION_BYTES, _HEADER_ALLOWANCE + cells * BYTES_PER_CELL)


def _sparse(path: Path, size: int) -> bool:
    """Whether the file has a hole (``SEEK_HOLE`` finds one before its end)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < size
    except OSError:
        return False
    finally:
        os.close(fd)


def _stream_rows(path: Path, max_rows: int) -> tuple[list[str] | None, list[list[str]], bool]:
    """``(header, data rows, more)``: at most ``max_rows`` rows are read; ``more`` says a longer
    file was cut there. Blank lines are skipped and short rows padded with ``""`` (as pandas does);
    a row with more fields than the header is unreadable."""
    import csv
    import io

    header: list[str] | None = None
    rows: list[list[str]] = []
    try:
        with open(path, "rb") as raw:
            reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8-sig", newline=""), strict=True)
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = row
                    continue
                if len(row) > len(header):
                    raise SubmissionError(
                        "unreadable",
                        f"the submission file is not a readable CSV: line {reader.line_num} has "
                        f"{len(row)} fields, the header {len(header)}",
                    )
                if len(rows) >= max_rows:
                    return header, rows, True
                rows.append(row + [""] * (len(header) - len(row)))
    except UnicodeDecodeError:
        raise SubmissionError(
            "unreadable", "the submission file is not a readable CSV: not UTF-8 text"
        ) from None
    except csv.Error as err:
        raise SubmissionError("unreadable", f"the submission file is not a readable CSV: {err}") from None
    return header, rows, False


def read_answers(task: Task):
    """The task's answers as a text DataFrame (ids, targets and optional ``Usage``).

    Raises:
        FileNotFoundError: the answers file is missing (a harness problem, not the submission's).
        ValueError: the answers lack an id or target column.
    """
    if not task.answers_path.is_file():
        raise FileNotFoundError(f"task {task.id!r}: answers file {task.answers_path} does not exist")
    frame = _read_csv(task.answers_path, "answers")
    missing = [c for c in (*task.id_columns, *task.target_columns) if c not in frame.columns]
    if missing:
        raise ValueError(f"task {task.id!r}: answers file {task.answers_path} lacks columns {missing}")
    keep = [*task.id_columns, *task.target_columns]
    if USAGE_COLUMN in frame.columns and USAGE_COLUMN not in keep:
        keep.append(USAGE_COLUMN)
    return frame[keep]


def _row_ids(frame, id_columns) -> np.ndarray:
    if len(id_columns) == 1:
        return frame[id_columns[0]].to_numpy(dtype=object)
    return frame[list(id_columns)].astype(str).agg("|".join, axis=1).to_numpy(dtype=object)


def _quote(values) -> str:
    values = list(values)
    shown = ", ".join(repr(v) for v in values[:_SHOWN])
    return shown + (f" (and {len(values) - _SHOWN} more)" if len(values) > _SHOWN else "")


def _convert(values: np.ndarray, metric: Metric, column: str, ids: np.ndarray, is_answer: bool) -> np.ndarray:
    """Convert a column of text cells for ``metric``; raise SubmissionError on a bad cell."""
    text = np.array([v.strip() for v in values], dtype=object)
    blank = text == ""
    if blank.any():
        if is_answer:
            raise ValueError(f"the answers have empty cells in column {column!r}")
        raise SubmissionError(
            "missing_values",
            f"column {column!r} has empty values for ids {_quote(ids[blank])}; every row needs a prediction",
        )
    if metric.prediction in ("label", "ranking"):
        return text
    numbers = np.empty(text.shape, dtype=float)
    bad = []
    for i, cell in enumerate(text):
        low = cell.lower()
        if low in ("true", "false") and (is_answer or metric.prediction != "probability"):
            numbers[i] = 1.0 if low == "true" else 0.0
            continue
        try:
            numbers[i] = float(cell)
        except ValueError:
            bad.append(i)
    if bad:
        if is_answer:
            return text  # class labels such as "yes"/"no": the metric maps them (e.g. to 0/1 for AUC)
        raise SubmissionError(
            "wrong_type",
            f"column {column!r} must hold numbers for metric {metric.name}; got {_quote(text[bad])} "
            f"(ids {_quote(ids[bad])})",
        )
    if is_answer:
        return numbers
    finite = np.isfinite(numbers)
    if not finite.all():
        raise SubmissionError(
            "non_finite", f"column {column!r} has NaN or infinite values for ids {_quote(ids[~finite])}"
        )
    if metric.prediction == "integer" and not np.all(numbers == np.round(numbers)):
        odd = numbers != np.round(numbers)
        raise SubmissionError(
            "wrong_type",
            f"column {column!r} must hold whole-number ratings for metric {metric.name}; got {_quote(numbers[odd])}",
        )
    if metric.prediction == "probability" and np.any((numbers < 0) | (numbers > 1)):
        out = (numbers < 0) | (numbers > 1)
        raise SubmissionError(
            "out_of_range",
            f"column {column!r} must hold probabilities in [0, 1] for metric {metric.name}; got {_quote(numbers[out])}",
        )
    return numbers


def validate_submission(path: str | os.PathLike | None, task: Task, answers=None) -> AlignedSubmission:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    """Check the submission at ``path`` against ``task`` and align it with the answers.

    Args:
        path: the submission CSV (None means the solution wrote none).
        task: the task it answers.
        answers: the answers frame from :func:`read_answers` (read here when None).

    Raises:
        SubmissionError: the submission breaks a rule (``code`` says which).
    """
    if path is None or not Path(path).is_file():
        raise SubmissionError("no_file", "no submission file was written (expected a CSV at SUBMISSION_PATH)")
    path = Path(path)
    answers = read_answers(task) if answers is None else answers
    # A task graded by its own function gets the values as written (that function reads them).
    metric = None if task.grade_fn else get_metric(task.metric)
    size = path.stat().st_size
    limit = submission_byte_limit(task, len(answers))
    if size > limit:
        raise SubmissionError(
            "unreadable",
            f"the submission is {size} bytes, over the {limit}-byte limit for this task "
            f"({len(answers)} rows; {BYTES_PER_CELL} bytes per cell)",
        )
    if size == 0:
        raise SubmissionError("empty", "the submission file is empty (no header, no rows)")
    if _sparse(path, size):
        raise SubmissionError(
            "unreadable", "the submission is a sparse file (it has holes); write it normally"
        )
    header, rows, more = _stream_rows(path, 2 * len(answers) + 1)
    if header is None:
        raise SubmissionError("empty", "the submission file is empty (no header, no rows)")

    required = [*task.id_columns, *task.target_columns]
    columns = header
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    missing = [c for c in required if c not in columns]
    extra = [c for c in columns if c not in required]
    if missing or extra or duplicated:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            hint = " (an unnamed first column usually means the DataFrame index was written: use index=False)"
            parts.append(
                f"unexpected {extra}"
                + (hint if any(c == "" or c.startswith("Unnamed") for c in extra) else "")
            )
        if duplicated:
            parts.append(f"repeated {duplicated}")
        raise SubmissionError(
            "wrong_columns",
            f"the columns must be exactly {required} (as in the sample submission): " + "; ".join(parts),
        )
    if not rows:
        raise SubmissionError(
            "empty", f"the submission has a header but no rows; expected {len(answers)} rows"
        )
    if more:
        raise SubmissionError(
            "wrong_row_count",
            f"the submission has more than {len(rows)} rows but the test set has {len(answers)} "
            "(one row per test id); the rest was not read",
        )
    position = {c: columns.index(c) for c in required}
    frame = {c: np.array([r[position[c]] for r in rows], dtype=object) for c in required}

    if len(task.id_columns) == 1:
        sub_ids = frame[task.id_columns[0]]
    else:
        sub_ids = np.array(
            ["|".join(parts) for parts in zip(*(frame[c] for c in task.id_columns), strict=True)],
            dtype=object,
        )
    ans_ids = _row_ids(answers, task.id_columns)
    seen, dupes = set(), []
    for i in sub_ids:
        if i in seen:
            dupes.append(i)
        seen.add(i)
    if dupes:
        raise SubmissionError("duplicate_ids", f"ids appear more than once: {_quote(dict.fromkeys(dupes))}")
    expected = set(ans_ids.tolist())
    missing_ids = [i for i in ans_ids if i not in seen]
    extra_ids = [i for i in sub_ids if i not in expected]
    if len(sub_ids) != len(ans_ids):
        detail = []
        if missing_ids:
            detail.append(f"{len(missing_ids)} test ids missing, e.g. {_quote(missing_ids)}")
        if extra_ids:
            detail.append(f"{len(extra_ids)} unknown ids, e.g. {_quote(extra_ids)}")
        raise SubmissionError(
            "wrong_row_count",
            f"the submission has {len(sub_ids)} rows but the test set has {len(ans_ids)} (one row per test id)"
            + (": " + "; ".join(detail) if detail else ""),
        )
    if missing_ids:
        raise SubmissionError(
            "missing_ids", f"{len(missing_ids)} test ids are missing, e.g. {_quote(missing_ids)}"
        )
    if extra_ids:
        raise SubmissionError(
            "extra_ids", f"{len(extra_ids)} ids are not in the test set, e.g. {_quote(extra_ids)}"
        )

    order = {key: pos for pos, key in enumerate(sub_ids)}
    take = np.array([order[i] for i in ans_ids], dtype=int)
    truth_cols, pred_cols = [], []
    for column in task.target_columns:
        truth, pred = answers[column].to_numpy(dtype=object), frame[column][take]
        if metric is not None:
            truth = _convert(truth, metric, column, ans_ids, True)
            pred = _convert(pred, metric, column, ans_ids, False)
        truth_cols.append(truth)
        pred_cols.append(pred)
    if len(task.target_columns) == 1:
        y_true, y_pred = truth_cols[0], pred_cols[0]
    else:
        y_true, y_pred = np.stack(truth_cols, axis=1), np.stack(pred_cols, axis=1)
    usage = None
    if USAGE_COLUMN in answers.columns:
        usage = np.array([u.strip().capitalize() for u in answers[USAGE_COLUMN]], dtype=object)
        unknown = sorted(set(usage.tolist()) - {"Public", "Private", "Ignored"})
        if unknown:
            raise ValueError(f"task {task.id!r}: answers column {USAGE_COLUMN!r} has values {unknown}")
    return AlignedSubmission(ids=ans_ids, y_true=y_true, y_pred=y_pred, usage=usage)
