"""Score a submission file: validate it, compute the metric, rank it on the leaderboards.

This is the trusted half of grading; it runs in the parent process, never inside the sandbox.
"""

from __future__ import annotations

import os
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


def score_aligned(task: Task, aligned: AlignedSubmission) -> SubmissionScore:
    """Metric, position and medal of an aligned (already valid) submission."""
    counted = np.ones(len(aligned.ids), dtype=bool)
    if aligned.usage is not None:
        counted = aligned.usage != "Ignored"
    score = _metric_value(task, aligned.y_true[counted], aligned.y_pred[counted])
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
        board_scores[board] = _metric_value(task, aligned.y_true[rows], aligned.y_pred[rows])
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
    return score_aligned(task, validate_submission(path, task, answers))
