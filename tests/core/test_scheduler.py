"""Anchor scheduler: determinism across instances, fraction, floor vs cap, stratification, active mode."""

import numpy as np
import pytest

from wmrl.core.config import ConfigError
from wmrl.core.scheduler import AnchorScheduler, SchedulerConfig


def _run(s: AnchorScheduler, steps: int, n: int, tasks: int = 4):
    masks = []
    for step in range(steps):
        keys = [f"p{step}-{i}" for i in range(n)]
        task_keys = [f"t{i % tasks}" for i in range(n)]
        m = s.select(step, keys, task_keys)
        s.commit(m, task_keys)
        masks.append(m)
    return masks


def test_two_instances_agree_without_communication():
    a = _run(AnchorScheduler(SchedulerConfig(fraction=0.2), seed=7), 50, 16)
    b = _run(AnchorScheduler(SchedulerConfig(fraction=0.2), seed=7), 50, 16)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = _run(AnchorScheduler(SchedulerConfig(fraction=0.2), seed=8), 50, 16)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("stratify", [True, False])
def test_realised_fraction_converges_to_target(stratify):
    s = AnchorScheduler(SchedulerConfig(fraction=0.1, stratify=stratify), seed=0)
    _run(s, 500, 32)
    assert abs(s.realised_fraction - 0.1) < 0.01


def test_floor_beats_a_small_fraction():
    s = AnchorScheduler(SchedulerConfig(fraction=0.01, floor=2))
    assert all(m.sum() == 2 for m in _run(s, 20, 8))


def test_cap_binds_but_yields_to_the_floor():
    s = AnchorScheduler(SchedulerConfig(fraction=0.5, floor=1, max_concurrent=3))
    keys = [f"g{i}" for i in range(16)]
    assert s.select(0, keys).sum() == 3
    assert s.select(0, keys, in_flight=2).sum() == 1
    # The cap is full, but a step without anchors would stop the correction: the floor holds.
    assert s.select(0, keys, in_flight=10).sum() == 1


def test_stratification_keeps_every_task_fresh():
    s = AnchorScheduler(SchedulerConfig(fraction=0.125, stratify=True))
    _run(s, 80, 8, tasks=8)  # one anchor per step, eight tasks
    counts = np.array(list(s._anchored.values()))
    assert counts.max() - counts.min() <= 1


def test_active_share_prefers_uncertain_groups():
    s = AnchorScheduler(SchedulerConfig(fraction=0.25, active_share=1.0))
    u = np.zeros(8)
    u[[2, 5]] = 1.0
    m = s.select(0, [f"g{i}" for i in range(8)], uncertainty=u)
    assert m.tolist() == [i in (2, 5) for i in range(8)]
    with pytest.raises(ValueError, match="uncertainty"):
        s.select(0, [f"g{i}" for i in range(8)])


def test_selection_is_blind_to_outcomes():
    # select() has no argument through which outcomes could enter; the same keys give the same draw
    # whatever happens afterwards.
    s = AnchorScheduler(SchedulerConfig(fraction=0.3, stratify=False), seed=1)
    keys = [f"g{i}" for i in range(10)]
    assert np.array_equal(s.select(3, keys), s.select(3, keys))


def test_edge_cases_and_bad_input():
    s = AnchorScheduler(SchedulerConfig(fraction=1.0))
    assert s.select(0, []).size == 0
    assert s.select(0, ["a", "b"]).all()
    with pytest.raises(ValueError, match="unique"):
        s.select(0, ["a", "a"])
    with pytest.raises(ValueError, match="task keys"):
        s.select(0, ["a", "b"], ["t"])
    with pytest.raises(ConfigError, match="fraction"):
        SchedulerConfig(fraction=1.5)
    with pytest.raises(ConfigError, match="floor"):
        SchedulerConfig(floor=-1)


def test_state_round_trip():
    s = AnchorScheduler(SchedulerConfig(fraction=0.2), seed=3)
    _run(s, 10, 12)
    t = AnchorScheduler(SchedulerConfig(fraction=0.2), seed=0)
    t.load_state_dict(s.state_dict())
    keys = [f"x{i}" for i in range(12)]
    tasks = [f"t{i % 4}" for i in range(12)]
    assert np.array_equal(s.select(10, keys, tasks), t.select(10, keys, tasks))


def test_per_rollout_anchors_take_each_groups_top_scored_rollout_first():
    s = AnchorScheduler(SchedulerConfig(rollout_share=1.0), seed=0)
    wm = np.array([[0.1, 0.9, 0.5], [0.7, 0.2, np.nan], [0.3, 0.3, 0.8], [0.6, 0.1, 0.2]])
    anchor = np.array([False, False, False, True])
    keys = [f"g{i}" for i in range(4)]
    mask = s.select_rollouts(0, keys, wm, anchor, budget=3)
    assert mask.sum() == 3 and not mask[3].any()  # never inside an anchor group
    assert mask[0, 1] and mask[1, 0] and mask[2, 2]  # every group's top-scored rollout
    more = s.select_rollouts(0, keys, wm, anchor, budget=5)
    assert more.sum() == 5 and (more & mask).sum() == 3  # then the second-ranked ones
    assert not more[1, 2]  # an unknown score is never chosen
    np.testing.assert_array_equal(more, s.select_rollouts(0, keys, wm, anchor, budget=5))


def test_per_rollout_anchors_execute_a_solution_once():
    s = AnchorScheduler(SchedulerConfig(rollout_share=1.0), seed=0)
    wm = np.array([[0.9, 0.8, 0.1], [0.5, 0.4, 0.3]])
    solutions = np.array([["a", "a", "b"], ["a", "c", "d"]], dtype=object)
    mask = s.select_rollouts(0, ["g0", "g1"], wm, np.zeros(2, bool), budget=3, solution_keys=solutions)
    chosen = solutions[mask].tolist()
    assert sorted(chosen) == ["a", "b", "c"]  # "a" once, then each group's next distinct solution
    assert not mask[0, 1]  # the duplicate of "a" is never executed


def test_repeats_are_a_hashed_share_of_executed_rollouts():
    s = AnchorScheduler(SchedulerConfig(repeat_share=0.25), seed=3)
    execute = np.zeros((400, 8), bool)
    execute[::2] = True
    rep = s.select_repeats(0, [f"k{i}" for i in range(400)], execute)
    assert not (rep & ~execute).any()
    assert rep.sum() / execute.sum() == pytest.approx(0.25, abs=0.03)


def test_split_keeps_the_budget_and_the_floor():
    s = AnchorScheduler(SchedulerConfig(rollout_share=0.5, floor=1), seed=0)
    wholes = [s.split(step, 4, 16) for step in range(2000)]
    assert min(wholes) >= 1 and max(wholes) <= 4
    assert np.mean(wholes) == pytest.approx(2.0, abs=0.1)
    assert AnchorScheduler(SchedulerConfig(rollout_share=1.0, floor=0)).split(0, 3, 16) == 0


@pytest.mark.parametrize("field", ["rollout_share", "repeat_share"])
def test_new_shares_are_validated(field):
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ConfigError, match=field):
            SchedulerConfig(**{field: bad})


# -- per-rollout anchors on the solutions not yet known (issue 32) -------------------------------------
def test_a_group_executes_its_quota_of_top_ranked_unknown_solutions():
    s = AnchorScheduler(SchedulerConfig(rollout_share=1.0, floor=0), seed=0)
    wm = np.array([0.9, 0.8, 0.7, 0.1])
    keys = np.array(["a", "b", "c", "d"], dtype=object)
    known = np.array([True, False, False, False])  # "a" is known (its outcome 0.2 ranks it low)
    values = np.array([0.2, np.nan, np.nan, np.nan])
    chosen = s.select_group(0, "g", wm, 2.0, keys, known, values, wm)
    np.testing.assert_array_equal(chosen, [False, True, True, False])
    # known solutions are never chosen, and a solution taken by an earlier group is not taken again
    covered = {"b"}
    chosen = s.select_group(0, "g", wm, 2.0, keys, known, values, wm, covered)
    np.testing.assert_array_equal(chosen, [False, False, True, True])
    assert covered == {"b", "c", "d"}


def test_rollout_depth_executes_nothing_when_the_best_solutions_are_known():
    s = AnchorScheduler(SchedulerConfig(rollout_share=1.0, floor=0, rollout_depth=1), seed=0)
    wm = np.array([0.5, 0.8, 0.7])
    known = np.array([True, False, False])
    chosen = s.select_group(0, "g", wm, 3.0, None, known, np.array([0.95, np.nan, np.nan]), wm)
    assert not chosen.any()  # the known 0.95 ranks first: nothing above it to check
    chosen = s.select_group(0, "g", wm, 3.0, None, known, np.array([0.1, np.nan, np.nan]), wm)
    np.testing.assert_array_equal(chosen, [False, True, False])


def test_the_reject_share_tests_a_solution_the_world_model_ranks_low():
    s = AnchorScheduler(SchedulerConfig(rollout_share=1.0, floor=0, reject_share=0.5), seed=0)
    wm = np.array([0.9, 0.8, 0.2, 0.1])
    chosen = s.select_group(0, "g", wm, 2.0, None, None, None, wm)
    assert chosen[0] and chosen.sum() == 2 and (chosen[2] or chosen[3])


def test_the_quota_is_exact_in_expectation_and_deterministic():
    s = AnchorScheduler(SchedulerConfig(rollout_share=1.0, floor=0), seed=3)
    wm = np.linspace(0, 1, 8)
    counts = [s.select_group(step, f"g{step}", wm, 2.5).sum() for step in range(2000)]
    assert set(counts) == {2, 3} and abs(np.mean(counts) - 2.5) < 0.05
    assert s.select_group(7, "g7", wm, 2.5).sum() == counts[7]


def test_describe_says_what_is_executed():
    rollouts = AnchorScheduler(SchedulerConfig(fraction=0.5, floor=0, rollout_share=1.0))
    assert "up to 4 solutions" in rollouts.describe(2, 8)
    assert "1 of the 2 groups" in AnchorScheduler(SchedulerConfig(fraction=0.5, floor=1)).describe(2, 8)
