"""Robometer's frame subsampling, the progress-bin expectation and the episode score modes (closed forms)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.core.config import ConfigError
from wmrl.embodied.worldmodel.frames import check_frames, subsample_frames, subsample_indices
from wmrl.embodied.worldmodel.robometer_model import bins_to_progress, progress_std
from wmrl.embodied.worldmodel.scoring import ScoreConfig, ScoreError, episode_score


# -- subsampling ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "k", "expected"),
    [
        # rint(linspace(0, 99, 8)) = rint([0, 14.14, 28.29, 42.43, 56.57, 70.71, 84.86, 99])
        (100, 8, [0, 14, 28, 42, 57, 71, 85, 99]),
        # linspace(0, 520, 8) = [0, 74.29, 148.57, 222.86, 297.14, 371.43, 445.71, 520]
        (521, 8, [0, 74, 149, 223, 297, 371, 446, 520]),
        # round half to even: linspace(0, 9, 3) = [0, 4.5, 9] -> 4, linspace(0, 11, 3) -> 5.5 -> 6
        (10, 3, [0, 4, 9]),
        (12, 3, [0, 6, 11]),
        (8, 8, list(range(8))),
        # shorter than the window: every frame, then the last one repeated (right padding)
        (5, 8, [0, 1, 2, 3, 4, 4, 4, 4]),
        (1, 8, [0] * 8),
        (50, 1, [49]),
    ],
)
def test_subsample_indices_closed_forms(n, k, expected):
    assert subsample_indices(n, k).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2000), st.integers(1, 32))
def test_subsample_indices_properties(n, k):
    idx = subsample_indices(n, k)
    assert idx.shape == (k,) and idx.dtype == np.int64
    assert idx.min() >= 0 and idx.max() <= n - 1
    assert np.all(np.diff(idx) >= 0)
    assert idx[-1] == n - 1
    if n >= k > 1:
        assert idx[0] == 0 and len(set(idx.tolist())) == k  # no frame read twice when there are enough
        assert np.all(np.abs(idx - np.linspace(0, n - 1, k)) <= 0.5 + 1e-9)


def test_subsample_frames_returns_the_indexed_frames():
    frames = np.arange(30, dtype=np.uint8)[:, None, None, None] * np.ones((30, 4, 5, 3), np.uint8)
    sub, idx = subsample_frames(frames, 8)
    assert sub.shape == (8, 4, 5, 3)
    assert sub[:, 0, 0, 0].tolist() == idx.tolist()


@pytest.mark.parametrize(
    ("frames", "rule"),
    [
        (np.zeros((4, 8, 8)), "shape"),
        (np.zeros((4, 8, 8, 4), np.uint8), "shape"),
        (np.zeros((0, 8, 8, 3), np.uint8), "at least one"),
        (np.zeros((4, 8, 8, 3), np.float32), "uint8"),
    ],
)
def test_bad_frames_name_the_rule(frames, rule):
    with pytest.raises(ValueError, match=rule):
        check_frames(frames)


def test_bad_subsample_arguments():
    with pytest.raises(ValueError, match="at least one frame"):
        subsample_indices(0, 8)
    with pytest.raises(ValueError, match="positive integer"):
        subsample_indices(10, 0)


# -- progress expectation --------------------------------------------------------------------------
def test_progress_expectation_matches_a_hand_computation():
    logits = torch.tensor([0.0, 1.0, 2.0, 0.5, -1.0, 0.0, 3.0, 0.0, 0.0, 1.5])
    exps = [math.exp(v) for v in logits.tolist()]
    total = sum(exps)
    centres = [i / 9 for i in range(10)]  # linspace(0, 1, 10): bin i sits at i/9
    expected = sum(e / total * c for e, c in zip(exps, centres, strict=True))
    second = sum(e / total * c * c for e, c in zip(exps, centres, strict=True))
    assert bins_to_progress(logits).item() == pytest.approx(expected, abs=1e-6)
    assert progress_std(logits).item() == pytest.approx(math.sqrt(second - expected**2), abs=1e-6)


def test_progress_expectation_limits_and_shape():
    n = 10
    onehot = torch.full((n, n), -1e4)
    onehot[torch.arange(n), torch.arange(n)] = 0.0
    torch.testing.assert_close(bins_to_progress(onehot), torch.linspace(0, 1, n))
    assert bins_to_progress(torch.zeros(3, 5, n)).shape == (3, 5)
    torch.testing.assert_close(bins_to_progress(torch.zeros(n)), torch.tensor(0.5))  # uniform -> middle
    assert bins_to_progress(torch.zeros(4, dtype=torch.bfloat16)).dtype == torch.float32


# -- score modes -----------------------------------------------------------------------------------
RISING = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9]
PEAK_THEN_FALL = [0.1, 0.2, 0.9, 0.95, 0.6, 0.3, 0.2, 0.1]
SUCCESS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.7, 0.85]


@pytest.mark.parametrize(
    ("mode", "k", "curve", "expected"),
    [
        ("potential", 3, RISING, (0.7 + 0.8 + 0.9) / 3 - (0.0 + 0.1 + 0.2) / 3),
        ("potential", 1, RISING, 0.9 - 0.0),
        ("potential", 3, PEAK_THEN_FALL, (0.3 + 0.2 + 0.1) / 3 - (0.1 + 0.2 + 0.9) / 3),
        # k is capped at K // 2 = 4
        ("potential", 10, RISING, (0.5 + 0.7 + 0.8 + 0.9) / 4 - (0.0 + 0.1 + 0.2 + 0.3) / 4),
        ("final", 3, RISING, 0.9),
        ("final", 3, PEAK_THEN_FALL, 0.1),
        ("max", 3, PEAK_THEN_FALL, 0.95),
        ("success", 3, RISING, 0.85),
    ],
)
def test_score_modes_on_hand_made_curves(mode, k, curve, expected):
    assert episode_score(curve, SUCCESS, ScoreConfig(mode=mode, k=k)) == pytest.approx(expected)


def test_potential_is_the_default_and_flat_curves_score_zero():
    assert episode_score([0.4] * 8) == pytest.approx(0.0)
    assert ScoreConfig().mode == "potential" and ScoreConfig().k == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=16), st.integers(1, 8))
def test_scores_stay_in_their_ranges(curve, k):
    for mode in ("potential", "final", "max", "success"):
        config = ScoreConfig(mode=mode, k=k)
        low, high = config.value_range
        assert low - 1e-12 <= episode_score(curve, curve, config) <= high + 1e-12
    # max >= final, and potential is a difference of two window means
    assert episode_score(curve, None, ScoreConfig("max")) >= episode_score(curve, None, ScoreConfig("final"))


@pytest.mark.parametrize(
    ("progress", "success", "mode", "rule"),
    [
        ([], None, "final", "empty"),
        ([0.1, float("nan")], None, "potential", "non-finite"),
        ([0.1, 1.5], None, "max", r"\[0, 1\]"),
        ([-0.2, 0.5], None, "final", r"\[0, 1\]"),
        ([0.5], None, "potential", "at least 2 frames"),
        ([0.2, 0.5], None, "success", "success probabilities"),
        ([[0.2, 0.5]], None, "final", "1-D"),
    ],
)
def test_unscorable_curves_raise_instead_of_defaulting(progress, success, mode, rule):
    with pytest.raises(ScoreError, match=rule):
        episode_score(progress, success, ScoreConfig(mode=mode))


def test_score_config_is_validated():
    with pytest.raises(ConfigError, match="score mode"):
        ScoreConfig(mode="mean")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="k"):
        ScoreConfig(k=0)
