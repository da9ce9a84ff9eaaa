"""The gain fusion (core/gain.py): a world model is weighted by what it measurably shares with the truth.

The properties asked of it: a world model equal to the real reward plus small fresh noise is weighted
nearly like real execution; one with persistent per-solution errors less; a pure-noise one near zero;
a per-group positive affine one costs nothing end to end; none of them sits at a bound.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.core.corrector import Corrector, CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.fusion import FusionConfig
from wmrl.core.gain import GainInputs, GainStats, within_sums
from wmrl.core.memory import MemoryConfig
from wmrl.core.scheduler import SchedulerConfig


def _run(kind: str, steps: int = 50, seed: int = 0, config: CorrectorConfig | None = None, dup: int = 1):
    """Drive the default corrector with the gain fusion on groups of fresh solutions; return the last
    correction.

    ``dup``: each solution appears this many times in a group (its world-model calls are repeated).
    """
    rng = np.random.default_rng(seed)
    c = Corrector(config or CorrectorConfig.preset("wmrl_gain"))
    bias = rng.normal(0.0, 0.15, 10_000)
    out = None
    n, width = 16, 8
    for step in range(steps):
        mu = rng.uniform(0.0, 1.0, (n, width // dup)).repeat(dup, axis=1)
        sol = rng.integers(10_000, size=(n, width // dup)).repeat(dup, axis=1)
        keys = [[f"{step}:{g}:{sol[g, j]}" for j in range(width)] for g in range(n)]
        scale, shift = rng.uniform(0.5, 3.0, (n, 1)), rng.uniform(-1.0, 1.0, (n, 1))
        if kind == "fresh":
            wm = mu + rng.normal(0.0, 0.02, mu.shape)
        elif kind == "fresh_large":
            wm = mu + rng.normal(0.0, 0.1, mu.shape)
        elif kind == "persistent":
            wm = mu + bias[sol]
        elif kind == "noise":
            wm = rng.uniform(0.0, 1.0, mu.shape)
        elif kind == "affine":
            wm = scale * mu + shift
        elif kind == "exact":
            wm = mu.copy()
        plan = c.plan([f"{step}:{g}" for g in range(n)], None, wm, solution_keys=keys)
        real = np.where(plan.execute, mu, np.nan)
        out = c.correct(plan, wm, real, solution_keys=keys)
    return c, out


def _weight_ratio(c: Corrector, out) -> float:
    """Mean advantage weight of a world-model reward over a real one (1: weighted alike)."""
    return c.fusion.wm_gain / (c.fusion.reliability or 1.0)


def test_a_nearly_exact_world_model_is_weighted_like_real_execution():
    c, out = _run("fresh")
    assert _weight_ratio(c, out) > 0.97
    assert out.metrics["wmrl/fusion_bound"] == 0.0 and out.metrics["wmrl/gain_route"] == 1.0


def test_persistent_errors_weigh_less_and_pure_noise_nearly_nothing():
    fresh = _weight_ratio(*_run("fresh"))
    c_p, out_p = _run("persistent")
    c_n, out_n = _run("noise")
    persistent, noise = _weight_ratio(c_p, out_p), _weight_ratio(c_n, out_n)
    assert 0.5 < persistent < fresh - 0.03
    assert noise < 0.15
    assert out_p.metrics["wmrl/fusion_bound"] == 0.0 and out_n.metrics["wmrl/fusion_bound"] == 0.0
    # the pure-noise world model's rollouts move the policy (almost) not at all; real ones do
    cells_wm = ~out_n.executed & ~np.isnan(out_n.advantages)
    cells_real = out_n.executed & ~np.isnan(out_n.advantages)
    assert np.abs(out_n.advantages[cells_wm]).mean() < 0.2 * np.abs(out_n.advantages[cells_real]).mean()


def test_fresh_noise_is_measured_from_repeated_calls_and_split_from_persistent_error():
    _c, out = _run("fresh_large", dup=2)  # every solution called twice per group: its noise is seen
    fresh = out.metrics["wmrl/wm_fresh_var"]
    assert fresh is not None and fresh == pytest.approx(0.01, rel=0.35)  # the map's slope is ~1 here
    assert out.metrics["wmrl/wm_icc"] < 0.35  # almost all of the error is fresh
    _, persistent = _run("persistent", dup=2)
    assert persistent.metrics["wmrl/wm_icc"] > 0.9  # repeated calls agree: the error persists


def test_a_per_group_positive_affine_world_model_costs_nothing_end_to_end():
    # Whole anchor groups measure the gain within groups (route 2), scale-free; debiasing off, as its
    # pooled map cannot undo a distortion that differs per group.
    config = CorrectorConfig(
        scheduler=SchedulerConfig(fraction=0.25, floor=1),
        debias=DebiasConfig(enabled=False),
        fusion=FusionConfig(mode="gain", min_groups=4),
        memory=MemoryConfig(enabled=False),
    )
    c, out = _run("affine", config=config)
    _exact_c, exact = _run("exact", config=config)
    assert out.metrics["wmrl/gain_route"] == 2.0 and out.metrics["wmrl/fusion_bound"] == 0.0
    assert c.fusion.wm_gain == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(out.weights, exact.weights, atol=1e-6)
    # the same advantages as a world model equal to the real reward: GRPO never sees the distortion
    # (up to the standardiser's eps, which is not scaled with the scores)
    np.testing.assert_allclose(out.advantages, exact.advantages, rtol=2e-3, atol=1e-6)


@given(
    v=st.floats(0.001, 1.0),
    u=st.floats(0.0, 1.0),
)
@settings(max_examples=80, deadline=None)
def test_a_calibrated_score_has_the_closed_form_gain(v, u):
    """β = 1 (calibrated): ρ² = V_c / (V_c + σ_u²), always in [0, 1]."""
    stats = GainStats(half_life_steps=1e9, min_pairs=1, min_duplicates=1)
    stats.w_dof, stats.w_cc, stats.w_cr, stats.w_zz = 100.0, 50.0, 50.0, 100.0 * u
    stats.spread_ss, stats.spread_dof = 100.0 * v, 100.0
    assert stats.slope == 1.0
    assert stats.gain_sq() == pytest.approx(v / (v + u), rel=1e-9, abs=1e-12)


def test_no_relation_is_no_gain_and_a_negative_one_is_not_a_negative_weight():
    stats = GainStats(half_life_steps=1e9, min_pairs=1, min_duplicates=1)
    stats.w_dof, stats.w_cc, stats.w_zz = 100.0, 40.0, 50.0
    stats.spread_ss, stats.spread_dof = 20.0, 100.0
    for cross in (0.0, -10.0):
        stats.w_cr = cross
        assert stats.gain_sq() == 0.0


def test_within_sums_is_the_pooled_within_group_sum_of_squares():
    values = np.array([1.0, 3.0, 5.0, 2.0, 10.0])
    labels = np.array(["a", "a", "b", "b", "c"])
    ss, dof = within_sums(values, labels)
    assert ss == pytest.approx(2.0 + 4.5) and dof == 2.0


def test_the_gain_state_round_trips():
    c, _ = _run("persistent", steps=12)
    copy = Corrector.from_state(c.state_dict())
    assert copy.fusion.wm_gain == c.fusion.wm_gain
    stats = GainStats(1.0, 1, 1)
    with pytest.raises(ValueError, match="non-finite"):
        stats.load_state_dict({**c.fusion.gain.state_dict(), "w_cc": float("nan")})
    assert isinstance(
        GainInputs(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), 0.0, 0.0, 0.0, 0.0), GainInputs
    )
