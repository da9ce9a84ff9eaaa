"""Asynchronous anchors in the verl integration, without verl: the world model's scores handed to the
pipeline (``scored=``, as verl's reward loop grades them), the rows kept while their executions run and
given back with their late advantages, and which verl steps drain. The launch itself runs in
``tests/verl_env/test_verl_cpu_step.py`` (slow, in ``.venv-verl``)."""

from __future__ import annotations

import numpy as np
import pytest

from wmrl.core import RewardPipeline, as_source
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.engines.verl.advantage import correct_rows, row_groups
from wmrl.core.engines.verl.late_rows import LateRows, asynchronous_step, late_key
from wmrl.core.engines.verl.trainer import drains
from wmrl.core.late import AsynchronyConfig, LateGroups
from wmrl.core.pipeline import Scores
from wmrl.core.rollouts import Group
from wmrl.core.scheduler import SchedulerConfig

TRUE = np.linspace(0.0, 1.0, 8)


def _wm(item: tuple[str, int]) -> float:
    return float(TRUE[item[1]] ** 2)


def _pipeline(lag: int) -> tuple[RewardPipeline, list[list[tuple[str, int]]]]:
    executed: list[list[tuple[str, int]]] = []

    def real(items):
        executed.append(list(items))
        return [float(TRUE[a]) for _, a in items]

    def world_model(items):  # pragma: no cover - verl's reward loop scores; the pipeline must not
        raise AssertionError("the world model was called although the scores were given")

    pipe = RewardPipeline(
        as_source(world_model, "world_model", "wm"),
        as_source(real, "anchor", "real"),
        corrector=CorrectorConfig(
            scheduler=SchedulerConfig(fraction=0.5, floor=1, rollout_share=1.0),
            asynchrony=AsynchronyConfig(max_anchor_lag=lag),
        ),
    )
    return pipe, executed


def _batch(step: int, groups: int = 3, width: int = 4) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """A verl-like batch: ``(uids, items, TransferQueue keys)``, rows of a group interleaved with others."""
    rng = np.random.default_rng(step)
    rows = [(f"u{step}-{g}", (f"p{g}", int(rng.integers(0, 8)))) for g in range(groups) for _ in range(width)]
    order = rng.permutation(len(rows))
    uids = [rows[i][0] for i in order]
    items = [rows[i][1] for i in order]
    return uids, items, [f"{u}_{n}_0" for n, u in enumerate(uids)]


def _scored(groups) -> Scores:
    """The world model's scores of ``groups``' rollouts, flat in group-major order (the pipeline's)."""
    items = [item for g in groups for item in g.items]
    scored = Scores.empty(len(items))
    scored.wm[:] = [_wm(item) for item in items]
    return scored


def test_given_world_model_scores_step_as_correct_rows_does():
    """``step(scored=...)`` with synchronous anchors is verl's synchronous correction: the same plan, the
    same executions, the same advantages (the world model is never called)."""
    for step in range(1, 4):
        uids, items, _ = _batch(step)
        via_rows, executed_rows = _pipeline(0)
        via_step, executed_step = _pipeline(0)
        rows = correct_rows(via_rows, uids, [_wm(i) for i in items], items, step)
        groups, group_of, slot = row_groups(uids, items, step)
        result = via_step.step(groups, scored=_scored(groups))
        np.testing.assert_array_equal(np.asarray(result.advantages)[group_of, slot], rows.advantages)
        assert sorted(executed_step[0]) == sorted(executed_rows[0])


def test_given_scores_must_cover_every_rollout():
    pipe, _ = _pipeline(0)
    with pytest.raises(ValueError, match="3 world-model scores for 4 rollouts"):
        pipe.step([Group("g", [("p", 1)] * 4)], scored=Scores.empty(3))


def test_row_groups_keeps_row_order_within_a_group():
    groups, group_of, slot = row_groups(["b", "a", "b", "a", "b"], ["x0", "y0", "x1", "y1", "x2"], 7)
    assert [g.key for g in groups] == ["b@7", "a@7"]
    assert [list(g.items) for g in groups] == [["x0", "x1", "x2"], ["y0", "y1"]]
    assert group_of.tolist() == [0, 1, 0, 1, 0] and slot.tolist() == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="one entry per row"):
        row_groups(["a"], [], 1)


def _verl_step(pipe, rows: LateRows, step: int, fetched: list[str], drain: bool = False):
    """One verl batch through :func:`asynchronous_step`, TransferQueue's rows faked by their keys."""
    uids, items, keys = _batch(step)

    def fetch(wanted):
        fetched.extend(wanted)
        return [{"key": k, "responses": [ord(c) for c in k]} for k in wanted]

    batch = [(k, u, item, _wm(item), np.nan) for k, u, item in zip(keys, uids, items, strict=True)]
    done = asynchronous_step(pipe, rows, batch, {k: {"seq_len": 3} for k in keys}, step, drain, fetch)
    return done, keys


def test_the_rows_of_submitted_groups_are_kept_and_come_back_with_their_late_advantages():
    pipe, _ = _pipeline(1)
    rows = LateRows()
    fetched: list[str] = []
    first, keys1 = _verl_step(pipe, rows, 1, fetched)
    kept_keys = set(fetched)
    assert kept_keys and len(rows) == len(kept_keys)
    assert len(kept_keys) % 4 == 0  # whole groups: every row of a group with an execution
    assert first.late == [] and not first.result.late  # nothing landed at the first step
    assert set(first.advantages) == set(keys1)

    second, _ = _verl_step(pipe, rows, 2, fetched)
    (landed,) = second.result.late
    assert landed.step == 0 and landed.lag == 1
    # every finite late advantage of the landed groups comes back once, on its own row
    _, group_of, slot = row_groups(*_batch(1)[:2], 1)
    expected = {}
    for i, key in enumerate(keys1):
        value = landed.advantages[group_of[i], slot[i]]
        if np.isfinite(value):
            expected[key] = float(value)
    assert expected and {row.row.key: row.advantage for row in second.late} == expected
    assert set(expected) <= kept_keys
    for row in second.late:
        assert row.key == late_key(0, row.row.key) and len(row.key.rsplit("_", 2)) == 3
        assert row.row.sample["key"] == row.row.key and row.row.tag == {"seq_len": 3}
    assert len(rows) > 0 and 0 not in rows._rows  # step 0's rows given back and forgotten; step 1's kept

    third, _ = _verl_step(pipe, rows, 3, fetched, drain=True)  # the last step: step 1's land, nothing left
    assert [late.step for late in third.result.late] == [1] and third.late
    assert len(rows) == 0 and not pipe.in_flight.pending
    pipe.close()


def test_an_overdue_steps_rows_are_forgotten_once_nothing_can_train_them():
    """An execution past ``overdue_after_s`` lands for calibration only: its kept rows are dropped at its
    landing step, not held for ever."""
    import threading

    gate = threading.Event()
    pipe = RewardPipeline(
        as_source(lambda items: [0.0] * len(items), "world_model", "wm"),
        as_source(lambda items: [float(gate.wait(5)) for _ in items], "anchor", "real"),
        corrector=CorrectorConfig(
            scheduler=SchedulerConfig(fraction=0.5, floor=1, rollout_share=1.0),
            asynchrony=AsynchronyConfig(max_anchor_lag=1, overdue_after_s=0.01),
        ),
    )
    rows = LateRows()
    _verl_step(pipe, rows, 1, [])
    assert len(rows) > 0
    second, _ = _verl_step(pipe, rows, 2, [])  # step 1's execution is still running: overdue
    assert second.late == [] and second.result.metrics["async/overdue"] == 1
    assert 0 not in rows._rows
    gate.set()
    pipe.drain()
    pipe.close()


def test_a_late_advantage_on_a_row_not_kept_is_an_error_not_a_silent_drop():
    rows = LateRows()
    rows.keep(0, {"a@1": ["k0", "k1"]}, {"k0": {}, "k1": {}}, lambda keys: [{} for _ in keys])
    late = LateGroups(
        0,
        1,
        [Group("a@1", [1, 2]), Group("b@1", [3, 4])],
        np.array([[0.5, np.nan], [0.1, np.nan]]),
        np.zeros((2, 2)),
    )
    with pytest.raises(
        RuntimeError, match="'b@1' of corrector step 0 has a late advantage for a row that was not kept"
    ):
        rows.due([late])
    with pytest.raises(RuntimeError, match="none of its rows were kept"):
        LateRows().due([late])


def test_rows_of_steps_that_landed_for_calibration_only_are_forgotten():
    rows = LateRows()
    for step in range(3):
        rows.keep(step, {f"g@{step}": [f"k{step}"]}, {f"k{step}": {}}, lambda keys: [{} for _ in keys])
    with pytest.raises(ValueError, match="kept already"):
        rows.keep(1, {}, {}, lambda keys: [])
    assert rows.forget_before(2) == 2 and len(rows) == 1


def test_fetch_must_return_one_row_per_key():
    with pytest.raises(RuntimeError, match="1 rows for 2 keys"):
        LateRows().keep(0, {"g": ["a", "b"]}, {"a": {}, "b": {}}, lambda keys: [{}])


@pytest.mark.parametrize(
    ("step", "total", "save_freq", "expected"),
    [
        (1, 3, 3, False),
        (3, 3, 3, True),  # the last step
        (2, 6, 2, True),  # a checkpoint step
        (5, 6, -1, False),  # no checkpoints: only the last step drains
        (6, 6, -1, True),
        (7, 6, 0, True),
    ],
)
def test_which_verl_steps_drain(step, total, save_freq, expected):
    assert drains(step, total, save_freq) is expected
