"""Helpers the loaders share: read CSV headers and leaderboards, find a metric named in code or prose,
and infer a task's category and modality from its files.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from pathlib import Path

from wmrl.autoresearch.tasks.model import TaskError

__all__ = [
    "answer_labels",
    "csv_header",
    "detect_metric_in_code",
    "detect_metric_in_text",
    "guess_category",
    "guess_modality",
    "read_scores",
]

_LFS = "version https://git-lfs"
_IMAGE = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".gif", ".dcm", ".webp"}
_AUDIO = {".wav", ".mp3", ".aif", ".aiff", ".flac", ".ogg"}


def _check_not_lfs(path: Path) -> None:
    with open(path, encoding="utf-8", errors="replace") as fh:
        if fh.read(len(_LFS)) == _LFS:
            raise TaskError(
                f"{path} is a Git LFS pointer, not the file itself; run `git lfs pull` where it came from"
            )


def csv_header(path: Path) -> list[str]:
    """Column names of a CSV file (first line)."""
    if not path.is_file():
        raise TaskError(f"expected a CSV file at {path}")
    _check_not_lfs(path)
    with open(path, newline="", encoding="utf-8-sig") as fh:
        try:
            return [c.strip() for c in next(csv.reader(fh))]
        except StopIteration:
            raise TaskError(f"{path} is empty; expected a CSV header") from None


def read_scores(path: Path, column: str | None = None, rank_column: str | None = None) -> list[float]:
    """Finite scores of a leaderboard CSV, best first when a rank column orders them.

    Args:
        path: the CSV.
        column: score column name (``"score"``); None means the second column (MLE-Dojo's rule).
        rank_column: if given and present, rows are ordered by it (ascending) before returning.

    Rows whose score is empty or not finite (Kaggle lists teams without a score) are dropped.
    """
    if not path.is_file():
        raise TaskError(f"leaderboard file {path} does not exist")
    _check_not_lfs(path)
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise TaskError(f"leaderboard {path} is empty")
    header = [h.strip() for h in rows[0]]
    if column is None:
        if len(header) < 2:
            raise TaskError(
                f"leaderboard {path} needs at least two columns (rank, score); header is {header}"
            )
        idx = 1
    elif column in header:
        idx = header.index(column)
    else:
        raise TaskError(f"leaderboard {path} has no {column!r} column; header is {header}")
    rank_idx = header.index(rank_column) if rank_column and rank_column in header else None
    entries = []
    for n, row in enumerate(rows[1:]):
        if len(row) <= idx:
            continue
        try:
            value = float(row[idx])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        order: float = n
        if rank_idx is not None:
            try:
                order = float(row[rank_idx])
            except (ValueError, IndexError):
                order = math.inf
        entries.append((order, n, value))
    entries.sort()
    scores = [v for _, _, v in entries]
    if not scores:
        raise TaskError(f"leaderboard {path} has no finite scores")
    return scores


# Ordered: the first pattern that matches wins, so specific names come before general ones.
_CODE_PATTERNS: Sequence[tuple[str, str]] = (
    (r"weights\s*=\s*['\"]quadratic['\"]|quadratic_weighted_kappa|\bqwk\b", "quadratic_weighted_kappa"),
    (r"mean_column_wise_rmsle|column_wise_rmsle", "mean_columnwise_rmsle"),
    (r"\bmcrmse\b|mean_columnwise_rmse", "mcrmse"),
    (r"spearman", "spearman"),
    (r"normalized_gini|\bgini\b", "normalized_gini"),
    (r"roc_auc|auc_score|\bauc\b", "roc_auc"),
    (r"log_loss|logloss", "log_loss"),
    (r"mean_squared_log_error|rmsle|root_mean_squared_log_error", "rmsle"),
    (r"sqrt\(\s*mean_squared_error|\brmse\b|root_mean_squared_error|calculate_rmse", "rmse"),
    (r"mean_squared_error", "mse"),
    (r"median_absolute_error", "median_absolute_error"),
    (r"\bsmape\b", "smape"),
    (r"mean_absolute_percentage_error|\bmape\b", "mape"),
    (r"mean_absolute_error|np\.mean\(\s*np\.abs\(", "mae"),
    (r"r2_score", "r2"),
    (r"average\s*=\s*['\"]macro['\"]", "f1_macro"),
    (r"average\s*=\s*['\"]micro['\"]", "f1_micro"),
    (r"f1_score", "f1"),
    (r"matthews_corrcoef", "mcc"),
    (r"balanced_accuracy", "balanced_accuracy"),
    (r"map_at_3|mpa_at_3|map@3|apk\(.*3", "map@3"),
    (r"map_at_5|map@5", "map@5"),
    (r"accuracy_score|\baccuracy\b|==.*\)\.mean\(\)", "accuracy"),
    (r"pearsonr|pearson", "pearson"),
)

_TEXT_PATTERNS: Sequence[tuple[str, str]] = (
    (r"quadratic weighted kappa|quadratic kappa", "quadratic_weighted_kappa"),
    (r"mean column-?wise root mean squared error|\bmcrmse\b", "mcrmse"),
    (r"mean column-?wise (rmsle|root mean squared log)", "mean_columnwise_rmsle"),
    (r"spearman", "spearman"),
    (r"normali[sz]ed gini", "normalized_gini"),
    (r"root mean squared log(arithmic)? error|\brmsle\b", "rmsle"),
    (r"root mean squared? error|\brmse\b", "rmse"),
    (r"mean squared error|\bmse\b", "mse"),
    (r"symmetric mean absolute percentage error|\bsmape\b", "smape"),
    (r"mean absolute percentage error|\bmape\b", "mape"),
    (r"median absolute error", "median_absolute_error"),
    (r"mean absolute error|\bmae\b", "mae"),
    (r"area under the roc|roc curve|\bauc\b|roc[- ]auc", "roc_auc"),
    (r"log(arithmic)?[- ]?loss|cross[- ]entropy", "log_loss"),
    (r"coefficient of determination|\br2\b|r²|r-squared", "r2"),
    (r"macro[- ]?(averaged )?f1|f1[- ]macro|mean f1", "f1_macro"),
    (r"micro[- ]?(averaged )?f1|f1[- ]micro", "f1_micro"),
    (r"\bf1\b|f1 score|f-score", "f1"),
    (r"matthews", "mcc"),
    (r"balanced accuracy", "balanced_accuracy"),
    (r"map@3|mean average precision @ ?3|map at 3", "map@3"),
    (r"map@5|mean average precision @ ?5|map at 5", "map@5"),
    (r"classification accuracy|\baccuracy\b|percentage of .* correctly", "accuracy"),
    (r"pearson", "pearson"),
)


def detect_metric_in_code(source: str) -> str | None:
    """Registry name of the metric a grading script computes, or None.

    DSBench scripts assign ``performance = <metric call>``; when that line exists only it is read
    (the scripts import metrics they do not use). Otherwise the whole source is scanned.
    """
    lines = [ln for ln in source.splitlines() if re.match(r"\s*performance\s*=", ln)]
    texts = [*lines, source] if lines else [source]
    for text in texts:
        # A bare ``performance = smape`` names a variable computed above: scan its definition too.
        for pattern, name in _CODE_PATTERNS:
            if re.search(pattern, text, flags=re.IGNORECASE):
                return name
    return None


def _evaluation_section(text: str) -> str:
    match = re.search(r"(?im)^\s*#*\s*\**\s*evaluation\b.*$", text)
    if not match:
        return text
    rest = text[match.end() :]
    nxt = re.search(r"(?m)^\s*#{1,3}\s+\w", rest)
    return rest[: nxt.start()] if nxt else rest[:3000]


def detect_metric_in_text(text: str) -> str | None:
    """Registry name of the metric a task description names in its Evaluation section, or None."""
    section = _evaluation_section(text).lower()
    for pattern, name in _TEXT_PATTERNS:
        if re.search(pattern, section):
            return name
    return None


def guess_category(metric_name: str, n_targets: int, answer_labels: set[str] | None) -> str:
    """``binary`` / ``multiclass`` / ``multilabel`` / ``regression`` / ``other`` from the metric and answers."""
    from wmrl.autoresearch.grading.metrics import MetricError, get_metric

    try:
        metric = get_metric(metric_name)
    except MetricError:  # a task's own grader (grade_fn): only the answers can tell
        if n_targets != 1:
            return "other"
        if answer_labels is None:
            return "regression"
        return "binary" if len(answer_labels) <= 2 else "multiclass"
    if metric.prediction == "ranking":
        return "other"
    if metric.name in ("log_loss",) and n_targets > 1:
        return "multiclass"
    if metric.name in ("roc_auc", "normalized_gini") and n_targets > 1:
        return "multilabel"
    if metric.name in ("roc_auc", "normalized_gini", "log_loss", "f1"):
        return "binary"
    if metric.prediction in ("label", "integer"):
        if answer_labels is not None and len(answer_labels) <= 2:
            return "binary"
        return "multiclass"
    return "regression"


def guess_modality(public_dir: Path, train_file: Path | None = None) -> str:
    """``image`` / ``audio`` if such files ship in the public folder, ``text`` if the training table has
    long free-text columns, else ``tabular``."""
    suffixes = set()
    for i, path in enumerate(public_dir.rglob("*")):
        if i > 5000:
            break
        suffixes.add(path.suffix.lower())
    if suffixes & _IMAGE:
        return "image"
    if suffixes & _AUDIO:
        return "audio"
    if train_file is not None and train_file.is_file():
        with open(train_file, newline="", encoding="utf-8-sig", errors="replace") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            lengths = [0] * len(header)
            rows = 0
            for row in reader:
                rows += 1
                for j, cell in enumerate(row[: len(header)]):
                    if not _is_number(cell):
                        lengths[j] += len(cell.split())
                if rows >= 200:
                    break
        if rows and max(lengths, default=0) / rows >= 8:  # a column averaging >= 8 words is prose
            return "text"
    return "tabular"


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def answer_labels(answers: Path, target: str, limit: int = 50) -> set[str] | None:
    """Distinct values of the ``target`` column of an answers CSV (None when more than ``limit``:
    then it is not a class label)."""
    if not answers.is_file():
        raise TaskError(f"answers file {answers} does not exist")
    with open(answers, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or target not in reader.fieldnames:
            raise TaskError(f"answers {answers} lack the target column {target!r}")
        seen: set[str] = set()
        for row in reader:
            seen.add(row[target])
            if len(seen) > limit:
                return None
    return seen
