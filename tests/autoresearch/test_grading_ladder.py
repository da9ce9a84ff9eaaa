"""The reward ladder."""

from __future__ import annotations

import pytest

from wmrl.autoresearch.grading.ladder import FAILURE_STATUSES, STATUSES, RewardLadder


def test_default_rungs_match_the_issue():
    ladder = RewardLadder()
    assert ladder.reward("syntax_error") == 0.0
    assert ladder.reward("runtime_error") == 0.1
    assert ladder.reward("timeout") == 0.1
    assert ladder.reward("killed") == 0.1
    assert ladder.reward("no_submission") == 0.2
    assert ladder.reward("invalid_submission") == 0.2
    assert ladder.reward("valid", 0.0) == 0.5
    assert ladder.reward("valid", 0.4) == pytest.approx(0.7)
    assert ladder.reward("valid", 1.0) == 1.0


def test_harness_error_is_unknown_never_zero():
    assert RewardLadder().reward("harness_error") is None
    assert RewardLadder(syntax_error=-1.0).reward("harness_error") is None


def test_a_better_outcome_never_earns_less():
    ladder = RewardLadder()
    order = ["syntax_error", "runtime_error", "no_submission"]
    values = [ladder.reward(s) for s in order] + [ladder.reward("valid", 0.0)]
    assert values == sorted(values)
    assert set(FAILURE_STATUSES) | {"valid", "harness_error"} == set(STATUSES)


def test_configurable_rungs():
    ladder = RewardLadder(timeout=0.0, valid_floor=0.2, valid_span=0.8)
    assert ladder.reward("timeout") == 0.0
    assert ladder.reward("valid", 0.5) == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"runtime_error": -0.1}, "runtime_error .* must be >= syntax_error"),
        ({"timeout": 0.3}, "timeout .* must be <= no_submission"),
        ({"no_submission": 0.6}, "no_submission .* must be <= valid_floor"),
        ({"valid_span": 0.0}, "valid_span must be > 0"),
        ({"killed": float("nan")}, "killed must be a finite number"),
        ({"syntax_error": True}, "syntax_error must be a finite number"),
    ],
)
def test_invalid_ladders_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardLadder(**kwargs)


def test_from_mapping_rejects_unknown_keys():
    assert RewardLadder.from_mapping({"timeout": 0.05}).timeout == 0.05
    with pytest.raises(ValueError, match=r"unknown keys \['timout'\]"):
        RewardLadder.from_mapping({"timout": 0.05})


def test_valid_needs_a_position_in_range():
    ladder = RewardLadder()
    for bad in (None, -0.1, 1.1, float("nan")):
        with pytest.raises(ValueError, match="position score in"):
            ladder.reward("valid", bad)
    with pytest.raises(ValueError, match="unknown grade status"):
        ladder.reward("crashed")


def test_frozen():
    with pytest.raises(AttributeError):
        RewardLadder().timeout = 0.5  # type: ignore[misc]
