"""Ranking a score against reference leaderboards.

Two rules, each reproduced from the project that defines it:

* :func:`position_score`: MLE-Dojo's dense reward ("position score", HumanRank). Sort the board
  best-first; the position ``p`` is the first (1-based) row whose score the submission ties or
  beats, ``N + 1`` if it beats none; the score is ``(N - p + 1) / N`` in [0, 1]. A tie counts as
  beating that row. :func:`leaderboard_position` averages it over the available boards (public and
  private), as MLE-Dojo does.
* :func:`medals`: MLE-bench's medal thresholds (Kaggle progression rules) by leaderboard size
  ``N``, with inclusive medal tests, exclusive medals (gold ⇒ not silver ⇒ not bronze) and a
  *strict* above-median test against the board's median.

:func:`relative_gap` is DSBench's relative performance gap, used as the position of a task that has
baseline/oracle references but no leaderboard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BoardPosition",
    "MedalResult",
    "leaderboard_position",
    "medal_thresholds",
    "medals",
    "position_score",
    "relative_gap",
]


def _check_board(board: Sequence[float]) -> np.ndarray:
    scores = np.asarray(board, dtype=float)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError("a leaderboard must be a non-empty 1-D sequence of scores")
    if not np.all(np.isfinite(scores)):
        raise ValueError("a leaderboard must hold finite scores only")
    return scores


def _check_score(score: float) -> float:
    value = float(score)
    if not math.isfinite(value):
        raise ValueError(f"cannot rank a non-finite score ({score})")
    return value


def _best_first(scores: np.ndarray, lower_is_better: bool) -> np.ndarray:
    return np.sort(scores) if lower_is_better else np.sort(scores)[::-1]


@dataclass(frozen=True)
class BoardPosition:
    """Where a score lands on one leaderboard.

    Attributes:
        position: 1-based rank the score would take (``total + 1`` when it beats nobody).
        total: number of rows on the board.
        position_score: ``(total - position + 1) / total`` in [0, 1].
    """

    position: int
    total: int
    position_score: float


def position_score(score: float, board: Sequence[float], lower_is_better: bool) -> BoardPosition:
    """MLE-Dojo's position score of ``score`` on one leaderboard (any order; sorted here)."""
    value = _check_score(score)
    ranked = _best_first(_check_board(board), lower_is_better)
    total = int(ranked.size)
    beaten = ranked <= value if not lower_is_better else ranked >= value
    hits = np.flatnonzero(beaten)
    position = int(hits[0]) + 1 if hits.size else total + 1
    return BoardPosition(position=position, total=total, position_score=(total - position + 1) / total)


def leaderboard_position(
    scores: Mapping[str, float], boards: Mapping[str, Sequence[float]], lower_is_better: bool
) -> tuple[float, dict[str, BoardPosition]]:
    """Average position score over several boards.

    Args:
        scores: the submission's score per board name. On Kaggle-style tasks the public board is
            ranked with the score on the public rows and the private board with the score on the
            private rows; MLE-Dojo uses one score for both.
        boards: the reference scores per board name (empty boards are skipped).
        lower_is_better: the metric's direction.

    Returns:
        ``(mean position score, {board: BoardPosition})``.

    Raises:
        ValueError: no non-empty board, or a board without a score.
    """
    per_board: dict[str, BoardPosition] = {}
    for name, board in boards.items():
        if len(board) == 0:
            continue
        if name not in scores:
            raise ValueError(f"no score given for the {name!r} leaderboard")
        per_board[name] = position_score(scores[name], board, lower_is_better)
    if not per_board:
        raise ValueError("no non-empty leaderboard to rank against")
    mean = sum(p.position_score for p in per_board.values()) / len(per_board)
    return mean, per_board


@dataclass(frozen=True)
class MedalResult:
    """MLE-bench's medal report for one score (thresholds in metric units)."""

    gold: bool
    silver: bool
    bronze: bool
    above_median: bool
    gold_threshold: float
    silver_threshold: float
    bronze_threshold: float
    median_threshold: float

    @property
    def any_medal(self) -> bool:
        return self.gold or self.silver or self.bronze

    @property
    def label(self) -> str:
        """``"gold"``, ``"silver"``, ``"bronze"``, ``"above_median"`` or ``"none"``."""
        for name in ("gold", "silver", "bronze", "above_median"):
            if getattr(self, name):
                return name
        return "none"


def medal_thresholds(board: Sequence[float], lower_is_better: bool) -> tuple[float, float, float, float]:
    """(gold, silver, bronze, median) thresholds of a board, by MLE-bench's size rule.

    ``N`` = rows; "position k" is the k-th best score (1-based):

    ========== ========================= ===================== =====================
    N          gold                      silver                bronze
    ========== ========================= ===================== =====================
    1–99       max(1, ⌊0.1N⌋)            max(1, ⌊0.2N⌋)        max(1, ⌊0.4N⌋)
    100–249    10                        max(1, ⌊0.2N⌋)        max(1, ⌊0.4N⌋)
    250–999    10 + ⌊0.002N⌋             50                    100
    ≥ 1000     10 + ⌊0.002N⌋             max(1, ⌊0.05N⌋)       max(1, ⌊0.1N⌋)
    ========== ========================= ===================== =====================

    The median is the plain median of all scores.
    """
    ranked = _best_first(_check_board(board), lower_is_better)
    n = int(ranked.size)
    if n < 100:
        gold, silver, bronze = max(1, int(n * 0.1)), max(1, int(n * 0.2)), max(1, int(n * 0.4))
    elif n < 250:
        gold, silver, bronze = 10, max(1, int(n * 0.2)), max(1, int(n * 0.4))
    elif n < 1000:
        gold, silver, bronze = 10 + int(n * 0.002), 50, 100
    else:
        gold, silver, bronze = 10 + int(n * 0.002), max(1, int(n * 0.05)), max(1, int(n * 0.1))
    return (
        float(ranked[gold - 1]),
        float(ranked[silver - 1]),
        float(ranked[bronze - 1]),
        float(np.median(ranked)),
    )


def medals(score: float | None, board: Sequence[float], lower_is_better: bool) -> MedalResult:
    """MLE-bench medals of ``score`` on ``board``. ``None`` (no valid submission) wins nothing.

    MLE-bench rounds a score to 5 decimals before comparing it with the thresholds; so does this.
    """
    gold_t, silver_t, bronze_t, median_t = medal_thresholds(board, lower_is_better)
    if score is None:
        return MedalResult(False, False, False, False, gold_t, silver_t, bronze_t, median_t)
    value = round(_check_score(score), 5)

    def reaches(threshold: float) -> bool:
        return value <= threshold if lower_is_better else value >= threshold

    gold = reaches(gold_t)
    silver = not gold and reaches(silver_t)
    bronze = not gold and not silver and reaches(bronze_t)
    above = value < median_t if lower_is_better else value > median_t
    return MedalResult(gold, silver, bronze, above, gold_t, silver_t, bronze_t, median_t)


def relative_gap(score: float, baseline: float, oracle: float) -> float:
    """DSBench's relative performance gap ``max(0, (s − b) / (g − b))``, capped at 1.

    Works for both directions: for an error metric ``g < b`` and the ratio is still the share of the
    baseline→oracle gap closed.
    """
    value, b, g = _check_score(score), _check_score(baseline), _check_score(oracle)
    if g == b:
        raise ValueError("relative_gap: the oracle and the baseline have the same score")
    return float(min(1.0, max(0.0, (value - b) / (g - b))))
