"""The reward pipeline: one training step's plan, score, correct; checkpoint files; the cost report; modes."""

import json
import threading
import time

import numpy as np
import pytest

from wmrl.core.config import ConfigError
from wmrl.core.corrector import METRICS, Corrector, CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.modes import Mode, apply_changes, resolve_corrector
from wmrl.core.pipeline import CORRECTOR_FILE, COST_REPORT_KEYS, LEDGER_FILE, RewardPipeline
from wmrl.core.rollouts import Exact, Group
from wmrl.core.scheduler import SchedulerConfig
from wmrl.core.sources import Grade, SourceError, as_source


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


def test_step_scores_anchor_groups_with_real_execution_and_calibrates():
    wm, real = _sources()
    pipe = RewardPipeline(
        wm,
        real,
        corrector=CorrectorConfig(
            scheduler=SchedulerConfig(fraction=0.25), debias=DebiasConfig(min_pairs=32)
        ),
    )
    rng = np.random.default_rng(1)
    executed_total = 0
    for step in range(30):
        groups = _groups(rng, step)
        out = pipe.step(groups)
        for i in np.flatnonzero(out.anchor):
            np.testing.assert_allclose(out.rewards[i], groups[i].items)
        # the world model graded every rollout; real execution only the anchor groups'
        assert not np.isnan(out.scores.wm).any()
        executed = ~np.isnan(out.scores.real)
        assert executed.sum() == out.anchor.sum() * 6
        executed_total += int(executed.sum())
    assert out.metrics["wmrl/calibrated"] == 1.0
    assert out.metrics["wmrl/bias_reduction"] is None or out.metrics["wmrl/bias_reduction"] > 0.3
    assert set(out.metrics) == set(METRICS)
    # the ledger booked both streams and counted every rollout
    report = pipe.cost_report(steps=30)
    assert report["graded_rollouts"] == 30 * 8 * 6
    assert report["spent"]["world_model"]["items"] == 30 * 8 * 6
    assert report["spent"]["anchor"]["items"] == executed_total


def test_the_two_sources_run_concurrently():
    barrier = threading.Barrier(2, timeout=5)

    def slow(items):  # each source waits for the other: a sequential pipeline would deadlock (timeout)
        barrier.wait()
        return [0.5 for _ in items]

    wm = as_source(slow, "world_model", "wm")
    real = as_source(slow, "anchor", "real")
    pipe = RewardPipeline(wm, real, corrector=CorrectorConfig(scheduler=SchedulerConfig(fraction=0.5)))
    pipe.step(_groups(np.random.default_rng(0), 0, n=4))


def test_unknown_scores_stay_unknown():
    wm, real = _sources(unknown=0.3)
    out = RewardPipeline(wm, real).step(_groups(np.random.default_rng(0), 0))
    unknown = np.isnan(out.rewards)
    assert unknown.any()
    assert np.isnan(out.advantages[unknown]).all()


def test_exact_items_reach_both_streams_and_call_no_source():
    calls = {"wm": 0, "real": 0}

    def counting(name, value):
        def fn(items):
            calls[name] += len(items)
            assert not any(isinstance(i, Exact) for i in items), "an Exact item was sent to a source"
            return [value] * len(items)

        return fn

    wm = as_source(counting("wm", 0.4), "world_model", "wm")
    real = as_source(counting("real", 0.9), "anchor", "real")
    pipe = RewardPipeline(wm, real, mode="real")  # every group executed
    groups = [Group("g", [Exact(0.0, "malformed"), "code", "code"])]
    out = pipe.step(groups)
    assert calls == {"wm": 0, "real": 2}  # real mode never calls the world model
    np.testing.assert_allclose(out.rewards[0], [0.0, 0.9, 0.9])
    assert out.scores.statuses.count("malformed") == 1
    assert pipe.ledger.report()["spent"]["anchor"]["items"] == 3  # the Exact one is a free item


def test_real_mode_calls_the_world_model_only_for_diagnostics():
    wm, real = _sources()
    assert RewardPipeline(wm, real, mode="real").world_model is None
    diag = RewardPipeline(wm, real, mode="real", world_model_in_real=True)
    out = diag.step(_groups(np.random.default_rng(0), 0))
    assert not np.isnan(out.scores.wm).any() and out.anchor.all()


def test_modes_are_presets_applied_in_one_place():
    base = CorrectorConfig()
    # the memory left unset is the mode's: on in wmrl, off in real and world_model
    assert resolve_corrector("wmrl", base, base) == apply_changes(base, {"memory.enabled": True})
    real = resolve_corrector("real", base, base)
    assert real.scheduler.fraction == 1.0 and real.fusion.mode == "none" and real.memory.enabled is False
    wm_only = resolve_corrector("world_model", base, base)
    assert wm_only.scheduler.fraction == 0.0 and not wm_only.debias.enabled
    # the preset and CorrectorConfig.preset agree (one definition)
    assert CorrectorConfig.preset("real") == real and CorrectorConfig.preset("world_model") == wm_only
    with pytest.raises(ConfigError, match="contradicts"):
        resolve_corrector("world_model", CorrectorConfig.preset("wmrl_paper_weight"), base)
    with pytest.deprecated_call():
        assert Mode("sparse") is Mode.REAL
    with pytest.raises(ConfigError, match="one of"):
        Mode.parse("both")


def test_sources_are_checked_against_the_mode():
    wm, real = _sources()
    with pytest.raises(SourceError, match="used as"):
        RewardPipeline(real, wm)
    with pytest.raises(SourceError, match="anchor"):
        RewardPipeline(wm, None, mode="real")
    with pytest.raises(SourceError, match="world-model"):
        RewardPipeline(None, real, mode="world_model")
    RewardPipeline(wm, None, mode="world_model")  # nothing is executed: no anchor needed
    with pytest.raises(ConfigError, match="executes every group"):
        RewardPipeline(wm, real, mode="real", corrector=Corrector(CorrectorConfig()))


def test_step_rejects_empty_groups_and_broken_sources():
    wm, real = _sources()
    pipe = RewardPipeline(wm, real)
    with pytest.raises(ValueError, match="empty"):
        pipe.step([Group("a", [])])
    with pytest.raises(ValueError, match="at least one group"):
        pipe.step([])
    short = as_source(lambda items: [0.5], "world_model", "short")
    with pytest.raises(SourceError, match="1 scores for"):
        RewardPipeline(short, real).step(_groups(np.random.default_rng(0), 0))


def test_grade_variance_and_feedback_come_through():
    class WM:
        name, role = "wm", "world_model"

        def grade(self, items):
            return [Grade(0.5, "valid", variance=0.01, feedback=f"predicted {x}") for x in items]

        def score(self, items):
            return [0.5] * len(items)

    _, real = _sources()
    pipe = RewardPipeline(WM(), real)
    scores = pipe.score([0.1, 0.2], [False, True])
    assert scores.wm_variance.tolist() == [0.01, 0.01]
    assert scores.feedback([False, True]) == ["predicted 0.1", None]  # the anchor row's real source has none
    assert scores.real.tolist()[1] == 0.2 and np.isnan(scores.real[0])


def test_checkpoint_files_and_resume_are_exact(tmp_path):
    wm, real = _sources()
    config = CorrectorConfig(debias=DebiasConfig(min_pairs=8))
    a = RewardPipeline(wm, real, corrector=config)
    rng = np.random.default_rng(3)
    for step in range(5):
        a.step(_groups(rng, step))
    a.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / CORRECTOR_FILE).is_file() and (tmp_path / "ckpt" / LEDGER_FILE).is_file()
    assert json.loads((tmp_path / "ckpt" / LEDGER_FILE).read_text())["ranks"][0] == a.ledger.state_dict()
    b = RewardPipeline(*_sources(), corrector=config)
    b.load(tmp_path / "ckpt")
    assert b.corrector.state_dict().keys() == a.corrector.state_dict().keys()
    assert b.ledger.state_dict() == a.ledger.state_dict()
    with pytest.raises(ValueError, match="configured differently"):
        RewardPipeline(wm, real, corrector=CorrectorConfig()).load(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match=CORRECTOR_FILE):
        b.load(tmp_path)


def test_ledgers_of_several_ranks_are_kept_apart_and_merged_on_another_world_size(tmp_path):
    wm, real = _sources()
    pipe = RewardPipeline(wm, real)
    states = []
    for seconds in (1.0, 2.0):
        pipe.ledger.add("anchor", seconds, items=1)
        states.append(pipe.ledger.state_dict())
    pipe.save(tmp_path, states)
    for rank in (0, 1):
        other = RewardPipeline(wm, real)
        other.load(tmp_path, rank=rank, world=2)
        assert other.ledger.state_dict()["streams"] == states[rank]["streams"]
    alone = RewardPipeline(wm, real)
    alone.load(tmp_path, rank=0, world=1)
    assert alone.ledger.streams["anchor"].wall_s == pytest.approx(1.0 + 3.0)


def test_cost_report_has_one_layout():
    wm, real = _sources()
    pipe = RewardPipeline(wm, real)
    pipe.step(_groups(np.random.default_rng(0), 0))
    report = pipe.cost_report(steps=1, details={"note": "x"})
    assert set(report) == COST_REPORT_KEYS
    assert report["mode"] == "wmrl" and report["details"] == {"note": "x"}
    assert report["per_item_s"]["generation"] is None  # nothing generated: unknown, not 0


def test_active_scheduler_scores_the_world_model_first():
    order = []

    def wm(items):
        order.append("wm")
        return [float(x) for x in items]

    def real(items):
        order.append("real")
        time.sleep(0.01)
        return [float(x) for x in items]

    pipe = RewardPipeline(
        as_source(wm, "world_model", "wm"),
        as_source(real, "anchor", "real"),
        corrector=CorrectorConfig(scheduler=SchedulerConfig(fraction=0.25, active_share=1.0)),
    )
    pipe.step(_groups(np.random.default_rng(0), 0))
    assert order == ["wm", "real"]


def test_step_passes_the_anchor_sources_declared_noise():
    from wmrl.core.sources import NoiseModel

    wm, real = _sources()
    real.noise = NoiseModel.gaussian(0.01)
    out = RewardPipeline(wm, real).step(_groups(np.random.default_rng(0), 0))
    assert out.metrics["wmrl/exec_noise_route"] == 1.0
    assert out.metrics["wmrl/exec_noise_var"] == pytest.approx(0.01)


def test_repeats_execute_twice_and_measure_the_noise():
    rng = np.random.default_rng(0)
    calls = []

    def noisy(items):  # real execution with Gaussian noise of variance 0.04 on every call
        calls.append(len(items))
        return [float(x + rng.normal(0, 0.2)) for x in items]

    wm = as_source(lambda items: [float(x) for x in items], "world_model", "wm")
    real = as_source(noisy, "anchor", "real")
    config = CorrectorConfig(scheduler=SchedulerConfig(fraction=0.5, repeat_share=1.0))
    pipe = RewardPipeline(wm, real, corrector=config)
    for step in range(40):
        out = pipe.step(_groups(np.random.default_rng(step), step))
    assert len(calls) == 80  # every step: the executions, then the same rollouts again
    assert out.metrics["wmrl/exec_repeats"] > 0
    assert out.metrics["wmrl/exec_noise_measured"] == pytest.approx(0.04, rel=0.2)
    assert not np.isnan(out.scores.real_repeat[~np.isnan(out.scores.real)]).any()


def test_per_rollout_anchors_execute_single_rollouts_after_the_world_model():
    order = []

    def wm(items):
        order.append("wm")
        return [float(x) for x in items]

    def real(items):
        order.append(len(items))
        return [float(x) for x in items]

    config = CorrectorConfig(scheduler=SchedulerConfig(fraction=0.25, floor=0, rollout_share=1.0))
    pipe = RewardPipeline(
        as_source(wm, "world_model", "wm"),
        as_source(real, "anchor", "real"),
        corrector=config,
        stream_chunks=1,
    )
    out = pipe.step(_groups(np.random.default_rng(0), 0))
    executed = ~np.isnan(out.scores.real)
    assert order == ["wm", executed.sum()]  # one chunk: the world model scores everything first
    # In chunks, each chunk's executions start once its scores are in: the same plan and the same step.
    order.clear()
    streamed = RewardPipeline(
        as_source(wm, "world_model", "wm"),
        as_source(real, "anchor", "real"),
        corrector=config,
        stream_chunks=4,
    ).step(_groups(np.random.default_rng(0), 0))
    assert order.count("wm") == 4 and order[0] == "wm"
    assert sum(x for x in order if x != "wm") == executed.sum()
    np.testing.assert_array_equal(streamed.plan.execute, out.plan.execute)
    np.testing.assert_array_equal(streamed.advantages, out.advantages)
    assert not out.anchor.any() and 0 < executed.sum() < executed.size  # single rollouts, no whole group


def test_the_caller_can_decide_what_the_memory_skips():
    """``score(known=...)``: an execution submitted off the critical path skips what the memory knew
    when it was submitted, not what it knows when the worker gets to it."""
    executed = []

    def real(items):
        executed.extend(items)
        return [float(x) for x in items]

    pipeline = RewardPipeline(None, as_source(real, "anchor", "real"), mode="real", solution_key=str)
    rows = np.array([True, True, True])
    out = pipeline.score([0.1, 0.2, 0.3], rows, world_model=False, known=[False, True, False])
    assert executed == [0.1, 0.3] and np.isnan(out.real[1]) and out.real[0] == 0.1
    with pytest.raises(ValueError, match="one entry per item"):
        pipeline.score([0.1, 0.2], rows[:2], world_model=False, known=[True])
    # need_feedback executes everything, whatever was known
    executed.clear()
    pipeline.score([0.1, 0.2], rows[:2], world_model=False, known=[True, True], need_feedback=True)
    assert executed == [0.1, 0.2]
