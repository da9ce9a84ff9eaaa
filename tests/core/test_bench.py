"""The synthetic benchmark's simulation: costs, determinism, and that learning happens."""

from dataclasses import replace

import numpy as np
import pytest

from wmrl.core.bench.simulation import SimConfig, run_arm
from wmrl.core.bench.synthetic import ci95, summarise

SMALL = SimConfig(n_tasks=6, n_solutions=12, groups_per_step=4, group_size=4, steps=40)


def test_real_arm_learns_and_costs_what_the_model_says():
    res = run_arm(SMALL, "real", seed=0)
    assert res.true_reward[-1] > res.true_reward[0] + 0.1
    per_step = (
        4 * 4 * (SMALL.base_cost + SMALL.exec_cost)
    )  # every rollout generated and executed, no world model
    assert res.cost(SMALL)[-1] == pytest.approx(40 * per_step)


def test_world_model_arm_pays_no_execution_and_wmrl_pays_its_anchors():
    wm = run_arm(SMALL, "world_model", seed=0)
    assert wm.executions.sum() == 0
    wmrl = run_arm(SMALL, "wmrl", seed=0)
    assert 0 < wmrl.executions.sum() < wmrl.rollouts.sum()
    assert wmrl.cost(SMALL)[-1] < run_arm(SMALL, "real", seed=0).cost(SMALL)[-1]


def test_same_seed_same_run():
    a, b = run_arm(SMALL, "wmrl", seed=3), run_arm(SMALL, "wmrl", seed=3)
    assert np.array_equal(a.true_reward, b.true_reward)


def test_noiseless_unbiased_world_model_matches_real_execution():
    clean = replace(
        SMALL, bias_strength=0.0, noise=0.0, confusion_rate=0.0, drift=0.0, wm_unknown=0.0, real_unknown=0.0
    )
    real = run_arm(clean, "real", seed=1).true_reward[-1]
    wm = run_arm(clean, "world_model", seed=1).true_reward[-1]
    assert wm == pytest.approx(real, abs=0.05)


def test_summary_fields():
    runs = {arm: [run_arm(SMALL, arm, s, keep_metrics=True) for s in (0, 1)] for arm in ("real", "wmrl")}
    summary = summarise(SMALL, runs, SMALL.exec_cost)
    for key in (
        "final_true_reward",
        "final_true_reward_ci95",
        "cost",
        "cost_to_target",
        "compute_ratio_vs_real",
    ):
        assert key in summary["wmrl"]
    assert summary["real"]["compute_ratio_vs_real"] == pytest.approx(1.0)
    assert summary["real"]["cost_to_target"] is not None


def test_ci95_closed_form():
    assert ci95(np.array([1.0])) == 0.0
    assert ci95(np.array([0.0, 2.0])) == pytest.approx(12.706 * np.sqrt(2) / np.sqrt(2), rel=1e-3)


@pytest.mark.parametrize("kind", ["gaussian", "flaky", "bernoulli"])
def test_noisy_execution_is_noisy_and_real_execution_still_learns(kind):
    cfg = replace(SMALL, exec_noise=kind)
    rng = np.random.default_rng(0)
    true = np.full((2000,), 0.6)
    draws = cfg.execute(rng, true)
    assert np.var(draws) > 0.001
    if kind == "bernoulli":
        assert set(np.unique(draws)) <= {0.0, 1.0}
    assert abs(draws.mean() - (0.6 * (1 - cfg.flaky_rate) if kind == "flaky" else 0.6)) < 0.05
    res = run_arm(cfg, "real", seed=0)
    assert res.true_reward[-1] > res.true_reward[0] + 0.05


def test_repeats_and_single_rollouts_are_costed_per_execution():
    rep = run_arm(SMALL, "wmrl_repeats", seed=0, keep_metrics=True)
    executed = sum(m["wmrl/executions"] for m in rep.metrics)
    assert rep.executions.sum() == executed
    assert any(m["wmrl/exec_repeats"] for m in rep.metrics)
    single = run_arm(SMALL, "wmrl_rollout", seed=0, keep_metrics=True)
    assert single.executions.sum() == sum(m["wmrl/executions"] for m in single.metrics)


def test_declared_noise_follows_the_problem():
    from wmrl.core.sources import NoiseModel

    assert replace(SMALL, exec_noise="gaussian", exec_sd=0.2).declared_noise() == NoiseModel.gaussian(0.2**2)
    assert replace(SMALL, exec_noise="bernoulli").declared_noise() == NoiseModel.bernoulli()
    assert replace(SMALL, exec_noise="flaky").declared_noise() is None  # nobody knows their flakiness
    assert replace(SMALL, declare_noise=False).declared_noise() is None
