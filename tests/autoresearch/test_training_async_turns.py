"""Asynchronous anchors with K-turn episodes in the TRL engine (tiny model, closed-form sources).

A step's rollout runs in the world model's shadow: every trajectory, executed or not, is shown the
world model's feedback and nothing is executed during it; the chosen trajectories' turns are then
executed off the critical path, and their real trajectory reward (the episode's aggregate of the real
turn rewards: here the last turn's) comes back ``lag`` steps later with the rows' late advantages.
The step that drains (the last) runs synchronously, real feedback shown to its executed rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_training_trainer import Spy, grpo_args, make_trainer, real_formula, wm_formula
from vllm_grpo_worker import FeedbackSource, TextEpisode

pytestmark = [pytest.mark.trl]

GROUP = 2
OWN = 4  # 2 prompts x groups of 2


def _async(lag, **extra):
    from wmrl.core.late import AsynchronyConfig

    return {"asynchrony": AsynchronyConfig(max_anchor_lag=lag, **extra)}


def _train(tmp_path, preset=None, steps=3, **extra):
    wm = FeedbackSource(wm_formula, "world_model", "wm")
    anchor = FeedbackSource(real_formula, "anchor", "real")
    trainer, _, _ = make_trainer(
        tmp_path,
        "wmrl",
        preset=preset,
        preset_changes=_async(1, **extra),
        args=grpo_args(tmp_path, steps=steps),
        world_model=wm,
        anchor=anchor,
        episodes=TextEpisode,
        turns=2,
    )
    rollouts = []
    rollout = trainer.rollout_func
    trainer.rollout_func = lambda prompts, tr: rollouts.append(rollout(prompts, tr)) or rollouts[-1]
    spy = Spy(trainer)
    trainer.train()
    return trainer, spy, rollouts, anchor


def _turns(trainer, ids, mask):
    """The first and the last reply of a two-turn completion, and the observation between them, as text."""
    zeros = [k for k, m in enumerate(mask) if m == 0]
    assert zeros, "a two-turn completion carries one observation"
    decode = lambda t: trainer.processing_class.decode(t, skip_special_tokens=True)  # noqa: E731
    return decode(ids[: zeros[0]]), decode(ids[zeros[-1] + 1 :]), decode(ids[zeros[0] : zeros[-1] + 1])


@pytest.mark.parametrize("preset", [None, "wmrl_groups"], ids=["rollouts", "groups"])
def test_k_turn_trajectories_run_in_the_shadow_and_land_a_step_later(tmp_path, preset):
    from wmrl.core.advantages import group_advantages

    trainer, spy, rollouts, anchor = _train(tmp_path, preset, late_update="correction")
    assert len(rollouts) == 3 and len(spy.outputs) == 3
    executed_total = 0
    pairs = []  # (world model, real) of each executed trajectory: both graded its last reply
    for t in (0, 1):  # shadow steps: the world model's feedback for every row, nothing real yet
        out = rollouts[t]
        assert all(v is None for v in out["wmrl_real"]), "a shadow rollout executed something"
        for i in range(OWN):
            first, last, seen = _turns(trainer, out["completion_ids"][i], out["env_mask"][i])
            assert f"score {wm_formula(first):.2f}" in seen, (
                f"row {i} was not shown the world model's feedback"
            )
            assert out["wmrl_wm"][i] == pytest.approx(wm_formula(last))  # TextEpisode: the last turn counts
        plan, _, real_then, _, corr = spy.corrections[t]
        assert np.isnan(real_then).all(), "a batch in flight trained without its real scores"
        executed = plan.execute_mask(GROUP).reshape(-1)
        assert executed.any()
        executed_total += int(executed.sum())
        # one step later: the executed trajectories' real reward (the last reply's), their late advantages
        landed = np.full(OWN, np.nan)
        for i in np.flatnonzero(executed):
            _, last, _ = _turns(trainer, out["completion_ids"][i], out["env_mask"][i])
            landed[i] = real_formula(last)
            pairs.append((wm_formula(last), real_formula(last)))
        landed = landed.reshape(-1, GROUP)
        rewards = np.where(np.isnan(landed), corr.rewards, landed)
        expected = group_advantages(rewards, None, trainer.corrector.config.advantages).advantages
        expected = expected - np.nan_to_num(corr.advantages)
        changed = executed.reshape(-1, GROUP).any(axis=1)
        later = spy.outputs[t + 1]
        assert later["advantages"].shape[0] == OWN + GROUP * changed.sum()
        got, want = later["advantages"][OWN:].numpy(), expected[changed].reshape(-1)
        if preset is None:
            np.testing.assert_allclose(got, want, atol=1e-5)
        else:  # a whole anchor group trained nothing in flight; it lands with its fusion weight (> 0)
            assert np.isnan(corr.advantages[plan.anchor]).all()
            scale = got[np.abs(want) > 1e-9] / want[np.abs(want) > 1e-9]
            assert scale.size and (scale > 0).all() and np.allclose(scale, scale[0], rtol=1e-4)
        kept = spy.outputs[t]["completion_ids"][:OWN][np.repeat(changed, GROUP)]
        assert (later["completion_ids"][OWN:, : kept.shape[1]] == kept).all()
    # the draining step runs synchronously: its executed rows were shown the real feedback
    out = rollouts[2]
    real_rows = [i for i in range(OWN) if out["wmrl_real"][i] is not None]
    assert real_rows
    for i in real_rows:
        first, last, seen = _turns(trainer, out["completion_ids"][i], out["env_mask"][i])
        assert f"score {real_formula(first):.2f}" in seen
        assert out["wmrl_real"][i] == pytest.approx(real_formula(last))
        pairs.append((wm_formula(last), real_formula(last)))
    executed_total += len(real_rows)
    debiaser = trainer.corrector.debiaser
    stored = sorted(zip(debiaser._x.round(9).tolist(), debiaser._y.round(9).tolist(), strict=True))
    assert stored == sorted((round(w, 9), round(r, 9)) for w, r in pairs), (
        "a pair grades one trajectory twice"
    )
    assert len(anchor.items) == 2 * executed_total, "every turn of every executed trajectory runs once"
    assert not trainer.pipeline.in_flight.pending
    logged = trainer.state.log_history[1]
    assert logged["async/landed_executions"] > 0 and logged["async/lag_mean"] == 1.0


def test_the_default_late_update_retrains_the_executed_trajectories(tmp_path):
    _, spy, _, _ = _train(tmp_path, steps=2)
    executed = spy.corrections[0][0].execute_mask(GROUP).reshape(-1)
    later = spy.outputs[1]
    assert later["advantages"].shape[0] == OWN + executed.sum()
    before = spy.outputs[0]["completion_ids"][:OWN][executed]
    assert (later["completion_ids"][OWN:, : before.shape[1]] == before).all()
    # the kept rows keep their observation mask: feedback tokens stay out of the late loss
    kept_mask = spy.outputs[0]["tool_mask"][:OWN][executed]
    assert (later["tool_mask"][OWN:, : kept_mask.shape[1]] == kept_mask).all()
    assert (kept_mask == 0).any()


def test_a_k_turn_run_of_lag_zero_trains_as_before(tmp_path):
    runs = []
    for name, changes in (("sync", None), ("lag0", _async(0))):
        wm = FeedbackSource(wm_formula, "world_model", "wm")
        anchor = FeedbackSource(real_formula, "anchor", "real")
        trainer, _, _ = make_trainer(
            tmp_path / name,
            "wmrl",
            preset_changes=changes,
            args=grpo_args(tmp_path / name, steps=2),
            world_model=wm,
            anchor=anchor,
            episodes=TextEpisode,
            turns=2,
        )
        spy = Spy(trainer)
        trainer.train()
        runs.append([o["advantages"].numpy().tolist() for o in spy.outputs])
    assert runs[0] == runs[1]


def test_asynchronous_k_turn_needs_a_world_model(tmp_path):
    with pytest.raises(ValueError, match="mode 'real' has no world model"):
        make_trainer(
            tmp_path,
            "real",
            preset_changes=_async(1),
            world_model=FeedbackSource(wm_formula, "world_model", "wm"),
            anchor=FeedbackSource(real_formula, "anchor", "real"),
            episodes=TextEpisode,
            turns=2,
        )


def test_a_shadow_rollouts_trajectories_execute_in_one_batch_and_aggregate_their_turns():
    from wmrl.core.engines.trl.multiturn import execute_trajectories
    from wmrl.core.pipeline import RewardPipeline

    class Best:
        def aggregate(self, rewards):
            known = [r for r in rewards if r is not None]
            return max(known) if known else None

    anchor = FeedbackSource(real_formula, "anchor", "real")
    pipeline = RewardPipeline(FeedbackSource(wm_formula, "world_model", "wm"), anchor, mode="wmrl")
    turns = [["a", "bbb", "cc"], ["dddd", "e", "ffffff"]]
    out = execute_trajectories(pipeline, turns, [Best(), Best(), Best()], np.array([True, False, True]))
    assert anchor.calls == 1, "every turn of every chosen trajectory goes to the sandbox in one batch"
    assert sorted(anchor.items) == sorted(["a", "cc", "dddd", "ffffff"])
    expected = [
        max(real_formula("a"), real_formula("dddd")),
        np.nan,
        max(real_formula("cc"), real_formula("ffffff")),
    ]
    np.testing.assert_array_equal(out.real, expected)
    assert np.isnan(out.real_repeat).all() and out.statuses == ["graded"] * 4 and len(out.real_grades) == 4
    with pytest.raises(ValueError, match="one episode and one item per turn"):
        execute_trajectories(pipeline, [["a", "b"]], [Best()] * 3, np.ones(3, dtype=bool))


@pytest.mark.parametrize("turns", [0, -1, 1.5, True])
def test_a_turn_context_without_a_turn_is_refused(turns):
    from wmrl.core.engines.trl.multiturn import TurnContext

    with pytest.raises(ValueError, match="turns must be an integer >= 1"):
        TurnContext(
            rows=[],
            anchor=None,
            pipeline=None,
            item_fn=lambda text, row: text,
            episodes=None,
            turns=turns,
            tokenizer=None,
            template_kwargs={},
            generate=lambda contexts, cap: [],
            max_new_tokens=8,
            stop_token_ids=set(),
            seconds=lambda spent: None,
        )
