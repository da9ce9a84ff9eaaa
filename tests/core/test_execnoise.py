"""Execution noise: repeats recover a known variance; declared models; route precedence; the corrector's routes."""

import numpy as np
import pytest
from group_design import groups_config

from wmrl.core.corrector import Corrector
from wmrl.core.execnoise import ROUTE_ASSUMED, ROUTE_DECLARED, ROUTE_MEASURED, ExecutionNoise
from wmrl.core.fusion import FusionConfig
from wmrl.core.scheduler import SchedulerConfig
from wmrl.core.sources import NoiseModel, declared_noise


@pytest.mark.parametrize("sd", [0.05, 0.2])
def test_repeated_executions_recover_a_known_gaussian_variance(sd):
    rng = np.random.default_rng(0)
    noise = ExecutionNoise(half_life_steps=1e9, min_repeats=8)
    for _ in range(200):
        truth = rng.random((4, 8))
        noise.observe(truth + rng.normal(0, sd, truth.shape), truth + rng.normal(0, sd, truth.shape))
    assert noise.measured_var == pytest.approx(sd**2, rel=0.05)


def test_repeated_bernoulli_outcomes_recover_the_mean_of_p_times_one_minus_p():
    rng = np.random.default_rng(1)
    noise = ExecutionNoise(half_life_steps=1e9, min_repeats=8)
    p = rng.beta(2, 2, (40_000,))
    first, second = (rng.random(p.shape) < p).astype(float), (rng.random(p.shape) < p).astype(float)
    out = noise.observe(first[None, :], second[None, :])
    assert noise.measured_var == pytest.approx(float(np.mean(p * (1 - p))), rel=0.03)
    assert out["differs"] == pytest.approx(float(np.mean(2 * p * (1 - p))), rel=0.03)


def test_route_precedence_measured_then_declared_then_assumed():
    noise = ExecutionNoise(half_life_steps=20.0, min_repeats=2)
    cal = np.array([0.2, 0.5])
    once = np.ones(2)
    cells = (np.array([0, 0]), np.array([0, 1]))
    var, route = noise.variances(None, cal, once, cells)
    assert route == ROUTE_ASSUMED and var.tolist() == [0.0, 0.0]
    var, route = noise.variances(NoiseModel.bernoulli(), cal, once, cells)
    assert route == ROUTE_DECLARED and var.tolist() == pytest.approx([0.16, 0.25])
    var, route = noise.variances(NoiseModel.gaussian(0.04), cal, np.array([1, 2]), cells)
    assert var.tolist() == pytest.approx([0.04, 0.02])  # the mean of two executions halves it
    noise.observe(np.array([[0.0, 1.0]]), np.array([[1.0, 1.0]]))
    var, route = noise.variances(NoiseModel.deterministic(), cal, once, cells)
    assert route == ROUTE_MEASURED and var.tolist() == pytest.approx([0.25, 0.25])


def test_noise_model_validation_and_declaration():
    with pytest.raises(ValueError, match="variance"):
        NoiseModel("gaussian")
    with pytest.raises(ValueError, match="variance"):
        NoiseModel("gaussian", -1.0)
    with pytest.raises(ValueError, match="takes no variance"):
        NoiseModel("bernoulli", 0.1)
    with pytest.raises(ValueError, match="noise kind"):
        NoiseModel("poisson")

    class Source:
        name, role = "real", "anchor"
        noise = NoiseModel.bernoulli()

    assert declared_noise(Source()) == NoiseModel.bernoulli()
    Source.noise = "bernoulli"
    with pytest.raises(ValueError, match="NoiseModel"):
        declared_noise(Source())


def _run(corrector, rng, steps, sd, declare=None, n=16, size=8):
    out = None
    for _ in range(steps):
        truth = rng.random((n, size))
        wm = truth + rng.normal(0, 0.1, truth.shape)
        plan = corrector.plan([f"{corrector.step_count}:{i}" for i in range(n)], wm_scores=wm)
        first = np.where(plan.execute, truth + rng.normal(0, sd, truth.shape), np.nan)
        again = np.where(plan.repeat, truth + rng.normal(0, sd, truth.shape), np.nan)
        out = corrector.correct(plan, wm, first, anchor_repeats=again, anchor_noise=declare)
    return out, plan, first, again


def test_the_corrector_measures_noise_from_repeats_and_says_where_it_came_from():
    cfg = groups_config(
        scheduler=SchedulerConfig(fraction=0.25, repeat_share=0.5), fusion=FusionConfig(min_repeats=16)
    )
    c = Corrector(cfg)
    out, plan, first, again = _run(c, np.random.default_rng(0), steps=30, sd=0.1)
    assert plan.repeat.sum() > 0 and not (plan.repeat & ~plan.execute).any()
    assert out.metrics["wmrl/exec_noise_route"] == ROUTE_MEASURED
    assert out.metrics["wmrl/exec_noise_measured"] == pytest.approx(0.01, rel=0.3)
    assert out.metrics["wmrl/exec_repeat_differs"] == 1.0  # continuous noise: every repeat differs
    assert out.metrics["wmrl/executions"] == plan.execute.sum() + plan.repeat.sum()
    both = plan.repeat & ~np.isnan(first) & ~np.isnan(again)
    np.testing.assert_allclose(out.rewards[both], (first[both] + again[both]) / 2)


def test_without_information_execution_is_assumed_deterministic_and_the_metrics_say_so():
    out, *_ = _run(Corrector(groups_config()), np.random.default_rng(0), steps=3, sd=0.1)
    assert out.metrics["wmrl/exec_noise_route"] == ROUTE_ASSUMED
    assert out.metrics["wmrl/exec_noise_var"] == 0.0
    assert out.metrics["wmrl/exec_noise_measured"] is None
    assert out.metrics["wmrl/exec_repeat_differs"] is None


def test_a_declared_bernoulli_anchor_must_score_zero_or_one():
    c = Corrector(groups_config())
    plan = c.plan(["a", "b"])
    real = np.where(plan.anchor[:, None], np.array([[0.0, 0.5], [1.0, 0.3]]), np.nan)
    with pytest.raises(ValueError, match="bernoulli"):
        c.correct(plan, np.zeros((2, 2)), real, anchor_noise=NoiseModel.bernoulli())


def test_repeats_outside_the_plan_are_refused():
    c = Corrector(groups_config(scheduler=SchedulerConfig(repeat_share=0.5)))
    plan = c.plan(["a", "b"], group_size=4)
    stray = np.where(plan.repeat, np.nan, 0.5)
    with pytest.raises(ValueError, match=r"plan\.repeat"):
        c.correct(plan, np.zeros((2, 4)), np.where(plan.execute, 0.5, np.nan), anchor_repeats=stray)
