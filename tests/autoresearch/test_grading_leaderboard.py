"""Position score (MLE-Dojo's rule), medals (MLE-bench's rule) and DSBench's relative gap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wmrl.autoresearch.grading.leaderboard import (
    leaderboard_position,
    medal_thresholds,
    medals,
    position_score,
    relative_gap,
)

# ---------------------------------------------------------------- position score


def test_position_counts_ties_as_beaten():
    board = [0.9, 0.8, 0.8, 0.7]  # sorted best-first for higher-is-better
    # 0.8 ties rows 2 and 3: position 2, score (4 - 2 + 1) / 4
    p = position_score(0.8, board, lower_is_better=False)
    assert (p.position, p.total, p.position_score) == (2, 4, 0.75)


def test_position_extremes():
    board = [3.0, 1.0, 2.0]  # any order
    assert position_score(5.0, board, False).position_score == 1.0
    assert position_score(5.0, board, False).position == 1
    worst = position_score(0.5, board, False)
    assert (worst.position, worst.position_score) == (4, 0.0)


def test_position_lower_is_better():
    board = [0.10, 0.20, 0.30, 0.40]
    assert position_score(0.05, board, True).position_score == 1.0
    assert position_score(0.25, board, True).position == 3  # beats 0.30 and 0.40
    assert position_score(0.25, board, True).position_score == pytest.approx(2 / 4)
    assert position_score(0.40, board, True).position_score == pytest.approx(1 / 4)  # tie with the last
    assert position_score(0.50, board, True).position_score == 0.0


def test_position_on_a_single_entry_board():
    assert position_score(1.0, [1.0], False).position_score == 1.0
    assert position_score(0.9, [1.0], False).position_score == 0.0


def test_position_on_a_huge_board_is_the_share_beaten():
    board = np.linspace(0, 1, 100_001)
    p = position_score(0.25, board, False)
    # rows with score <= 0.25: 0.0 .. 0.25 -> 25,001 rows
    assert p.position_score == pytest.approx(25_001 / 100_001)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.booleans(),
)
def test_position_score_is_share_of_rows_tied_or_beaten(board, score, lower):
    beaten = sum((s >= score) if lower else (s <= score) for s in board)
    assert position_score(score, board, lower).position_score == pytest.approx(beaten / len(board))


def test_average_over_public_and_private():
    boards = {"public": [1.0, 2.0, 3.0, 4.0], "private": [1.0, 2.0]}
    mean, per = leaderboard_position({"public": 2.5, "private": 1.5}, boards, lower_is_better=False)
    assert per["public"].position_score == 0.5
    assert per["private"].position_score == 0.5
    assert mean == 0.5
    mean, per = leaderboard_position({"public": 9.0, "private": 0.0}, boards, False)
    assert mean == pytest.approx((1.0 + 0.0) / 2)
    # An empty board is skipped; no board at all is an error.
    mean, per = leaderboard_position({"private": 1.5}, {"public": [], "private": [1.0, 2.0]}, False)
    assert list(per) == ["private"] and mean == 0.5
    with pytest.raises(ValueError, match="no non-empty leaderboard"):
        leaderboard_position({}, {"public": []}, False)
    with pytest.raises(ValueError, match="no score given"):
        leaderboard_position({}, {"public": [1.0]}, False)


def test_bad_inputs():
    with pytest.raises(ValueError, match="non-finite"):
        position_score(float("nan"), [1.0], False)
    with pytest.raises(ValueError, match="non-empty"):
        position_score(1.0, [], False)
    with pytest.raises(ValueError, match="finite"):
        position_score(1.0, [1.0, float("inf")], False)


# ---------------------------------------------------------------- medals


def _board(n: int) -> list[float]:
    """n teams scoring n, n-1, ..., 1 (higher is better): position k has score n - k + 1."""
    return [float(n - k + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize(
    ("n", "gold_pos", "silver_pos", "bronze_pos"),
    [
        (1, 1, 1, 1),  # tiny: max(1, ...) everywhere
        (4, 1, 1, 1),
        (9, 1, 1, 3),
        (50, 5, 10, 20),
        (99, 9, 19, 39),
        (100, 10, 20, 40),
        (249, 10, 49, 99),
        (250, 10, 50, 100),
        (999, 11, 50, 100),
        (1000, 12, 50, 100),
        (5000, 20, 250, 500),
    ],
)
def test_medal_thresholds_follow_the_size_bands(n, gold_pos, silver_pos, bronze_pos):
    board = _board(n)
    gold, silver, bronze, median = medal_thresholds(board, lower_is_better=False)
    assert gold == n - gold_pos + 1
    assert silver == n - silver_pos + 1
    assert bronze == n - bronze_pos + 1
    assert median == pytest.approx(np.median(board))
    # The board's order does not matter.
    assert medal_thresholds(board[::-1], False) == (gold, silver, bronze, median)


def test_medals_are_inclusive_and_exclusive():
    board = _board(50)  # gold 46, silver 41, bronze 31, median 25.5
    assert medals(46, board, False).label == "gold"
    gold = medals(46, board, False)
    assert gold.gold and not gold.silver and not gold.bronze and gold.any_medal and gold.above_median
    assert medals(45.9, board, False).label == "silver"
    assert medals(41, board, False).label == "silver"
    assert medals(31, board, False).label == "bronze"
    assert medals(30, board, False).label == "above_median"
    assert medals(25.5, board, False).label == "none"  # above median is strict
    assert medals(25.6, board, False).above_median


def test_medals_lower_is_better():
    board = [float(k) for k in range(1, 51)]  # position k has error k
    result = medals(5.0, board, lower_is_better=True)
    assert result.gold and result.gold_threshold == 5.0
    assert medals(5.01, board, True).label == "silver"
    assert medals(20.0, board, True).label == "bronze"
    assert medals(25.0, board, True).label == "above_median"  # median 25.5
    assert medals(25.5, board, True).label == "none"


def test_medals_with_ties_on_the_board():
    board = [0.9] * 10 + [0.5] * 10  # 20 teams, gold position 2 = 0.9
    assert medals(0.9, board, False).gold
    assert medals(0.8, board, False).label == "above_median"  # silver position 4 = 0.9, bronze 8 = 0.9


def test_medals_round_to_five_decimals_like_mlebench():
    board = _board(50)
    assert medals(45.999996, board, False).gold  # rounds to 46.0
    assert not medals(45.99999, board, False).gold


def test_no_score_wins_nothing_but_reports_thresholds():
    result = medals(None, _board(10), False)
    assert result.label == "none" and not result.any_medal
    assert result.gold_threshold == 10.0


# ---------------------------------------------------------------- DSBench relative gap


def test_relative_gap_both_directions():
    assert relative_gap(0.75, baseline=0.5, oracle=1.0) == 0.5  # AUC
    assert relative_gap(0.4, baseline=0.5, oracle=1.0) == 0.0  # worse than the baseline: 0
    assert relative_gap(2.0, baseline=4.0, oracle=0.0) == 0.5  # RMSE: lower is better
    assert relative_gap(-1.0, baseline=4.0, oracle=0.0) == 1.0  # capped at 1
    with pytest.raises(ValueError, match="same score"):
        relative_gap(1.0, 1.0, 1.0)
