"""Submission validation: check a submission CSV against a task and align it with the answers.

Every failure raises :class:`SubmissionError` with a machine-readable ``code`` and a sentence an
agent (or a person) can act on. Codes:

``no_file``, ``unreadable``, ``empty``, ``wrong_columns``, ``duplicate_ids``, ``wrong_row_count``,
``missing_ids``, ``extra_ids``, ``missing_values``, ``non_finite``, ``wrong_type``, ``out_of_range``.

Ids are compared as text, exactly as written (``"7"`` and ``"7.0"`` are different ids), because ids
are names, not numbers. Target values are converted according to the metric's prediction kind.

A Kaggle-style answers file may carry a ``Usage`` column (``Public``/``Private``) that assigns each
test row to the public or the private leaderboard; it is returned as ``usage``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.autoresearch.grading.metrics import Metric, get_metric
from wmrl.autoresearch.tasks.model import Task

__all__ = [
    "MAX_SUBMISSION_BYTES",
    "USAGE_COLUMN",
    "AlignedSubmission",
    "SubmissionError",
    "read_answers",
    "validate_submission",
]

#: A submission larger than this is refused unread (a solution printing gigabytes of CSV).
MAX_SUBMISSION_BYTES = 512 * 1024 * 1024
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


def _raw_header(path: Path) -> list[str] | None:
    """The first CSV line's fields as written (None when it cannot be decoded)."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            return next(csv.reader(fh), None)
    except (UnicodeDecodeError, csv.Error):
        return None


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


def validate_submission(path: str | os.PathLike | None, task: Task, answers=None) -> AlignedSubmission:
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
    size = path.stat().st_size
    if size > MAX_SUBMISSION_BYTES:
        raise SubmissionError(
            "unreadable", f"the submission is {size} bytes, over the {MAX_SUBMISSION_BYTES}-byte limit"
        )
    if size == 0:
        raise SubmissionError("empty", "the submission file is empty (no header, no rows)")
    metric = get_metric(task.metric)
    answers = read_answers(task) if answers is None else answers
    header = _raw_header(path)
    frame = _read_csv(path, "submission")

    required = [*task.id_columns, *task.target_columns]
    # pandas renames a repeated column ("y" -> "y.1"); the raw header shows the repetition.
    columns = (
        header
        if header is not None and len(header) == len(frame.columns)
        else [str(c) for c in frame.columns]
    )
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
    if len(frame) == 0:
        raise SubmissionError(
            "empty", f"the submission has a header but no rows; expected {len(answers)} rows"
        )

    sub_ids = _row_ids(frame, task.id_columns)
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
        truth_cols.append(_convert(answers[column].to_numpy(dtype=object), metric, column, ans_ids, True))
        pred_cols.append(_convert(frame[column].to_numpy(dtype=object)[take], metric, column, ans_ids, False))
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
