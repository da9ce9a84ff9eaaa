"""The corrector end to end: plan()/correct(), presets, bad input, bit-identical resume."""

import numpy as np
import pytest
from group_design import groups_config

from wmrl.core.corrector import Corrector, CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.fusion import FusionConfig
from wmrl.core.scheduler import SchedulerConfig


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


def test_calibration_reduces_within_group_disagreement():
    rng = np.random.default_rng(0)
    with_map = Corrector(groups_config(debias=DebiasConfig(min_pairs=32)))
    without = Corrector(CorrectorConfig.preset("uncorrected_mix"))
    a = _drive(with_map, rng, 60)
    b = _drive(without, np.random.default_rng(0), 60)
    # Measured on standardised advantages, where a monotone distortion costs less than in reward units.
    assert a[-1].metrics["wmrl/disagreement"] < 0.85 * b[-1].metrics["wmrl/disagreement"]


def test_fusion_weights_are_a_convex_combination():
    c = Corrector(groups_config(fusion=FusionConfig(min_groups=2)))
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
    cfg = groups_config(
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
    a = Corrector(groups_config(seed=1))
    with pytest.raises(ValueError, match="configured differently"):
        Corrector(groups_config(seed=2)).load_state_dict(a.state_dict())


def test_bad_input_names_the_rule():
    c = Corrector(groups_config())
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


def _keyed_drive(corrector, rng, steps, n=16, size=8, noisy=False):
    outs = []
    for _ in range(steps):
        picks = rng.integers(0, 6, (n, size))
        truth = (picks / 6.0) ** 2
        wm = np.clip(picks / 6.0 + rng.normal(0, 0.05, truth.shape), 0, 1)
        solutions = [[f"t{i % 4}:{k}" for k in row] for i, row in enumerate(picks.tolist())]
        plan = corrector.plan(
            [f"{corrector.step_count}:{i}" for i in range(n)],
            [f"t{i % 4}" for i in range(n)],
            wm,
            solution_keys=solutions,
        )
        draw = truth + (rng.normal(0, 0.05, truth.shape) if noisy else 0.0)
        again = np.where(plan.repeat, draw + (rng.normal(0, 0.05, truth.shape) if noisy else 0.0), np.nan)
        outs.append(
            corrector.correct(
                plan, wm, np.where(plan.execute, draw, np.nan), anchor_repeats=again, solution_keys=solutions
            )
        )
    return outs


def test_per_rollout_anchors_spend_the_same_executions_and_use_real_scores():
    rng = np.random.default_rng(0)
    groups_cfg = groups_config(scheduler=SchedulerConfig(fraction=0.25, floor=0), seed=1)
    rollout_cfg = groups_config(scheduler=SchedulerConfig(fraction=0.25, floor=0, rollout_share=1.0), seed=1)
    whole, single = Corrector(groups_cfg), Corrector(rollout_cfg)
    wm = rng.random((16, 8))
    keys = [f"k{i}" for i in range(16)]
    p_whole, p_single = whole.plan(keys, wm_scores=wm), single.plan(keys, wm_scores=wm)
    assert p_whole.execute.sum() == p_single.execute.sum() > 0  # the same budget of executions
    assert not p_single.anchor.any()
    rows = np.flatnonzero(p_single.execute.any(axis=1))
    assert all(p_single.execute[r, np.nanargmax(wm[r])] for r in rows)  # each group's top-scored one
    real = np.where(p_single.execute, 0.0, np.nan)
    out = single.correct(p_single, wm, real)
    assert (out.rewards[p_single.execute] == 0.0).all() and out.executed[p_single.execute].all()
    assert out.metrics["wmrl/rollout_anchors"] == p_single.execute.sum()
    with pytest.raises(ValueError, match="wm_scores"):
        single.plan(keys)


def test_an_executed_solution_serves_its_duplicates_in_world_model_groups():
    c = Corrector(groups_config(scheduler=SchedulerConfig(fraction=0.0, floor=0, rollout_share=1.0)))
    c.fraction = 0.5  # one group's worth of single rollouts below
    wm = np.array([[0.9, 0.9, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])
    solutions = [["a", "a", "b", "c"], ["d", "e", "f", "g"]]
    plan = c.plan(["g0", "g1"], wm_scores=wm, solution_keys=solutions)
    real = np.where(plan.execute, 0.05, np.nan)
    out = c.correct(plan, wm, real, solution_keys=solutions)
    # One group's worth (4) of single rollouts: the top distinct solutions a, d, then b, e.
    assert plan.execute.sum() == 4 and plan.execute[0, 0] and not plan.execute[0, 1]
    assert out.rewards[0, 0] == out.rewards[0, 1] == 0.05  # the duplicate got the real score too
    assert out.executed[0, :2].all() and not out.executed[0, 3]


def test_resume_is_bit_identical_with_every_new_feature(tmp_path):
    cfg = groups_config(
        scheduler=SchedulerConfig(fraction=0.25, rollout_share=0.5, repeat_share=0.3),
        fusion=FusionConfig(persistence="measured", min_groups=2, min_keyed_rollouts=8, min_repeats=4),
        debias=DebiasConfig(min_pairs=16),
    )
    a = Corrector(cfg)
    _keyed_drive(a, np.random.default_rng(0), 12, noisy=True)
    b = Corrector.load(a.save(tmp_path / "c.json"))
    for out_a, out_b in zip(
        _keyed_drive(a, np.random.default_rng(9), 8, noisy=True),
        _keyed_drive(b, np.random.default_rng(9), 8, noisy=True),
        strict=True,
    ):
        assert np.array_equal(out_a.advantages, out_b.advantages, equal_nan=True)
        assert np.array_equal(out_a.executed, out_b.executed)
        assert out_a.metrics == out_b.metrics
    assert out_a.metrics["wmrl/persistence"] is not None
    assert out_a.metrics["wmrl/exec_noise_route"] == 2.0


def test_a_per_group_affine_world_model_gets_equal_weights_end_to_end():
    """fusion_only (the map would mix groups' scales): wm = a_g·real + b_g gives the real advantages."""
    c = Corrector(CorrectorConfig.preset("fusion_only", fusion=FusionConfig(min_groups=2)))
    rng = np.random.default_rng(0)
    for _ in range(20):
        real = rng.random((16, 8))
        wm = rng.uniform(0.1, 5.0, (16, 1)) * real + rng.uniform(-1, 1, (16, 1))
        plan = c.plan([f"{c.step_count}:{i}" for i in range(16)])
        out = c.correct(plan, wm, np.where(plan.anchor[:, None], real, np.nan))
    assert out.metrics["wmrl/variance_ratio"] == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_allclose(out.weights, 1.0, atol=1e-4)


def test_a_streamed_plan_is_the_plan():
    """Group by group as the world model's scores come in: the same executions as plan()."""
    rng = np.random.default_rng(5)
    for config in (CorrectorConfig(), groups_config(), CorrectorConfig.preset("real_cache")):
        a, b = Corrector(config), Corrector(config)
        for step in range(6):
            wm = rng.random((6, 8))
            keys = [[f"s{k}" for k in rng.integers(30, size=8)] for _ in range(6)]
            group_keys = [f"{step}:{g}" for g in range(6)]
            plan = a.plan(group_keys, None, wm, group_size=8, solution_keys=keys)
            stream = b.plan_stream(group_keys, None, 8, keys)
            for g in range(6):
                stream.add(g, wm[g])
            streamed = stream.finish()
            np.testing.assert_array_equal(plan.execute, streamed.execute)
            np.testing.assert_array_equal(plan.repeat, streamed.repeat)
            real = np.where(plan.execute, rng.random((6, 8)), np.nan)
            out_a = a.correct(plan, wm, real, solution_keys=keys)
            out_b = b.correct(streamed, wm, real, solution_keys=keys)
            np.testing.assert_array_equal(out_a.advantages, out_b.advantages)
    with pytest.raises(ValueError, match="active_share"):
        Corrector(groups_config(scheduler=SchedulerConfig(active_share=0.5))).plan_stream(["g"], None, 2)
