"""The execution memory: outcomes kept by solution key, bounded, persistent, checkpointed; and the
corrector and pipeline grading known solutions from it without asking either source."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.core.config import ConfigError
from wmrl.core.corrector import Corrector, CorrectorConfig
from wmrl.core.memory import ExecutionMemory, MemoryConfig
from wmrl.core.modes import resolve_corrector
from wmrl.core.pipeline import RewardPipeline
from wmrl.core.rollouts import Group
from wmrl.core.sources import as_source


@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_a_key_keeps_the_mean_and_variance_of_its_executions(values):
    memory = ExecutionMemory()
    for v in values:
        memory.record(["k"], [v])
    n, mean, var = memory.get("k")
    assert n == len(values)
    assert mean == pytest.approx(np.mean(values), abs=1e-9)
    assert var == pytest.approx(np.var(values, ddof=1) if len(values) > 1 else 0.0, abs=1e-7)


def test_unknown_outcomes_and_missing_keys_are_never_recorded():
    memory = ExecutionMemory()
    assert memory.record([None, "a", "b"], [1.0, float("nan"), 0.5]) == 1
    assert "a" not in memory and memory.get("b")[1] == 0.5 and len(memory) == 1


def test_the_least_recently_used_key_is_forgotten_first():
    memory = ExecutionMemory(max_keys=2)
    memory.record(["a", "b"], [1.0, 2.0])
    memory.lookup(np.array([["a"]], dtype=object), (1, 1))  # a is used again: b is now the oldest
    memory.record(["c"], [3.0])
    assert "a" in memory and "c" in memory and "b" not in memory and memory.evicted_total == 1


def test_lookup_counts_hits_and_misses_and_fills_the_matrix():
    memory = ExecutionMemory()
    memory.record(["a"], [0.7])
    keys = np.array([["a", "x"], [None, "a"]], dtype=object)
    out = memory.lookup(keys, (2, 2))
    np.testing.assert_array_equal(out.known, [[True, False], [False, True]])
    assert out.mean[0, 0] == 0.7 and np.isnan(out.mean[0, 1]) and out.count[1, 1] == 1
    assert memory.hits_total == 2 and memory.misses_total == 1  # a key of None is not a miss
    memory.lookup(keys, (2, 2), count=False)
    assert memory.hits_total == 2


def test_the_store_outlives_the_run_and_rejects_a_broken_line(tmp_path):
    store = tmp_path / "memory.jsonl"
    first = ExecutionMemory(store=store)
    first.record(["a", "b"], [1.0, 0.0])
    first.record(["a"], [0.0])
    second = ExecutionMemory(store=store)
    assert second.get("a")[:2] == (2, 0.5) and second.get("b")[:2] == (1, 0.0)
    store.write_text(store.read_text() + "not json\n")
    with pytest.raises(ValueError, match="line 4"):
        ExecutionMemory(store=store)


def test_state_round_trip_keeps_order_and_counters():
    memory = ExecutionMemory(max_keys=3)
    memory.record(["a", "b", "c"], [1.0, 2.0, 3.0])
    memory.lookup(np.array([["a", "z"]], dtype=object), (1, 2))
    state = json.loads(json.dumps(memory.state_dict()))
    copy = ExecutionMemory(max_keys=3)
    copy.load_state_dict(state)
    copy.record(["d"], [4.0])  # evicts the oldest: b (a was used again)
    assert "b" not in copy and "a" in copy and copy.hits_total == 1 and copy.misses_total == 1
    bad = dict(state, values=[[0.0, 1.0, 0.0]] * 3)
    with pytest.raises(ValueError, match="invalid entry"):
        copy.load_state_dict(bad)


def test_config_is_validated():
    with pytest.raises(ConfigError, match="max_keys"):
        MemoryConfig(max_keys=0)
    with pytest.raises(ConfigError, match="enabled"):
        MemoryConfig(enabled="yes")


def test_the_mode_decides_an_unset_memory():
    base = CorrectorConfig()
    assert resolve_corrector("wmrl", base, base).memory.enabled is True
    assert resolve_corrector("real", base, base).memory.enabled is False
    cached = resolve_corrector("real", CorrectorConfig(memory=MemoryConfig(enabled=True)), base)
    assert cached.memory.enabled is True and cached.scheduler.fraction == 1.0  # real with a result cache
    with pytest.raises(ConfigError, match="world_model"):
        resolve_corrector("world_model", CorrectorConfig(memory=MemoryConfig(enabled=True)), base)


def _step(corrector, step, wm, real_fn, keys):
    n = len(keys)
    plan = corrector.plan([f"{step}:{g}" for g in range(n)], None, wm, solution_keys=keys)
    real = np.where(plan.execute, real_fn(), np.nan)
    return plan, corrector.correct(plan, wm, real, solution_keys=keys)


def test_a_known_solution_is_graded_from_memory_and_never_executed_again():
    c = Corrector(CorrectorConfig.preset("real_cache"))
    truth = {"a": 0.9, "b": 0.1, "c": 0.5}
    keys = [["a", "b", "a", "c"], ["b", "c", "c", "a"]]
    values = np.array([[truth[k] for k in row] for row in keys])
    nan = np.full((2, 4), np.nan)
    plan, out = _step(c, 0, nan, lambda: values, keys)
    # each solution executed once in the step, its duplicates served by that execution
    assert plan.execute.sum() == 3 and out.metrics["memory/recorded"] == 3
    np.testing.assert_array_equal(out.rewards, values)
    plan, out = _step(c, 1, nan, lambda: values, keys)
    assert not plan.execute.any() and plan.known.all()
    np.testing.assert_array_equal(out.rewards, values)
    assert out.metrics["memory/hits"] == 8 and out.metrics["memory/known_share"] == 1.0
    assert out.from_memory.all()


def test_plain_real_mode_executes_everything_every_time():
    c = Corrector(CorrectorConfig.preset("real"))
    keys = [["a", "a"]]
    for step in range(2):
        plan, _ = _step(c, step, np.full((1, 2), np.nan), lambda: np.ones((1, 2)), keys)
        assert plan.execute.all() and plan.known is None


def test_the_memory_is_part_of_the_checkpoint(tmp_path):
    c = Corrector(CorrectorConfig())
    rng = np.random.default_rng(0)
    for step in range(6):
        keys = [[f"s{k}" for k in rng.integers(12, size=8)] for _ in range(4)]
        _step(c, step, rng.random((4, 8)), lambda: rng.random((4, 8)), keys)
    copy = Corrector.load(c.save(tmp_path / "c.json"))
    assert len(copy.memory) == len(c.memory) and copy.memory.hits_total == c.memory.hits_total
    keys = [[f"s{k}" for k in range(8)]] * 4
    wm = np.random.default_rng(1).random((4, 8))
    a = c.plan([f"x{g}" for g in range(4)], None, wm, solution_keys=keys)
    b = copy.plan([f"x{g}" for g in range(4)], None, wm, solution_keys=keys)
    np.testing.assert_array_equal(a.execute, b.execute)
    np.testing.assert_array_equal(a.known, b.known)


def test_the_pipeline_never_sends_a_known_solution_to_either_source():
    seen = {"wm": [], "real": []}

    def wm(items):
        seen["wm"].extend(items)
        return [0.5] * len(items)

    def real(items):
        seen["real"].extend(items)
        return [1.0 if x == "good" else 0.0 for x in items]

    pipe = RewardPipeline(
        as_source(wm, "world_model", "wm"),
        as_source(real, "anchor", "real"),
        corrector=CorrectorConfig.preset("real_cache"),
        mode="real",
        solution_key=str,
    )
    groups = [Group("g0", ["good", "bad", "good", "bad"]), Group("g1", ["bad", "good", "new", "new"])]
    first = pipe.step(groups)
    assert sorted(seen["real"]) == ["bad", "good", "new"] and seen["wm"] == []
    seen["real"].clear()
    second = pipe.step([Group(f"{g.key}b", g.items) for g in groups])
    assert seen["real"] == [] and second.metrics["memory/hits"] == 8
    assert first.metrics["wmrl/executions"] == 3 and second.metrics["wmrl/executions"] == 0  # what ran
    np.testing.assert_array_equal(first.rewards, second.rewards)
    assert pipe.ledger.report()["spent"]["anchor"]["items"] == 3  # memory hits cost nothing
