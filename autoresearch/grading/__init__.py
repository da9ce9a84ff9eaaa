"""Grading AutoResearch solutions: submission validation, the metric registry, leaderboard position
and medals, the reward ladder, execution grading and the anchor reward source."""

from wmrl.autoresearch.grading.grader import ExecutionGrader, GradeResult, check_syntax
from wmrl.autoresearch.grading.ladder import FAILURE_STATUSES, STATUSES, RewardLadder
from wmrl.autoresearch.grading.leaderboard import (
    BoardPosition,
    MedalResult,
    leaderboard_position,
    medal_thresholds,
    medals,
    position_score,
    relative_gap,
)
from wmrl.autoresearch.grading.metrics import METRICS, Metric, MetricError, get_metric, metric_names
from wmrl.autoresearch.grading.scoring import SubmissionScore, score_submission
from wmrl.autoresearch.grading.source import ExecutionRewardSource, as_solution
from wmrl.autoresearch.grading.validation import SubmissionError, read_answers, validate_submission

__all__ = [
    "FAILURE_STATUSES",
    "METRICS",
    "STATUSES",
    "BoardPosition",
    "ExecutionGrader",
    "ExecutionRewardSource",
    "GradeResult",
    "MedalResult",
    "Metric",
    "MetricError",
    "RewardLadder",
    "SubmissionError",
    "SubmissionScore",
    "as_solution",
    "check_syntax",
    "get_metric",
    "leaderboard_position",
    "medal_thresholds",
    "medals",
    "metric_names",
    "position_score",
    "read_answers",
    "relative_gap",
    "score_submission",
    "validate_submission",
]
