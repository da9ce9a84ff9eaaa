"""The corrector end to end: step(), plan()/correct(), presets, bad input, bit-identical resume."""

import numpy as np
import pytest

from wmrl.core.corrector import METRICS, Corrector, CorrectorConfig, Group
from wmrl.core.debias import DebiasConfig
from wmrl.core.fusion import FusionConfig
from wmrl.core.scheduler import SchedulerConfig
from wmrl.core.sources import SourceError, as_source


def _sources(seed=0, unknown=0.0):
    rng = np.random.default_rng(seed)

    def wm(items):
        return [
            None if rng.random() < unknown else float(np.clip(0.2 + 0.7 * x**2 + rng.normal(0, 0.05), 0, 1))
            for x in items
        ]

    def real(items):
        return [float(x) for x in items]

    return as_source(wm, "world_model", "wm"), as_source(real, "anchor", "real")


def _groups(rng, step, n=8, size=6, tasks=2):
    return [Group(key=f"{step}:{i}", items=list(rng.random(size)), task=f"t{i % tasks}") for i in range(n)]


def _batch(rng, n=16, size=8):
    true = rng.random((n, size))
    wm = np.clip(0.2 + 0.7 * true**2 + rng.normal(0, 0.05, true.shape), 0, 1)
    return true, wm


def _drive(corrector, rng, steps, n=16):
    outs = []
    for _ in range(steps):
        true, wm = _batch(rng, n)
        plan = corrector.plan(
            [f"{corrector.step_count}:{i}" for i in range(n)], [f"t{i % 4}" for i in range(n)], wm
        )
        outs.append(corrector.correct(plan, wm, np.where(plan.anchor[:, None], true, np.nan)))
    return outs


def test_step_scores_anchor_groups_with_real_execution_and_calibrates():
    wm, real = _sources()
    c = Corrector(
        CorrectorConfig(scheduler=SchedulerConfig(fraction=0.25), debias=DebiasConfig(min_pairs=32)), wm, real
    )
    rng = np.random.default_rng(1)
    for step in range(30):
        groups = _groups(rng, step)
        out = c.step(groups)
        for i in np.flatnonzero(out.anchor):
            np.testing.assert_allclose(out.rewards[i], groups[i].items)
    assert out.metrics["wmrl/calibrated"] == 1.0
    assert out.metrics["wmrl/bias_reduction"] is None or out.metrics["wmrl/bias_reduction"] > 0.3
    assert set(out.metrics) == set(METRICS)


def test_unknown_scores_stay_unknown():
    wm, real = _sources(unknown=0.3)
    c = Corrector(CorrectorConfig(), wm, real)
    out = c.step(_groups(np.random.default_rng(0), 0))
    unknown = np.isnan(out.rewards)
    assert unknown.any()
    assert np.isnan(out.advantages[unknown]).all()


def test_calibration_reduces_within_group_disagreement():
    rng = np.random.default_rng(0)
    with_map = Corrector(CorrectorConfig(debias=DebiasConfig(min_pairs=32)))
    without = Corrector(CorrectorConfig.preset("uncorrected_mix"))
    a = _drive(with_map, rng, 60)
    b = _drive(without, np.random.default_rng(0), 60)
    # Measured on standardised advantages, where a monotone distortion costs less than in reward units.
    assert a[-1].metrics["wmrl/disagreement"] < 0.85 * b[-1].metrics["wmrl/disagreement"]


def test_fusion_weights_are_a_convex_combination():
    c = Corrector(CorrectorConfig(fusion=FusionConfig(min_groups=2)))
    for out in _drive(c, np.random.default_rng(0), 20):
        contributing = out.weights[out.weights > 0]
        assert contributing.mean() == pytest.approx(1.0)
    assert out.metrics["wmrl/weight_anchor"] > out.metrics["wmrl/weight_world_model"]
    assert out.metrics["wmrl/effective_lr_scale"] == pytest.approx(1.0)


def test_world_model_preset_never_anchors_and_real_preset_always_does():
    wm_only = Corrector(CorrectorConfig.preset("world_model"))
    assert all(not o.anchor.any() for o in _drive(wm_only, np.random.default_rng(0), 5))
    real = Corrector(CorrectorConfig.preset("real"))
    assert all(o.anchor.all() for o in _drive(real, np.random.default_rng(0), 5))


def test_resume_is_bit_identical(tmp_path):
    cfg = CorrectorConfig(
        debias=DebiasConfig(min_pairs=16, per_key=True),
        scheduler=SchedulerConfig(fraction=0.2, active_share=0.5),
    )
    a = Corrector(cfg)
    _drive(a, np.random.default_rng(0), 12)
    path = a.save(tmp_path / "corrector.json")
    b = Corrector.load(path)
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for out_a, out_b in zip(_drive(a, rng_a, 8), _drive(b, rng_b, 8), strict=True):
        assert np.array_equal(out_a.advantages, out_b.advantages, equal_nan=True)
        assert np.array_equal(out_a.anchor, out_b.anchor)
        assert out_a.metrics == out_b.metrics


def test_loading_into_a_differently_configured_corrector_fails():
    a = Corrector(CorrectorConfig(seed=1))
    with pytest.raises(ValueError, match="configured differently"):
        Corrector(CorrectorConfig(seed=2)).load_state_dict(a.state_dict())


def test_bad_input_names_the_rule():
    c = Corrector()
    plan = c.plan(["a", "b"])
    with pytest.raises(ValueError, match="inf"):
        c.correct(plan, np.array([[np.inf, 0.0], [0.0, 0.0]]), np.full((2, 2), np.nan))
    with pytest.raises(ValueError, match=r"2 groups|has 1 groups"):
        c.correct(plan, np.zeros((1, 2)), np.full((1, 2), np.nan))
    stray = np.full((2, 2), np.nan)
    stray[~plan.anchor] = 0.5
    with pytest.raises(ValueError, match="only the plan's executed rollouts"):
        c.correct(plan, np.zeros((2, 2)), stray)
    c.correct(plan, np.zeros((2, 2)), np.where(plan.anchor[:, None], np.full((2, 2), 0.5), np.nan))
    with pytest.raises(ValueError, match="plan is for step 0"):
        c.correct(plan, np.zeros((2, 2)), np.full((2, 2), np.nan))


def test_step_rejects_empty_groups_and_broken_sources():
    wm, real = _sources()
    c = Corrector(CorrectorConfig(), wm, real)
    with pytest.raises(ValueError, match="empty"):
        c.step([Group("a", [])])
    with pytest.raises(ValueError, match="at least one group"):
        c.step([])
    short = as_source(lambda items: [0.5], "world_model", "short")
    with pytest.raises(SourceError, match="1 scores for"):
        Corrector(CorrectorConfig(), short, real).step(_groups(np.random.default_rng(0), 0))
    with pytest.raises(SourceError, match="used as"):
        Corrector(CorrectorConfig(), real, wm)


def test_adaptive_budget_raises_the_fraction_when_disagreement_grows():
    cfg = CorrectorConfig.preset("wmrl_adaptive_budget", fusion=FusionConfig(min_groups=4, half_life_steps=3))
    c = Corrector(cfg)
    rng = np.random.default_rng(0)
    _drive(c, rng, 20)
    start = c.fraction
    for _ in range(30):  # the world model goes bad: pure noise
        true = rng.random((16, 8))
        plan = c.plan([f"{c.step_count}:{i}" for i in range(16)])
        c.correct(plan, rng.random((16, 8)), np.where(plan.anchor[:, None], true, np.nan))
    assert c.fraction > start
    assert c.fraction <= cfg.budget.max_fraction
