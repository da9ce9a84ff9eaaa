"""``wmrl bench``: Ctrl-C keeps the finished runs, the same command continues, stored runs are exact."""

import json

import numpy as np
import pytest

import wmrl.core.bench.synthetic as synthetic
from wmrl.core.bench.runstore import RunStore
from wmrl.core.bench.simulation import ArmResult, SimConfig, run_arm
from wmrl.core.cli import main

pytest.importorskip("matplotlib", reason="wmrl bench synthetic writes plots (the viz extra)")

BENCH = ["bench", "synthetic", "--quick", "--seeds", "2", "--arms", "wmrl"]


def _counting_run_arm(monkeypatch, interrupt_at=None):
    """Patch the simulation the bench calls: count the runs, press Ctrl-C at run ``interrupt_at``."""
    calls = []

    def run(cfg, arm, seed, keep_metrics=False, until_cost=None):
        calls.append((arm, seed))
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt  # what the default SIGINT handler raises mid-run
        return run_arm(cfg, arm, seed, keep_metrics=keep_metrics, until_cost=until_cost)

    monkeypatch.setattr(synthetic, "run_arm", run)
    return calls


def test_ctrl_c_keeps_finished_runs_and_the_same_command_continues(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench"
    calls = _counting_run_arm(monkeypatch, interrupt_at=3)
    assert main([*BENCH, "--out", str(out)]) == 130
    assert "interrupted: 2 finished runs kept" in capsys.readouterr().err
    assert len(list((out / "runs").glob("*.json"))) == 2
    assert not (out / "results.json").exists()

    # The same command: only the two runs that never finished are computed.
    calls = _counting_run_arm(monkeypatch)
    assert main([*BENCH, "--out", str(out)]) == 0
    assert len(calls) == 2
    assert "2 of the runs were read back" in capsys.readouterr().err
    resumed = json.loads((out / "results.json").read_text())

    # ...and the results are those of an uninterrupted run.
    monkeypatch.undo()
    fresh_out = tmp_path / "fresh"
    assert main([*BENCH, "--out", str(fresh_out)]) == 0
    fresh = json.loads((fresh_out / "results.json").read_text())
    assert resumed["arms"] == fresh["arms"]
    assert resumed["curves"] == fresh["curves"]


def test_a_changed_setting_is_not_served_from_the_store(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    assert main([*BENCH, "--out", str(out)]) == 0
    calls = _counting_run_arm(monkeypatch)
    assert main([*BENCH, "--exec-cost", "7", "--out", str(out)]) == 0
    assert len(calls) == 4  # exec cost is part of the simulation's config: every run recomputed


def test_stored_arm_result_round_trips_exactly(tmp_path):
    cfg = SimConfig(n_tasks=4, n_solutions=8, groups_per_step=3, group_size=4, steps=12)
    store = RunStore(tmp_path)
    run = synthetic.stored_runner(store)
    first = run(cfg, "wmrl", 5, keep_metrics=True)
    again = run(cfg, "wmrl", 5, keep_metrics=True)
    assert (store.computed, store.reused) == (1, 1)
    for field in ("true_reward", "rollouts", "wm_calls", "executions"):
        a, b = getattr(first, field), getattr(again, field)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert json.dumps(first.metrics, sort_keys=True) == json.dumps(again.metrics, sort_keys=True)
    assert isinstance(ArmResult.from_dict(first.to_dict()), ArmResult)


def test_a_file_cut_short_is_a_run_that_did_not_finish(tmp_path):
    store = RunStore(tmp_path)
    inputs = {"arm": "real", "seed": 0}
    key = store.key(inputs)
    store.put(key, inputs, {"x": 1})
    path = store.dir / f"{key}.json"
    path.write_text(path.read_text()[:10])  # a kill in the middle of a write (without os.replace)
    assert store.get(key) is None
    assert store.run(inputs, lambda: {"x": 2}, dict, dict) == {"x": 2}
    assert store.get(key) == {"x": 2}


def test_keys_depend_on_inputs_and_code_not_on_order(tmp_path):
    store = RunStore(tmp_path)
    assert store.key({"a": 1, "b": 2}) == store.key({"b": 2, "a": 1})
    assert store.key({"a": 1}) != store.key({"a": 2})
    other_code = RunStore(tmp_path)
    other_code.code = "0" * 16
    assert other_code.key({"a": 1}) != store.key({"a": 1})
