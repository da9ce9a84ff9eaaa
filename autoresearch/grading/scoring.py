"""Score a submission file: validate it, compute the metric, rank it on the leaderboards.

This is the trusted half of grading; it runs in the parent process, never inside the sandbox.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from wmrl.autoresearch.grading.leaderboard import (
    BoardPosition,
    MedalResult,
    leaderboard_position,
    medals,
    relative_gap,
)
from wmrl.autoresearch.grading.metrics import MetricError, get_metric
from wmrl.autoresearch.grading.validation import (
    AlignedSubmission,
    SubmissionError,
    read_answers,
    validate_submission,
)
from wmrl.autoresearch.tasks.model import Task

__all__ = ["SubmissionScore", "score_aligned", "score_submission"]


@dataclass(frozen=True)
class SubmissionScore:
    """The grade of a valid submission.

    Attributes:
        score: the metric on all test rows (metric units).
        board_scores: the score used for each leaderboard: on Kaggle-style tasks (answers with a
            ``Usage`` column) the score on that board's rows, otherwise ``score`` for every board.
        position: mean position score over the boards in [0, 1] (DSBench's relative gap when the
            task has references but no leaderboard).
        positions: per-board position details (empty for a relative-gap position).
        medal: MLE-bench medals on the private board (the public one if there is no private
            board); None for a task without leaderboards.
    """

    score: float
    board_scores: dict[str, float]
    position: float
    positions: dict[str, BoardPosition] = field(default_factory=dict)
    medal: MedalResult | None = None


def _metric_value(task: Task, y_true: np.ndarray, y_pred: np.ndarray) -> float:
    try:
        return get_metric(task.metric)(y_true, y_pred)
    except MetricError as err:
        raise SubmissionError(
            "metric_error", f"the metric cannot be computed on this submission: {err}"
        ) from None


@functools.lru_cache(maxsize=8)
def _typed_answers(path: str, mtime_ns: int, size: int):
    """A task's answers as pandas reads them by default, read once per file version (every rollout of
    a grade_fn task is graded against them; the text frame of ``read_answers`` keeps values as written)."""
    import pandas as pd

    return pd.read_csv(path, encoding="utf-8-sig")


def _grade_fn_measure(task: Task, path, aligned: AlignedSubmission) -> Callable[[np.ndarray], float]:
    """``rows -> score`` with the task's own grading function: the submission and the answers as
    pandas reads them (its default types, as MLE-bench's graders expect), restricted to the answer
    rows ``rows`` (a boolean mask in answer order) when a board covers only some of them."""
    import pandas as pd

    from wmrl.autoresearch.grading.grade_fn import call_grade_fn
    from wmrl.autoresearch.grading.validation import _row_ids

    submission = pd.read_csv(path, encoding="utf-8-sig")
    stat = task.answers_path.stat()
    # a copy: the task's function may change the frame it is given
    answers = _typed_answers(str(task.answers_path), stat.st_mtime_ns, stat.st_size).copy()
    base_dir = task.metadata.get("competition_dir") or task.public_dir
    grade_fn = task.grade_fn  # Task is frozen
    assert grade_fn is not None  # called only for a task with a grade_fn (score_submission)

    def measure(rows: np.ndarray) -> float:
        sub, ans = submission, answers
        if not rows.all():
            keep = set(aligned.ids[rows].tolist())
            ids = _row_ids(submission.astype(str), task.id_columns)
            sub = submission[[i in keep for i in ids]].reset_index(drop=True)
            ans = answers[rows].reset_index(drop=True)
        return call_grade_fn(grade_fn, sub, ans, base_dir=base_dir)

    return measure


def score_aligned(
    task: Task, aligned: AlignedSubmission, measure: Callable[[np.ndarray], float] | None = None
) -> SubmissionScore:
    """Metric, position and medal of an aligned (already valid) submission.

    ``measure``: ``rows -> score`` for a boolean mask over the answer rows (default: the registry
    metric on the aligned values).
    """
    if measure is None:

        def measure(rows: np.ndarray) -> float:
            return _metric_value(task, aligned.y_true[rows], aligned.y_pred[rows])

    counted = np.ones(len(aligned.ids), dtype=bool)
    if aligned.usage is not None:
        counted = aligned.usage != "Ignored"
    score = measure(counted)
    boards = task.leaderboards
    board_scores: dict[str, float] = {}
    for board in boards:
        if aligned.usage is None:
            board_scores[board] = score
            continue
        rows = aligned.usage == board.capitalize()
        if not rows.any():
            raise ValueError(
                f"task {task.id!r} has a {board} leaderboard but no answer rows marked {board.capitalize()!r}"
            )
        board_scores[board] = measure(rows)
    if boards:
        position, per_board = leaderboard_position(board_scores, boards, task.lower_is_better)
        medal_board = "private" if "private" in boards else "public"
        medal = medals(board_scores[medal_board], boards[medal_board], task.lower_is_better)
        return SubmissionScore(score, board_scores, position, per_board, medal)
    assert task.baseline_score is not None and task.oracle_score is not None  # guaranteed by Task
    return SubmissionScore(score, {}, relative_gap(score, task.baseline_score, task.oracle_score))


def score_submission(path: str | os.PathLike | None, task: Task, answers=None) -> SubmissionScore:
    """Validate the submission at ``path`` and grade it.

    Raises:
        SubmissionError: the submission is missing or invalid (``code`` says why).
        FileNotFoundError / ValueError: the task itself is broken (answers missing or malformed).
    """
    answers = read_answers(task) if answers is None else answers
    aligned = validate_submission(path, task, answers)
    if task.grade_fn:
        return score_aligned(task, aligned, _grade_fn_measure(task, path, aligned))
    return score_aligned(task, aligned)
