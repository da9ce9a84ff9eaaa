"""Fusion weights: convexity, noiseless equality, monotonicity in noise, the paper heuristic."""

import numpy as np
import pytest

from wmrl.core.fusion import Fusion, FusionConfig, group_disagreement


def _observe(fusion, rng, noise, groups=40, size=8, persistent=0.0):
    for _ in range(groups):
        real = rng.random(size)
        cal = real + rng.normal(0, noise, size) + persistent * rng.standard_normal(size)
        fusion.observe([real], [cal])


def test_weights_average_to_one_over_contributing_groups():
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    _observe(f, np.random.default_rng(0), noise=0.3)
    is_anchor = np.array([True, False, False, False, False, True, False])
    contributes = np.array([True, True, True, False, True, True, True])
    w = f.weights(is_anchor, contributes)
    assert w[~contributes].tolist() == [0.0]
    assert w[contributes].mean() == pytest.approx(1.0)
    assert w[0] > w[1]


def test_equal_weights_when_the_world_model_is_noiseless():
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    _observe(f, np.random.default_rng(0), noise=0.0)
    w = f.weights(np.array([True, False, False]), np.ones(3, bool))
    np.testing.assert_allclose(w, 1.0)


def test_anchor_weight_grows_with_world_model_noise():
    ratios = []
    for noise in (0.05, 0.2, 0.5):
        f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
        _observe(f, np.random.default_rng(0), noise=noise)
        ratios.append(f.ratio)
    assert ratios[0] < ratios[1] < ratios[2]


def test_ratio_is_one_plus_error_over_signal():
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    real = np.array([0.0, 1.0])
    cal = np.array([0.25, 0.75])  # centred error (0.25, -0.25): E = 0.125 / 1 dof; S = 0.5 / 1 dof
    f.observe([real], [cal])
    assert f.disagreement == pytest.approx(0.25)
    assert f.ratio == pytest.approx(1.25)


def test_mse_mode_counts_persistent_error_over_the_horizon():
    real, cal = np.array([0.0, 1.0]), np.array([0.25, 0.75])
    iv = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    mse = Fusion(FusionConfig(mode="mse", min_groups=1, bias_horizon=4))
    iv.observe([real], [cal])
    mse.observe([real], [cal])
    assert mse.ratio == pytest.approx(1 + 4 * 0.25)
    # When the source says all of that error is fresh per-call noise, nothing is persistent.
    noisy = Fusion(FusionConfig(mode="mse", min_groups=1, bias_horizon=4))
    noisy.observe([real], [cal], [np.array([0.125, 0.125])])  # Σ var * (1 - 1/2) = 0.125 = E
    assert noisy.ratio == pytest.approx(iv.ratio)


def test_paper_mode_reproduces_the_official_heuristic():
    cfg = FusionConfig(mode="paper", paper_warmup_groups=32)
    f = Fusion(cfg)
    rng = np.random.default_rng(0)
    _observe(f, rng, noise=0.2, groups=31)
    assert f.paper_weight() == 1.0  # before warm-up
    _observe(f, rng, noise=0.2, groups=1)
    assert f.paper_weight() == pytest.approx(2.0)  # c frozen so the weight is the target at warm-up
    gain = f.paper_gain
    _observe(f, rng, noise=1.0, groups=200)
    assert f.paper_gain == gain  # frozen
    assert f.paper_weight() == pytest.approx(4.0)  # larger disagreement, clipped at w_max
    w = f.weights(np.array([True, False]), np.array([True, True]))
    assert w.tolist() == [4.0, 1.0]  # not normalised: the implied learning rate rises


def test_none_mode_and_warm_up_give_unit_weights():
    f = Fusion(FusionConfig(mode="none", min_groups=1))
    _observe(f, np.random.default_rng(0), noise=0.5)
    assert f.weights(np.array([True, False]), np.array([True, True])).tolist() == [1.0, 1.0]
    g = Fusion(FusionConfig(min_groups=100))
    _observe(g, np.random.default_rng(0), noise=0.5, groups=10)
    assert g.ratio == 1.0


def test_group_disagreement_matches_its_definition():
    real = np.array([0.0, 0.5, 1.0])
    cal = np.array([0.1, 0.4, 1.0])
    expected = np.mean(((cal - cal.mean()) - (real - real.mean())) ** 2) / np.var(real)
    assert group_disagreement(cal, real) == pytest.approx(expected)
    assert group_disagreement(cal, np.ones(3)) is None
