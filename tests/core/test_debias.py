"""Isotonic debiaser: scikit-learn parity, monotonicity, identity before min_pairs, prequential diagnostics."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.isotonic import IsotonicRegression

from wmrl.core.config import ConfigError
from wmrl.core.debias import DebiasConfig, OnlineDebiaser, within_group_bias_reduction


def _feed(debiaser, steps, rng, distort=lambda r: 0.2 + 0.7 * r**2, noise=0.02, per_step=16, key=None):
    for step in range(steps):
        real = rng.random(per_step)
        wm = distort(real) + rng.normal(0, noise, per_step)
        debiaser.observe(
            step, wm, real, np.repeat(np.arange(per_step // 4), 4), None if key is None else [key] * per_step
        )
        debiaser.refit(step)


def test_identity_until_min_pairs():
    d = OnlineDebiaser(DebiasConfig(min_pairs=100))
    x = np.array([0.1, 0.5, 0.9])
    _feed(d, 5, np.random.default_rng(0))  # 80 pairs < 100
    assert not d.calibrated
    np.testing.assert_array_equal(d.calibrate(x), x)
    _feed(d, 2, np.random.default_rng(1))
    assert d.calibrated


def test_matches_sklearn_on_the_same_weighted_data():
    cfg = DebiasConfig(min_pairs=10, half_life_steps=3.0)
    d = OnlineDebiaser(cfg)
    rng = np.random.default_rng(0)
    xs, ys, steps = [], [], []
    for step in range(8):
        real = rng.random(12)
        wm = 0.3 + 0.5 * real + rng.normal(0, 0.1, 12)
        d.observe(step, wm, real, np.zeros(12))
        xs.append(wm), ys.append(real), steps.append(np.full(12, step))
    d.refit(7)
    x, y, s = np.concatenate(xs), np.concatenate(ys), np.concatenate(steps)
    weights = 0.5 ** ((7 - s) / 3.0)
    ref = IsotonicRegression(out_of_bounds="clip").fit(x, y, sample_weight=weights)
    grid = np.linspace(-0.5, 1.5, 101)
    np.testing.assert_allclose(d.calibrate(grid), ref.predict(grid), atol=1e-12)


def test_window_keeps_the_newest_pairs_and_fits_them_like_sklearn():
    """A capped window (with tied scores) holds exactly the last ``max_pairs`` pairs, sorted."""
    cfg = DebiasConfig(min_pairs=10, max_pairs=50, half_life_steps=4.0)
    d = OnlineDebiaser(cfg)
    rng = np.random.default_rng(3)
    xs, ys, steps = [], [], []
    for step in range(9):
        real = rng.random(12)
        wm = np.round(0.3 + 0.5 * real + rng.normal(0, 0.1, 12), 1)  # rounding makes many ties
        d.observe(step, wm, real, np.zeros(12))
        xs.append(wm), ys.append(real), steps.append(np.full(12, step))
    d.refit(8)
    x, y, s = (np.concatenate(a)[-50:] for a in (xs, ys, steps))
    assert d.n_pairs == 50
    assert np.all(np.diff(d._x) >= 0)
    np.testing.assert_array_equal(np.sort(d._y), np.sort(y))
    ref = IsotonicRegression(out_of_bounds="clip").fit(x, y, sample_weight=0.5 ** ((8 - s) / 4.0))
    grid = np.linspace(-0.5, 1.5, 101)
    np.testing.assert_allclose(d.calibrate(grid), ref.predict(grid), atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000))
def test_map_is_monotone(seed):
    d = OnlineDebiaser(DebiasConfig(min_pairs=8))
    _feed(d, 4, np.random.default_rng(seed), noise=0.3)
    grid = np.linspace(-1, 2, 301)
    assert np.all(np.diff(d.calibrate(grid)) >= -1e-12)


def test_calibration_removes_a_monotone_distortion_within_groups():
    d = OnlineDebiaser(DebiasConfig(min_pairs=32))
    rng = np.random.default_rng(0)
    _feed(d, 30, rng, noise=0.005)
    # The next step's pairs, scored prequentially by the map fitted before them.
    real = rng.random(16)
    diag = d.observe(30, 0.2 + 0.7 * real**2, real, np.repeat(np.arange(4), 4))
    assert diag["bias_reduction"] > 0.9
    assert diag["prequential_mse_calibrated"] < 0.1 * diag["prequential_mse_raw"]


def test_refit_tracks_a_drifting_bias():
    d = OnlineDebiaser(DebiasConfig(min_pairs=32, half_life_steps=5.0))
    rng = np.random.default_rng(0)
    _feed(d, 20, rng, distort=lambda r: 0.25 + 0.5 * r, noise=0.01)
    _feed(d, 40, rng, distort=lambda r: 0.60 + 0.3 * r, noise=0.01)
    # After the drift, a world-model score of 0.75 means real ≈ 0.5 (it meant ≈ 1.0 before).
    assert abs(d.calibrate(np.array([0.75]))[0] - 0.5) < 0.05


def test_within_group_bias_reduction_is_computed_within_groups():
    real = np.array([0.0, 1.0, 0.0, 1.0])
    raw = np.array([10.0, 12.0, 0.0, 2.0])  # group offsets differ by 10: invisible to GRPO
    red, ss_raw, _ss_cal = within_group_bias_reduction(raw, raw, real, np.array([0, 0, 1, 1]))
    # Centred within groups, the raw error is only the slope error: (±1 - ±0.5)² summed = 4 * 0.25.
    assert ss_raw == pytest.approx(1.0)
    assert red == pytest.approx(0.0)


def test_per_key_maps_are_shrunk_toward_the_pooled_map():
    cfg = DebiasConfig(min_pairs=16, per_key=True, shrinkage=1e9, min_key_pairs=4)
    d = OnlineDebiaser(cfg)
    rng = np.random.default_rng(0)
    _feed(d, 10, rng, key="a", distort=lambda r: r)
    _feed(d, 10, rng, key="b", distort=lambda r: 0.5 * r)
    x = np.array([0.25, 0.25])
    # Infinite shrinkage: every key uses the pooled map.
    np.testing.assert_allclose(d.calibrate(x, ["a", "b"]), d.calibrate(x))
    d2 = OnlineDebiaser(DebiasConfig(min_pairs=16, per_key=True, shrinkage=0.0, min_key_pairs=4))
    _feed(d2, 10, rng, key="a", distort=lambda r: r)
    _feed(d2, 10, rng, key="b", distort=lambda r: 0.5 * r)
    a, b = d2.calibrate(x, ["a", "b"])
    assert b > a + 0.15  # key b's world model halves the score: its map doubles it back


def test_state_round_trip():
    d = OnlineDebiaser(DebiasConfig(min_pairs=8))
    _feed(d, 5, np.random.default_rng(0))
    e = OnlineDebiaser(DebiasConfig(min_pairs=8))
    e.load_state_dict(d.state_dict())
    grid = np.linspace(0, 1, 11)
    np.testing.assert_array_equal(d.calibrate(grid), e.calibrate(grid))


def test_bad_pairs_and_config_are_rejected():
    d = OnlineDebiaser()
    with pytest.raises(ValueError, match="finite"):
        d.observe(0, np.array([np.nan]), np.array([0.1]), np.array([0]))
    with pytest.raises(ValueError, match="shape"):
        d.observe(0, np.array([0.1, 0.2]), np.array([0.1]), np.array([0, 0]))
    with pytest.raises(ConfigError, match="min_pairs"):
        DebiasConfig(min_pairs=1)
