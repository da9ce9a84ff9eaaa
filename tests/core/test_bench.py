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


# -- equal cost (issue 32) ---------------------------------------------------------------------------
def test_reward_at_a_cost_is_the_reward_after_the_last_step_within_it():
    from wmrl.core.bench.equal_cost import cost_to, paired, reward_at

    reward, cost = np.array([0.1, 0.5, 0.9]), np.array([0.0, 10.0, 20.0])
    assert reward_at(reward, cost, 0.0) == 0.1
    assert reward_at(reward, cost, 9.99) == 0.1 and reward_at(reward, cost, 10.0) == 0.5
    assert reward_at(reward, cost, 20.0) == 0.9
    assert reward_at(reward, cost, 20.5) is None  # the run stopped before spending it: unknown
    # the seed-mean curve: (0.5 + 0.4)/2 at cost 10, (0.5 + 0.6)/2 at cost 15 -- it reaches 0.5 at 15
    other = (np.array([0.0, 0.4, 0.6, 1.0]), np.array([0.0, 5.0, 15.0, 20.0]))
    assert cost_to([reward, other[0]], [cost, other[1]], 0.5) == pytest.approx(15.0)
    assert cost_to([reward, other[0]], [cost, other[1]], 0.99) is None
    diff = paired([(reward, cost), other], [(reward - 0.1, cost), (other[0] - 0.3, other[1])], 15.0)
    assert diff["mean"] == pytest.approx(0.2) and diff["n"] == 2


def test_a_run_continues_to_a_cost_and_real_cache_executes_each_solution_once():
    real = run_arm(SMALL, "real", seed=0)
    budget = float(real.cost(SMALL)[-1])
    cached = run_arm(SMALL, "real_cache", seed=0, until_cost=budget)
    assert len(cached.true_reward) > SMALL.steps + 1 and cached.cost(SMALL)[-1] >= budget
    # with exact recurrence, executions are bounded by the distinct solutions of the problem
    assert cached.executions.sum() <= SMALL.n_tasks * SMALL.n_solutions
    assert cached.cost(SMALL)[SMALL.steps] < budget / 2


def test_variants_set_how_solutions_recur():
    from wmrl.core.bench.simulation import _solution_keys

    rng = np.random.default_rng(0)
    tasks, picks = np.array([0, 1]), np.array([[3, 3, 4], [3, 3, 3]])
    one = _solution_keys(replace(SMALL, variants=1), rng, 0, tasks, picks)
    assert one[0][0] == one[0][1] != one[1][0]
    none = _solution_keys(replace(SMALL, variants=0), rng, 0, tasks, picks)
    assert len({k for row in none for k in row}) == 6  # nothing recurs
    many = _solution_keys(replace(SMALL, variants=4), rng, 0, tasks, picks)
    assert all(k.startswith(("0:3:", "0:4:", "1:3:")) for row in many for k in row)
    # the world model is not asked about a known solution: fewer calls than rollouts once known
    wmrl = run_arm(replace(SMALL, variants=1), "wmrl", seed=0)
    assert wmrl.wm_calls[-1] < wmrl.rollouts[-1]
    fresh = run_arm(replace(SMALL, variants=0), "wmrl", seed=0)
    assert fresh.wm_calls.sum() == fresh.rollouts.sum()


def test_a_surrogate_arm_learns_from_its_executions_and_changes_the_scores():
    """wmrl_surrogate fuses the simulated world model with a nearest-neighbour surrogate fitted on the
    run's real outcomes (calibrated and weighted by their measured errors): its scores, and so its run,
    differ from wmrl's; it is deterministic and still learns. (core/test_surrogate.py tests that the
    surrogate learns and that the fusion weights by error.)"""
    cfg = replace(SMALL, variants=0, n_solutions=6, variant_spread=0.01)
    plain = run_arm(cfg, "wmrl", seed=1)
    surrogate = run_arm(cfg, "wmrl_surrogate", seed=1)
    again = run_arm(cfg, "wmrl_surrogate", seed=1)
    assert np.array_equal(surrogate.true_reward, again.true_reward)
    assert not np.array_equal(surrogate.true_reward, plain.true_reward)
    assert surrogate.true_reward[-1] > surrogate.true_reward[0] + 0.05
    # the world model is asked about every rollout (the surrogate is part of it, not the memory)
    assert surrogate.wm_calls.sum() == surrogate.rollouts.sum()


def test_the_interval_of_one_seed_is_unknown_not_zero():
    from wmrl.core.bench.intervals import mean_and_ci95, mean_ci

    assert mean_and_ci95([]) == (None, None) and mean_and_ci95([None, None]) == (None, None)
    assert mean_and_ci95([0.5, None]) == (0.5, None)
    mean, half = mean_and_ci95([0.0, 2.0, None])
    assert mean == 1.0 and half == pytest.approx(12.7062, rel=1e-4)  # t(0.975, 1) * sd / sqrt(n) = t
    assert mean_ci([1.0, None]) == {"mean": 1.0, "ci95": 0.0, "n": 1}
