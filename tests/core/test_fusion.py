"""Fusion weights: closed forms and properties of the advantage-scale estimator, the previous one, the paper heuristic."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.core.advantages import AdvantageConfig
from wmrl.core.config import ConfigError
from wmrl.core.fusion import Fusion, FusionConfig, FusionInputs, group_disagreement


def _feed(fusion, reals, cals, exec_var=None, wm_var=None, keys=None, n_groups=None):
    """One step: a list of anchor groups (real and calibrated scores per group)."""
    sizes = [len(r) for r in reals]
    fusion.observe(
        FusionInputs(
            real=np.concatenate(reals).astype(float),
            calibrated=np.concatenate(cals).astype(float),
            group=np.repeat(np.arange(len(reals)), sizes),
            exec_var=None if exec_var is None else np.concatenate(exec_var),
            wm_var=None if wm_var is None else np.concatenate(wm_var),
            keys=None if keys is None else np.concatenate(keys),
            n_groups=len(reals) if n_groups is None else n_groups,
        )
    )


def _observe(fusion, rng, noise, steps=40, size=8):
    for _ in range(steps):
        real = rng.random(size)
        _feed(fusion, [real], [real + rng.normal(0, noise, size)])


def _standardise(x):
    return (x - x.mean()) / (x.std() + 1e-4)


def test_weights_average_to_one_over_contributing_groups():
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    _observe(f, np.random.default_rng(0), noise=0.3)
    is_anchor = np.array([True, False, False, False, False, True, False])
    contributes = np.array([True, True, True, False, True, True, True])
    w = f.weights(is_anchor, contributes)
    assert w[~contributes].tolist() == [0.0]
    assert w[contributes].mean() == pytest.approx(1.0)
    assert w[0] > w[1]
    # A group with a share of executed rollouts sits between the two streams.
    mixed = f.weights(np.array([True, False, False]), np.ones(3, bool), np.array([1.0, 0.5, 0.0]))
    assert mixed[0] > mixed[1] > mixed[2]


def test_equal_weights_when_the_world_model_is_exact():
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    _observe(f, np.random.default_rng(0), noise=0.0)
    np.testing.assert_allclose(f.weights(np.array([True, False, False]), np.ones(3, bool)), 1.0)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    size=st.integers(3, 10),
    mode=st.sampled_from(["mse", "inverse_variance"]),
)
def test_a_per_group_positive_affine_distortion_costs_nothing(seed, size, mode):
    """wm = a_g·real + b_g (a_g > 0) gives exactly the real advantages: weights must be equal."""
    rng = np.random.default_rng(seed)
    f = Fusion(FusionConfig(mode=mode, min_groups=1), AdvantageConfig(eps=0.0))
    for _ in range(12):
        reals = [rng.random(size) for _ in range(3)]
        _feed(f, reals, [rng.uniform(0.05, 20.0) * r + rng.uniform(-5, 5) for r in reals])
    assert f.error_var == pytest.approx(0.0, abs=1e-9)
    assert f.ratio == pytest.approx(1.0, abs=1e-8)


def test_the_previous_reward_scale_estimator_charges_an_affine_distortion():
    """The bug of issue 11 §1, kept available as scale="reward": it counts what GRPO never sees."""
    rng = np.random.default_rng(0)
    old = Fusion(FusionConfig(mode="inverse_variance", scale="reward", min_groups=1))
    for _ in range(12):
        reals = [rng.random(8) for _ in range(3)]
        _feed(old, reals, [rng.uniform(0.2, 3.0) * r + rng.uniform(-1, 1) for r in reals])
    assert old.ratio > 1.2


def test_inverse_variance_ratio_closed_form_standardised():
    """Deterministic execution: V_wm/V_a = 1 + E/q with E the mean squared standardised-advantage error."""
    real = np.array([0.0, 0.5, 1.0])
    cal = np.array([0.0, 0.1, 1.0])
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    _feed(f, [real], [cal])
    a_r, a_c = _standardise(real), _standardise(cal)
    q = np.mean(a_r**2)
    e = np.mean((a_c - a_r) ** 2)
    assert f.signal_var == pytest.approx(q)
    assert f.error_var == pytest.approx(e)
    assert f.anchor_error_var == 0.0
    assert f.ratio == pytest.approx((q + e) / q)


def test_centred_closed_form_with_execution_noise():
    """Centred advantages, noise variance s² per real score: N = s²(1 - 1/m), E = mean((c̃ - r̃)²) - N."""
    real = np.array([0.0, 0.4, 1.0, 0.2])
    cal = np.array([0.1, 0.3, 0.8, 0.4])
    s2 = 0.01
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1), AdvantageConfig(standardize=False))
    _feed(f, [real], [cal], exec_var=[np.full(4, s2)])
    r_c, c_c = real - real.mean(), cal - cal.mean()
    n = s2 * (1 - 1 / 4)
    assert f.anchor_error_var == pytest.approx(n)
    assert f.signal_var == pytest.approx(np.mean(r_c**2) - n)
    # E = q_c + q - 2<c̃, r̃>/M, which equals mean((c̃ - r̃)²) - N.
    assert f.error_var == pytest.approx(np.mean((c_c - r_c) ** 2) - n)
    assert f.ratio == pytest.approx((f.signal_var + f.error_var) / (f.signal_var + n))


def _bernoulli_steps(fusion, rng, steps, size=8, groups=4, declare=True, perfect=True):
    for _ in range(steps):
        reals, cals, var = [], [], []
        for _ in range(groups):
            p = rng.beta(2, 2, size)
            reals.append((rng.random(size) < p).astype(float))
            cals.append(p if perfect else np.clip(p + rng.normal(0, 0.3, size), 0, 1))
            var.append(p * (1 - p) if declare else np.zeros(size))
        _feed(fusion, reals, cals, exec_var=var)


@pytest.mark.parametrize("mode", ["mse", "inverse_variance"])
def test_a_perfect_expectation_world_model_gets_at_least_the_anchors_weight(mode):
    """Real rewards are Bernoulli(p), the world model predicts p: its advantages are the true ones."""
    f = Fusion(FusionConfig(mode=mode, min_groups=1))
    _bernoulli_steps(f, np.random.default_rng(0), steps=60)
    assert f.anchor_error_var > 0.5  # real advantages of 0/1 outcomes are far from the true ones
    assert f.error_var < 0.1 * f.anchor_error_var
    w = f.weights(np.array([True, False]), np.array([True, True]))
    assert w[1] >= w[0]


def test_the_previous_estimator_counts_the_anchors_noise_against_the_world_model():
    """Issue 11 §2: with the anchor's own noise ignored, the perfect world model looks bad."""
    old = Fusion(FusionConfig(mode="inverse_variance", scale="reward", min_groups=1))
    _bernoulli_steps(old, np.random.default_rng(0), steps=60)
    w = old.weights(np.array([True, False]), np.array([True, True]))
    assert w[0] > 1.5 * w[1]


def test_an_uninformative_world_model_is_not_rescued_by_noisy_anchors():
    """Noise correction must not turn a world model unrelated to the truth into a good one."""
    rng = np.random.default_rng(1)
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    for _ in range(60):
        reals, cals, var = [], [], []
        for _ in range(4):
            p = rng.beta(2, 2, 8)
            reals.append((rng.random(8) < p).astype(float))
            cals.append(rng.random(8))
            var.append(p * (1 - p))
        _feed(f, reals, cals, exec_var=var)
    assert f.error_var > 1.5  # two unrelated unit-scale vectors are ~2 apart per rollout
    assert f.ratio > 1.0


def _persistent_steps(fusion, rng, persistent, steps=60, size=8, groups=3, sd=0.3):
    """Solutions 0..5 of one task; the world model errs by u[k] (persistent) or fresh noise of the same sd."""
    u = rng.normal(0, sd, 6)
    truth = rng.random(6)
    for _ in range(steps):
        reals, cals, keys = [], [], []
        for _ in range(groups):
            k = rng.integers(0, 6, size)
            err = u[k] if persistent else rng.normal(0, sd, size)
            reals.append(truth[k])
            cals.append(truth[k] + err)
            keys.append(np.array([f"s{j}" for j in k], dtype=object))
        _feed(fusion, reals, cals, keys=keys, n_groups=10 * groups)


def test_persistent_error_gets_a_higher_anchor_weight_than_fresh_noise_of_the_same_variance():
    cfg = FusionConfig(
        mode="mse", persistence="measured", min_groups=1, min_keyed_rollouts=8, max_ratio=100.0
    )
    fresh, persistent = Fusion(cfg), Fusion(cfg)
    _persistent_steps(fresh, np.random.default_rng(3), persistent=False)
    _persistent_steps(persistent, np.random.default_rng(3), persistent=True)
    assert persistent.persistence > 1.0 > fresh.persistence
    assert persistent.ratio > fresh.ratio
    # Without keys the same data is unmeasured: the metric says so instead of reporting 0.
    blind = Fusion(cfg)
    _observe(blind, np.random.default_rng(0), noise=0.3)
    assert blind.persistence is None


def test_horizon_mode_counts_persistent_error_bias_horizon_times():
    """V_wm = q + F + H·(E - F): the per-call noise the world model reports is fresh, the rest persists."""
    real, cal = np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.1, 1.0])
    f = Fusion(FusionConfig(mode="mse", min_groups=1, bias_horizon=4.0))
    _feed(f, [real], [cal])
    q, e = f.signal_var, f.error_var
    assert f.ratio == pytest.approx((q + 4.0 * e) / q)
    noisy = Fusion(FusionConfig(mode="mse", min_groups=1, bias_horizon=4.0))
    _feed(noisy, [real], [cal], wm_var=[np.full(3, 1e6)])  # reports more noise than E: all of E is fresh
    assert noisy.ratio == pytest.approx((q + e) / q)


def test_paper_mode_reproduces_the_official_heuristic():
    cfg = FusionConfig(mode="paper", paper_warmup_groups=32)
    f = Fusion(cfg)
    rng = np.random.default_rng(0)
    _observe(f, rng, noise=0.2, steps=31)
    assert f.paper_weight() == 1.0  # before warm-up
    _observe(f, rng, noise=0.2, steps=1)
    assert f.paper_weight() == pytest.approx(2.0)  # c frozen so the weight is the target at warm-up
    gain = f.paper_gain
    _observe(f, rng, noise=1.0, steps=200)
    assert f.paper_gain == gain  # frozen
    assert f.paper_weight() == pytest.approx(4.0)  # larger disagreement, clipped at w_max
    w = f.weights(np.array([True, False]), np.array([True, True]))
    assert w.tolist() == [4.0, 1.0]  # not normalised: the implied learning rate rises


def test_paper_mode_counts_groups_whatever_the_reward_scale():
    """Issue 11 §2: a threshold absolute in reward units (var < 1e-9) skipped every group at scale 1e-5."""
    for scale in (1.0, 1e-5):
        f = Fusion(FusionConfig(mode="paper", paper_warmup_groups=4))
        rng = np.random.default_rng(0)
        for _ in range(4):
            real = rng.random(8)
            _feed(f, [scale * real], [scale * (real + rng.normal(0, 0.2, 8))])
        assert f.paper_groups == 4
        assert f.paper_weight() == pytest.approx(2.0)


def test_none_mode_and_warm_up_give_unit_weights():
    f = Fusion(FusionConfig(mode="none", min_groups=1))
    _observe(f, np.random.default_rng(0), noise=0.5)
    assert f.weights(np.array([True, False]), np.array([True, True])).tolist() == [1.0, 1.0]
    g = Fusion(FusionConfig(min_groups=100))
    _observe(g, np.random.default_rng(0), noise=0.5, steps=10)
    assert g.ratio == 1.0


def test_world_model_may_outweigh_noisy_anchors_but_within_the_cap():
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1, max_ratio=4.0))
    _bernoulli_steps(f, np.random.default_rng(0), steps=60)
    assert 1 / 4.0 <= f.ratio < 1.0


def test_group_disagreement_matches_its_definition():
    real = np.array([0.0, 0.5, 1.0])
    cal = np.array([0.1, 0.4, 1.0])
    expected = np.mean(((cal - cal.mean()) - (real - real.mean())) ** 2) / np.var(real)
    assert group_disagreement(cal, real) == pytest.approx(expected)
    assert group_disagreement(cal * 1e-5, real * 1e-5) == pytest.approx(expected)
    assert group_disagreement(cal, np.ones(3)) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"bias_horizon": math.inf},
        {"bias_horizon": math.nan},
        {"half_life_steps": math.inf},
        {"max_ratio": math.inf},
        {"persistence_half_life_steps": 0.0},
        {"paper_max_weight": math.inf},
        {"min_groups": 0},
        {"min_groups": True},
        {"scale": "logit"},
        {"persistence": "forever"},
    ],
)
def test_config_refuses_what_it_cannot_honour(changes):
    """Issue 11 §2: bias_horizon=inf passed validation and turned every advantage into NaN."""
    with pytest.raises(ConfigError):
        FusionConfig(**changes)


def test_weights_are_checked_before_they_are_applied(monkeypatch):
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1))
    _observe(f, np.random.default_rng(0), noise=0.3)
    import wmrl.core.fusion_compare as compare

    monkeypatch.setattr(compare, "variance_ratio", lambda fusion: math.nan)
    with pytest.raises(FloatingPointError, match="finite and > 0"):
        f.weights(np.array([True, False]), np.array([True, True]))


def test_state_round_trips_and_rejects_broken_state():
    f = Fusion(FusionConfig(mode="mse", persistence="measured", min_groups=1, min_keyed_rollouts=8))
    _persistent_steps(f, np.random.default_rng(0), persistent=True, steps=10)
    g = Fusion(f.config)
    g.load_state_dict(f.state_dict())
    assert g.ratio == f.ratio and g.persistence == f.persistence
    broken = f.state_dict() | {"q_real": math.nan}
    with pytest.raises(ValueError, match="non-finite"):
        g.load_state_dict(broken)
    with pytest.raises(ValueError, match="negative"):
        g.load_state_dict(f.state_dict() | {"rollouts": -1.0})


@pytest.mark.parametrize("sd", [0.1, 0.3])
def test_noise_corrected_estimates_match_the_oracle_at_groups_of_eight(sd):
    """E and N against the errors computed from the true expected rewards (Gaussian execution noise)."""
    rng = np.random.default_rng(7)
    f = Fusion(FusionConfig(mode="inverse_variance", min_groups=1, half_life_steps=1e6))
    true_e, true_n = [], []
    for _ in range(60):
        reals, cals, var = [], [], []
        for _ in range(20):
            mu = rng.random(8)
            r, c = mu + rng.normal(0, sd, 8), mu + rng.normal(0, 0.1, 8)
            reals.append(r), cals.append(c), var.append(np.full(8, sd**2))
            true_e.append(np.mean((_standardise(c) - _standardise(mu)) ** 2))
            true_n.append(np.mean((_standardise(r) - _standardise(mu)) ** 2))
        _feed(f, reals, cals, exec_var=var)
    assert f.error_var == pytest.approx(np.mean(true_e), abs=0.05)
    assert f.anchor_error_var == pytest.approx(np.mean(true_n), abs=0.05)


def test_fusion_rules_are_a_registry_that_refuses_a_name_twice():
    from wmrl.core.fusion_rules import FUSION_RULES, fusion_rule, register_fusion

    assert {"gain", "none", "mse", "inverse_variance", "paper"} <= set(FUSION_RULES) | {"mse"}
    assert fusion_rule("mse") is FUSION_RULES["mse"]
    with pytest.raises(ValueError, match="already registered"):
        register_fusion("gain")(lambda fusion, ctx: None)
    with pytest.raises(ValueError, match="no fusion rule named 'nope'"):
        fusion_rule("nope")
    with pytest.raises(ValueError, match="rollout_weights"):
        Fusion(FusionConfig(mode="gain")).weights(np.array([True]), np.array([True]))
