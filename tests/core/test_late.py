"""Asynchronous anchors (wmrl.core.late): the late update's algebra, the landing schedule, overdue
executions, checkpoints that hold nothing in flight, and kill -9 then resume."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from wmrl.core import Group, RewardPipeline, as_source
from wmrl.core.advantages import group_advantages
from wmrl.core.config import ConfigError
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.late import AsynchronyConfig, late_advantages, modelled_step_times, refuse_asynchrony
from wmrl.core.modes import apply_changes
from wmrl.core.scheduler import SchedulerConfig

HERE = Path(__file__).parent
TRUE = np.linspace(0.0, 1.0, 6)


# -- the late update's algebra -------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_a_correction_adds_up_to_the_synchronous_advantages(seed):
    """What step t applied plus the late correction is what a synchronous step would have applied."""
    rng = np.random.default_rng(seed)
    applied = rng.random((5, 4))
    applied[0, 1] = np.nan  # an unknown world-model score stays unknown
    landed = np.full((5, 4), np.nan)
    landed[1, 0], landed[2, 3], landed[4, 2] = rng.random(3)
    before = group_advantages(applied).advantages
    rewards, late = late_advantages(applied, before, landed, update="correction")
    sync = group_advantages(np.where(np.isnan(landed), applied, landed)).advantages
    changed = np.array([False, True, True, False, True])
    np.testing.assert_allclose((np.nan_to_num(before) + late)[changed], sync[changed], atol=1e-12)
    assert np.isnan(late[~changed]).all(), "a group nothing landed in gets no late update"
    np.testing.assert_array_equal(rewards[1, 0], landed[1, 0])


def test_a_full_update_applies_the_recomputed_advantages_again():
    applied = np.array([[0.1, 0.5, 0.9, 0.3]])
    landed = np.array([[np.nan, 0.0, np.nan, np.nan]])
    _, late = late_advantages(applied, group_advantages(applied).advantages, landed, update="full")
    np.testing.assert_allclose(late, group_advantages([[0.1, 0.0, 0.9, 0.3]]).advantages)


def test_a_masked_group_is_trained_once_when_it_lands():
    """A whole anchor group was unknown (masked) at its step: its late correction is its whole update."""
    applied = np.full((1, 3), np.nan)
    landed = np.array([[0.0, 0.5, 1.0]])
    _, late = late_advantages(applied, applied, landed, update="correction")
    np.testing.assert_allclose(late, group_advantages(landed).advantages)


def test_late_advantages_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        late_advantages(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 4)))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"asynchrony.max_anchor_lag": -1}, "max_anchor_lag"),
        ({"asynchrony.max_anchor_lag": True}, "max_anchor_lag"),
        ({"asynchrony.late_update": "twice"}, "late_update"),
        ({"asynchrony.overdue_after_s": 0}, "overdue_after_s"),
        ({"asynchrony.workers": 0}, "asynchrony.workers must be an integer >= 1"),
        ({"asynchrony.workers": 1.5}, "asynchrony.workers"),
    ],
)
def test_bad_settings_are_refused(changes, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        apply_changes(CorrectorConfig(), changes)


def test_an_engine_that_cannot_apply_late_groups_refuses_a_lag():
    refuse_asynchrony(AsynchronyConfig(), "the X engine", "because")  # lag 0: nothing to refuse
    with pytest.raises(ValueError, match="not supported by the X engine: because"):
        refuse_asynchrony(AsynchronyConfig(max_anchor_lag=1), "the X engine", "because")


# -- the modelled timeline ---------------------------------------------------------------------
def test_a_synchronous_step_lasts_generation_plus_latency():
    start = modelled_step_times([True, False, True], latency=3.0, lag=0)
    np.testing.assert_allclose(start, [0.0, 4.0, 5.0, 9.0])


@pytest.mark.parametrize(("latency", "lag"), [(2.0, 2), (4.0, 2), (8.0, 8), (1.0, 4)])
def test_an_asynchronous_step_lasts_the_closed_form(latency, lag):
    """Steady state: max(1, (1 + L) / (1 + lag)) step-times (the wait overlaps lag + 1 generations)."""
    n = 200
    start = modelled_step_times([True] * n, latency=latency, lag=lag)
    span = 10 * (lag + 1)  # whole periods of the steady state, after the ramp-up
    per_step = (start[n - lag] - start[n - lag - span]) / span
    assert per_step == pytest.approx(max(1.0, (1.0 + latency) / (1 + lag)), rel=1e-9)
    assert start[n] >= start[n - 1] + 1.0  # the last executions are awaited before the run ends


# -- the pipeline ------------------------------------------------------------------------------
def _config(lag: int, **asynchrony) -> CorrectorConfig:
    return CorrectorConfig(
        debias=DebiasConfig(min_pairs=4),
        scheduler=SchedulerConfig(fraction=0.5, floor=0, rollout_share=1.0),
        asynchrony=AsynchronyConfig(max_anchor_lag=lag, **asynchrony),
    )


def _groups(step: int) -> list[Group]:
    rng = np.random.default_rng(step)
    return [
        Group(key=f"{step}:{t}", items=[(t, int(a)) for a in rng.integers(0, 6, 4)], task=f"t{t}")
        for t in (0, 1)
    ]


def _pipeline(lag: int, sleep=lambda: 0.0, keyed=False, **asynchrony):
    calls = []

    def real(items):
        time.sleep(sleep())
        calls.append(list(items))
        return [float(TRUE[a]) for _, a in items]

    wm = as_source(lambda items: [float(TRUE[a] ** 2) for _, a in items], "world_model", "wm")
    pipe = RewardPipeline(
        wm,
        as_source(real, "anchor", "real"),
        corrector=_config(lag, **asynchrony),
        solution_key=(lambda item: f"{item[0]}:{item[1]}") if keyed else None,
    )
    return pipe, calls


def _run(pipe, steps=6):
    out = []
    for t in range(steps):
        result = pipe.step(_groups(t), drain=t == steps - 1)
        out.append(result)
    return out


def test_a_steps_executions_land_exactly_lag_steps_later():
    pipe, _ = _pipeline(2, sleep=lambda: 0.05)
    results = _run(pipe)
    for t, result in enumerate(results[:-1]):
        assert [late.step for late in result.late] == ([t - 2] if t >= 2 else [])
        assert all(late.lag == 2 for late in result.late)
        # this step's own executed rollouts were graded by the world model while they ran
        assert np.isnan(result.scores.real).all()
    # the last step drains: every earlier step still in flight, and its own executions synchronously
    assert [late.step for late in results[-1].late] == [3, 4]
    assert not np.isnan(results[-1].scores.real).all()
    assert not pipe.in_flight.pending
    pipe.close()


def _trace(results) -> list:
    """A run's advantages and late updates, step by step, comparable with ``==`` (NaN as 9)."""
    return [
        (
            np.nan_to_num(r.advantages, nan=9.0).tolist(),
            [np.nan_to_num(late.advantages, nan=9.0).tolist() for late in r.late],
        )
        for r in results
    ]


def test_the_run_is_the_same_whatever_the_executions_timing():
    """Landing at a fixed step keeps the run deterministic: random execution times change nothing."""
    runs = []
    for seed in (1, 2):
        jitter = random.Random(seed)
        pipe, _ = _pipeline(2, sleep=lambda jitter=jitter: jitter.uniform(0.0, 0.08))
        results = _run(pipe)
        runs.append(_trace(results))
        pipe.close()
    assert runs[0] == runs[1]


def _concurrency_of(workers: int) -> tuple[int, list]:
    """The most execution passes that ran at once over a run at lag 3 (each pass 0.15 s), and the run's
    advantages and late updates."""
    lock, running, most = threading.Lock(), [0], [0]

    def real(items):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.15)
        with lock:
            running[0] -= 1
        return [float(TRUE[a]) for _, a in items]

    pipe = RewardPipeline(
        as_source(lambda items: [float(TRUE[a] ** 2) for _, a in items], "world_model", "wm"),
        as_source(real, "anchor", "real"),
        corrector=_config(3, workers=workers),
    )
    results = _run(pipe)
    pipe.close()
    return most[0], _trace(results)


def test_several_workers_overlap_the_passes_of_several_steps_and_change_nothing_else():
    """``asynchrony.workers``: one worker runs one pass at a time (a step lasts at least a pass); three let
    the passes of the three steps in flight at lag 3 overlap. Landing stays at fixed steps: the run's
    advantages and late updates are the same."""
    one, trace_one = _concurrency_of(1)
    three, trace_three = _concurrency_of(3)
    assert one == 1
    assert three >= 2  # the passes of steps in flight ran at once (three submitted within 0.15 s)
    assert trace_one == trace_three


def test_lag_zero_is_the_synchronous_step():
    sync, _ = _pipeline(0)
    default = RewardPipeline(
        as_source(lambda items: [float(TRUE[a] ** 2) for _, a in items], "world_model", "wm"),
        as_source(lambda items: [float(TRUE[a]) for _, a in items], "anchor", "real"),
        corrector=apply_changes(_config(0), {}),
    )
    for t in range(4):
        a, b = sync.step(_groups(t)), default.step(_groups(t))
        np.testing.assert_array_equal(a.advantages, b.advantages)
        assert a.late == [] and not any(k.startswith("async/") for k in a.metrics)


def test_a_solution_in_flight_is_not_executed_again():
    pipe, calls = _pipeline(3, sleep=lambda: 0.05, keyed=True)
    for t in range(3):  # the same groups every step: the same solutions recur while in flight
        pipe.step(_groups(0) if t == 0 else [Group(f"{t}:{g.key}", g.items, g.task) for g in _groups(0)])
    pipe.in_flight.wait(pipe.in_flight.pending, None)
    executed = [item for batch in calls for item in batch]
    assert len(executed) == len(set(executed)), "a solution was executed again while its result was in flight"
    pipe.close()


def test_executions_past_their_deadline_are_used_for_calibration_only():
    slow = iter([0.6] + [0.0] * 50)
    pipe, _ = _pipeline(1, sleep=lambda: next(slow), keyed=True, overdue_after_s=0.05)
    first = pipe.step(_groups(0))
    assert first.metrics["async/in_flight_executions"] > 0
    second = pipe.step(_groups(1))
    assert second.metrics["async/overdue"] == 1.0 and second.late == []
    assert second.metrics["async/wait_s"] < 0.5
    time.sleep(1.5)  # well past the slow execution (0.6 s), even on a loaded machine
    third = pipe.step(_groups(2))
    assert third.metrics["async/overdue_landed"] == 1.0
    assert [late.step for late in third.late] == [1]  # step 1's executions landed on time
    assert pipe.corrector.memory is not None and len(pipe.corrector.memory) > 0
    assert pipe.ledger.streams["anchor_wait"].wall_s > 0
    pipe.close()


def test_a_checkpoint_cannot_hold_executions_in_flight(tmp_path):
    pipe, _ = _pipeline(2, sleep=lambda: 0.05)
    pipe.step(_groups(0))
    with pytest.raises(RuntimeError, match="in flight"):
        pipe.save(tmp_path / "ckpt")
    assert pipe.drain()["async/drained"] == 1.0
    pipe.save(tmp_path / "ckpt")
    pipe.close()


def test_world_model_mode_refuses_a_lag():
    with pytest.raises(ValueError, match="executes nothing"):
        RewardPipeline(
            as_source(lambda items: [0.0] * len(items), "world_model", "wm"),
            mode="world_model",
            corrector=CorrectorConfig(asynchrony=AsynchronyConfig(max_anchor_lag=1)),
        )


def test_a_loop_domain_without_late_anchors_is_refused(tmp_path):
    from wmrl.core.loop import LoopTrainer
    from wmrl.core.rundir import RunDirectory

    sys.path.insert(0, str(HERE))
    try:
        from late_worker import LateToyConfig, LateToyDomain
    finally:
        sys.path.remove(str(HERE))

    class NoLate(LateToyDomain):
        late_anchors = False

    config = LateToyConfig()
    pipe, _ = _pipeline(2)
    with pytest.raises(ValueError, match="late_anchors"):
        LoopTrainer(NoLate(config), pipe, config, RunDirectory(tmp_path / "run"), progress=False)


# -- kill -9 with executions in flight, then --resume ------------------------------------------
def _worker(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HERE / "late_worker.py"), str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _trained(run: Path) -> tuple[list[dict], torch.Tensor]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    kept = [{k: v for k, v in r.items() if not k.startswith("time") and k != "async/wait_s"} for r in rows]
    final = sorted((run / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    return kept, torch.load(final / "toy.pt", weights_only=True)["logits"]


@pytest.mark.slow
def test_kill_9_with_executions_in_flight_then_resume_continues_as_if_never_stopped(tmp_path):
    whole = _worker(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    killed = _worker(tmp_path / "killed", "--kill-at", "3")
    assert killed.returncode == -9, killed.stderr
    resumed = _worker(tmp_path / "killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows_whole, logits_whole = _trained(tmp_path / "whole")
    rows_resumed, logits_resumed = _trained(tmp_path / "killed")
    assert [r["step"] for r in rows_resumed] == list(range(6))
    assert any(r["toy/late_groups"] > 0 for r in rows_whole), "no late groups: the test tests nothing"
    assert rows_resumed == rows_whole
    assert torch.equal(logits_resumed, logits_whole)


def test_ctrl_c_with_executions_in_flight_uses_them_for_calibration_and_checkpoints(tmp_path, capsys):
    """A stop between checkpoints: what is in flight is awaited and calibrates (no step is left for its
    gradient), the checkpoint holds nothing in flight, and the run resumes from it."""
    import os
    import signal

    from wmrl.core.errors import Interrupted
    from wmrl.core.loop import LoopTrainer
    from wmrl.core.rundir import RunDirectory, checkpoint_step, list_checkpoints

    sys.path.insert(0, str(HERE))
    try:
        from late_worker import LateToyConfig, LateToyDomain
    finally:
        sys.path.remove(str(HERE))

    class StopAfterTwo(LateToyDomain):
        def update(self, batch, result, step):
            out = super().update(batch, result, step)
            if step == 2:  # after checkpoint-2 (which drained), with step 2's executions in flight
                os.kill(os.getpid(), signal.SIGINT)
            return out

    config = LateToyConfig()
    pipe, calls = _pipeline(2, sleep=lambda: 0.05)
    trainer = LoopTrainer(StopAfterTwo(config), pipe, config, RunDirectory(tmp_path / "run"), progress=False)
    with pytest.raises(Interrupted, match="stopped after step 3"):
        trainer.run()
    trainer.close()
    assert "stopped with executions in flight" in capsys.readouterr().err
    # every execution submitted, step 2's included, reached the corrector before the checkpoint
    assert pipe.corrector.executions_total == sum(len(batch) for batch in calls) > 0
    assert not pipe.in_flight.pending and not pipe.in_flight.overdue
    assert [checkpoint_step(c) for c in list_checkpoints(tmp_path / "run")] == [2, 3]
    again_pipe, _ = _pipeline(2)
    again = LoopTrainer(
        LateToyDomain(config), again_pipe, config, RunDirectory(tmp_path / "run", resume=True), progress=False
    )
    assert again.step == 3
    again.run()
    again.close()


def test_the_concurrency_cap_counts_executions_in_flight():
    """Whole anchor groups capped at 2 in flight, landing 2 steps late: while step 0's two groups
    execute, step 1 starts none (floor 0); once they land (at step 2, before it plans), step 2 starts two."""
    config = CorrectorConfig(
        scheduler=SchedulerConfig(fraction=0.5, floor=0, max_concurrent=2, rollout_share=0.0),
        asynchrony=AsynchronyConfig(max_anchor_lag=2),
    )
    wm = as_source(lambda items: [float(TRUE[a] ** 2) for _, a in items], "world_model", "wm")
    real = as_source(lambda items: [float(TRUE[a]) for _, a in items], "anchor", "real")
    pipe = RewardPipeline(wm, real, corrector=config)
    four = [g for t in (0, 1) for g in _groups(10 * t)]  # 4 groups a step: 2 anchored at fraction 0.5

    def groups(step):
        return [Group(f"{step}:{i}", g.items, g.task) for i, g in enumerate(four)]

    anchors = [int(pipe.step(groups(t)).plan.anchor.sum()) for t in range(4)]
    assert anchors == [2, 0, 2, 0]
    pipe.close()
