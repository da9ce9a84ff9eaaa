"""Asynchronous anchors in the TRL engine (tiny model, closed-form sources): a batch's executions run
while the next batches train, and its rows come back in a later batch with their late advantages."""

from __future__ import annotations

import numpy as np
import pytest
from test_training_trainer import Spy, grpo_args, make_trainer, real_formula

pytestmark = [pytest.mark.trl]


def _async(lag, **extra):
    from wmrl.core.late import AsynchronyConfig

    return {"asynchrony": AsynchronyConfig(max_anchor_lag=lag, **extra)}


def test_a_batchs_rows_return_lag_batches_later_with_their_late_advantages(tmp_path):
    from wmrl.core.advantages import group_advantages

    trainer, _, anchor = make_trainer(
        tmp_path,
        "wmrl",
        preset_changes=_async(1, late_update="correction"),
        args=grpo_args(tmp_path, steps=4),
    )
    spy = Spy(trainer)
    trainer.train()
    own = 4  # 2 prompts x groups of 2
    outputs, corrections = spy.outputs, spy.corrections
    assert len(outputs) == 4
    assert outputs[0]["advantages"].shape[0] == own  # nothing has landed yet
    for t in (1, 2, 3):  # batch t carries batch t-1's rows (the last batch drains: its own run synchronously)
        out, before = outputs[t], outputs[t - 1]
        plan_then = corrections[t - 1][0]
        changed_rows = np.repeat(plan_then.execute_mask(2).any(axis=1), 2)
        assert out["advantages"].shape[0] == own + changed_rows.sum()
        late_ids, before_ids = out["completion_ids"][own:], before["completion_ids"][:own][changed_rows]
        width = before_ids.shape[1]
        assert (late_ids[:, :width] == before_ids).all()
        # the late advantages: group advantages with the landed real scores in, less what batch t-1 applied
        plan, _, real_then, _, corr = corrections[t - 1]
        assert np.isnan(real_then).all(), "a batch in flight trained without its real scores"
        texts = trainer.processing_class.batch_decode(before_ids, skip_special_tokens=True)
        executed = plan.execute_mask(2).reshape(-1)
        landed = np.where(executed, [real_formula(x) for x in texts], np.nan).reshape(-1, 2)
        rewards = np.where(np.isnan(landed), corr.rewards, landed)
        expected = group_advantages(rewards, None, trainer.corrector.config.advantages).advantages
        expected = expected - np.nan_to_num(corr.advantages)
        changed = executed.reshape(-1, 2).any(axis=1)
        # the rows of groups nothing landed in are left out; the rest come back in order
        got = out["advantages"][own:].numpy()
        np.testing.assert_allclose(got, expected[changed].reshape(-1), atol=1e-5)
    last_plan, _, last_real, _, _ = corrections[3]
    assert not np.isnan(last_real[last_plan.execute_mask(2)]).all(), "the draining batch executed its own"
    logged = trainer.state.log_history[1]
    assert logged["async/landed_executions"] > 0 and logged["async/lag_mean"] == 1.0
    # the executions a batch consumed are its anchor statuses: the first batch consumed none
    assert not any(k.startswith("anchor_status/") for k in trainer.state.log_history[0])
    shares = {k: v for k, v in logged.items() if k.startswith("anchor_status/")}
    assert shares and sum(shares.values()) == 1.0
    assert not trainer.pipeline.in_flight.pending
    assert anchor.calls >= 3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"loss_type": "grpo"}, "token-sum loss"),
        ({"num_iterations": 2}, "one optimiser step"),
        ({"save_strategy": "epoch"}, "save_strategy"),
        ({"max_steps": -1, "num_train_epochs": 1}, "needs max_steps"),
        ({"save_strategy": "steps", "save_steps": 0.5}, "whole number"),
    ],
)
def test_settings_that_cannot_carry_late_rows_are_refused(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        make_trainer(tmp_path, "wmrl", preset_changes=_async(1), args=grpo_args(tmp_path, **changes))


def test_a_lag_of_zero_trains_as_before(tmp_path):
    """max_anchor_lag = 0 is the synchronous trainer: the same advantages as a run without the setting."""
    runs = []
    for name, changes in (("sync", None), ("lag0", _async(0))):
        trainer, _, _ = make_trainer(
            tmp_path / name, "wmrl", preset_changes=changes, args=grpo_args(tmp_path / name, steps=2)
        )
        spy = Spy(trainer)
        trainer.train()
        runs.append([o["advantages"].numpy().tolist() for o in spy.outputs])
    assert runs[0] == runs[1]


def test_the_default_late_update_trains_the_executed_rows_again_and_only_them(tmp_path):
    trainer, _, _ = make_trainer(
        tmp_path, "wmrl", preset_changes=_async(1), args=grpo_args(tmp_path, steps=3)
    )
    assert trainer.corrector.config.asynchrony.late_update == "executed"
    spy = Spy(trainer)
    trainer.train()
    own = 4
    plan_then = spy.corrections[0][0]
    executed = plan_then.execute_mask(2).reshape(-1)
    out = spy.outputs[1]
    assert out["advantages"].shape[0] == own + executed.sum()
    before_ids = spy.outputs[0]["completion_ids"][:own][executed]
    assert (out["completion_ids"][own:, : before_ids.shape[1]] == before_ids).all()


def test_whole_anchor_groups_are_masked_in_flight_and_trained_when_they_land(tmp_path):
    trainer, _, _ = make_trainer(
        tmp_path, "wmrl", preset="wmrl_groups", preset_changes=_async(1), args=grpo_args(tmp_path, steps=3)
    )
    spy = Spy(trainer)
    trainer.train()
    plan, _, real, _, corr = spy.corrections[0]
    assert plan.anchor.sum() == 1 and np.isnan(real).all()
    assert np.isnan(corr.advantages[plan.anchor]).all(), "a whole anchor group in flight must not train yet"
    out = spy.outputs[1]
    landed = out["advantages"][4:].numpy()
    assert landed.shape == (2,) and np.abs(landed).sum() > 0  # the anchor group's two rollouts, real-graded


def test_a_plan_at_lag_two_sees_the_executions_in_flight(tmp_path):
    """At lag 2 a batch plans while the batch before it is still executing: the concurrency cap counts
    those executions and their solutions are passed on, so they are not chosen again."""
    trainer, _, _ = make_trainer(
        tmp_path, "wmrl", preset_changes=_async(2), args=grpo_args(tmp_path, steps=3)
    )
    seen = []
    plan = trainer.pipeline.plan

    def spy(*args, **kwargs):
        seen.append((args[3] if len(args) > 3 else kwargs.get("in_flight", 0), kwargs.get("in_flight_keys")))
        return plan(*args, **kwargs)

    trainer.pipeline.plan = spy
    trainer.train()
    assert len(seen) == 3
    assert seen[0][0] == 0, "nothing is in flight when the first batch plans"
    assert seen[1][0] >= 1, "the first batch's executions are in flight when the second plans"
    assert all(isinstance(keys, frozenset) for _, keys in seen)
