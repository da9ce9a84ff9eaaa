"""WMRLGRPOTrainer on TRL 1.16 with a tiny model: the corrector decides rewards and advantages.

The mechanics tests score completions with closed-form reward sources (a function of the
completion text), so every number the corrector sees can be recomputed by hand and the corrector
can be replayed from scratch: the advantages TRL trains on must be exactly the replayed
corrector's. The real-source tests (marked ``bwrap``) use the real sandbox and the real world
model over a tiny policy taught to write four kinds of scripts (see ``tiny_coder``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cpu_grpo import cpu_grpo_config

pytestmark = [pytest.mark.trl]


def grpo_args(tmp_path, prompts_per_step=2, group=2, steps=2, max_len=12, **extra):
    values = {
        "per_device_train_batch_size": prompts_per_step * group,
        "num_generations": group,
        "max_completion_length": max_len,
        "max_steps": steps,
        "save_strategy": "no",
        "seed": 0,
        "temperature": 1.0,
        "learning_rate": 1e-3,
    }
    values.update(extra)
    return cpu_grpo_config(tmp_path / "out", **values)


def prompt_dataset(n_prompts=4, tasks=("a", "b")):
    from datasets import Dataset

    rows = []
    for k in range(n_prompts):
        task = tasks[k % len(tasks)]
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"Solve task {task}, variant {k}."}],
                "prompt_id": f"{task}-{k}",
                "task_id": task,
                "task_ref": task,
            }
        )
    return Dataset.from_list(rows)


def text_item(text, row):
    return text


def wm_formula(text):
    return (len(text) % 7) / 7


def real_formula(text):
    return ((3 * len(text)) % 5) / 4


class Counting:
    """A closed-form reward source that remembers what it graded."""

    def __init__(self, fn, role, name):
        self.fn, self.role, self.name = fn, role, name
        self.calls, self.items = 0, []

    def score(self, items):
        self.calls += 1
        self.items.extend(items)
        return [self.fn(t) for t in items]


class Spy:
    """Records every corrector.correct call (inputs and the correction) and every batch's output."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.corrections = []
        self.outputs = []
        correct = trainer.corrector.correct
        generate = trainer._generate_and_score_completions

        def spy_correct(plan, wm, real, var=None, **extra):
            result = correct(plan, wm, real, var, **extra)
            self.corrections.append(
                (plan, np.array(wm), np.array(real), None if var is None else np.array(var), result)
            )
            return result

        def spy_generate(inputs):
            out = generate(inputs)
            self.outputs.append(dict(out.items()))
            return out

        trainer.corrector.correct = spy_correct
        trainer._generate_and_score_completions = spy_generate


def make_trainer(tmp_path, mode, preset_changes=None, preset=None, **kwargs):
    from wmrl.autoresearch.llm.tiny import build_tiny_model
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.fusion import FusionConfig

    base = CorrectorConfig(debias=DebiasConfig(min_pairs=2), fusion=FusionConfig(min_groups=1))
    corrector = Corrector(CorrectorConfig.preset(preset or mode, base=base, **(preset_changes or {})))
    model, tokenizer = build_tiny_model()
    wm = kwargs.pop("world_model", None) or Counting(wm_formula, "world_model", "wm")
    anchor = kwargs.pop("anchor", None) or Counting(real_formula, "anchor", "real")
    trainer = WMRLGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=kwargs.pop("args", None) or grpo_args(tmp_path),
        train_dataset=kwargs.pop("dataset", None) or prompt_dataset(),
        corrector=corrector,
        mode=mode,
        world_model=wm,
        anchor=anchor,
        item_fn=text_item,
        **kwargs,
    )
    return trainer, wm, anchor


@pytest.mark.parametrize(
    ("mode", "preset"),
    [("real", None), ("world_model", None), ("wmrl", "wmrl_groups"), ("wmrl", None)],
    ids=["real", "world_model", "wmrl_groups", "wmrl"],
)
def test_two_steps_use_the_correctors_rewards_and_advantages(tmp_path, mode, preset):
    from wmrl.core.corrector import METRICS, Corrector

    trainer, wm, anchor = make_trainer(tmp_path, mode, preset=preset)
    groups = preset == "wmrl_groups"  # whole anchor groups; the default executes single rollouts
    spy = Spy(trainer)
    trainer.train()
    assert len(spy.corrections) == 2 and len(spy.outputs) == 2

    # 1. the streams were called as the mode says
    if mode == "real":
        assert wm.calls == 0, "real mode must never call the world model"
    else:
        assert wm.calls == 2
    if mode == "world_model":
        assert anchor.calls == 0, "world_model mode must never execute"
    else:
        assert anchor.calls == 2

    replay = Corrector(trainer.corrector.config)
    for (plan, wm_m, real_m, var, correction), output in zip(spy.corrections, spy.outputs, strict=True):
        # 2. what the corrector saw is the closed form of the graded completions
        graded = np.flatnonzero(~np.isnan(real_m).ravel())
        assert (real_m.ravel()[graded] == [real_formula(t) for t in anchor.items[: len(graded)]]).all()
        del anchor.items[: len(graded)]
        if mode == "real":
            assert np.isnan(wm_m).all()
            assert plan.anchor.all()
        else:
            assert np.allclose(wm_m.ravel(), [wm_formula(t) for t in wm.items[: wm_m.size]])
            del wm.items[: wm_m.size]
        if mode == "world_model":
            assert not plan.anchor.any() and np.isnan(real_m).all()
        if mode == "wmrl" and groups:
            assert plan.anchor.sum() == 1  # the floor: one anchor group of two
        elif mode == "wmrl":
            # per-rollout anchors: no whole group; in each group the best-scored solution not yet
            # known is executed (half of a group of 2), and what was executed is what is real
            executed = plan.execute_mask(real_m.shape[1])
            assert not plan.anchor.any() and executed.sum(axis=1).max() == 1
            known = plan.known if plan.known is not None else np.zeros_like(executed)
            assert np.array_equal(~np.isnan(real_m), executed | known)
            for g in np.flatnonzero(executed.any(axis=1)):
                candidates = np.where(known[g], -np.inf, wm_m[g])
                assert wm_m[g][executed[g]].item() == np.nanmax(candidates)
        # 3. replaying the corrector from scratch gives the same correction, bit for bit (a group
        # plan depends on the keys alone; a per-rollout plan on the scores too, so it is replayed)
        replayed = replay.plan(plan.group_keys, plan.task_keys) if mode != "wmrl" or groups else plan
        again = replay.correct(replayed, wm_m, real_m, var)
        assert np.array_equal(again.advantages, correction.advantages, equal_nan=True)
        # 4. the advantages TRL trains on are the corrector's (NaN -> 0), weights included
        used = output["advantages"].numpy()
        assert np.allclose(used, np.nan_to_num(correction.advantages.ravel(), nan=0.0), atol=1e-6)
    # 5. the corrector's metrics reach TRL's logs (non-None ones only, never as 0 for unknown)
    logged = trainer.state.log_history[0]
    assert logged["wmrl/step"] == 1.0
    expected_fraction = {"real": 1.0, "world_model": 0.0, "wmrl": 0.5 if groups else 0.0}[mode]
    assert logged["wmrl/anchor_fraction"] == expected_fraction  # whole anchor groups / groups
    if mode == "wmrl" and not groups:  # the single executions are counted apart
        first_plan = spy.corrections[0][0]
        assert logged["wmrl/executions"] == first_plan.execute_mask(2).sum() > 0
    assert {k for k in logged if k.startswith("wmrl/")} <= set(METRICS)
    if mode == "real":
        assert "wmrl/unknown_world_model" not in logged
    # shares of the real executions' statuses (closed-form sources report none: "unknown")
    shares = {k: v for k, v in logged.items() if k.startswith("anchor_status/")}
    if mode == "world_model":
        assert not shares
    else:
        assert shares["anchor_status/unknown"] == 1.0 and sum(shares.values()) == 1.0


def test_fusion_weights_multiply_advantages_not_rewards(tmp_path):
    """Once fusion weights depart from 1, the advantages used are weights x group advantages of the
    calibrated rewards; the rewards returned to TRL are unweighted."""
    from wmrl.core.advantages import group_advantages

    # group anchors: weights depart from 1 per group (the per-rollout default weights rollouts)
    trainer, _, _ = make_trainer(tmp_path, "wmrl", preset="wmrl_groups", args=grpo_args(tmp_path, steps=3))
    spy = Spy(trainer)
    trainer.train()
    weighted = 0
    for _plan, _wm, _real, _var, correction in spy.corrections:
        plain = group_advantages(correction.rewards, None, trainer.corrector.config.advantages)
        expected = plain.advantages * correction.weights[:, None]
        assert np.array_equal(expected, correction.advantages, equal_nan=True)
        weighted += int(np.any(np.abs(correction.weights[plain.contributes] - 1) > 1e-9))
    assert weighted >= 1, "the fusion never weighted the streams; the test cannot see where weights go"
    # TRL's reward metric is the mean corrected (unweighted) reward of the last batch
    last = spy.corrections[-1][-1]
    assert math.isclose(trainer.state.log_history[2]["reward"], float(np.nanmean(last.rewards)), rel_tol=1e-5)


def test_unknown_rewards_get_no_gradient(tmp_path):
    """A world-model score of None is unknown: masked out of the loss, not scored 0."""
    from wmrl.autoresearch.llm.tiny import build_tiny_model
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer

    model, tokenizer = build_tiny_model()
    wm = Counting(lambda t: None if len(t) % 2 else wm_formula(t), "world_model", "wm")
    trainer = WMRLGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=grpo_args(tmp_path, steps=1),
        train_dataset=prompt_dataset(),
        corrector=Corrector(CorrectorConfig.preset("world_model")),
        mode="world_model",
        world_model=wm,
        item_fn=text_item,
    )
    spy = Spy(trainer)
    trainer.train()
    correction = spy.corrections[0][-1]
    output = spy.outputs[0]
    unknown = np.isnan(correction.advantages.ravel())
    assert unknown.any(), "no unknown score in the batch; the test needs one"
    loss_mask = (output["completion_mask"] * output["tool_mask"]).numpy()
    assert (loss_mask[unknown] == 0).all() and (loss_mask[~unknown].sum(axis=1) > 0).all()
    assert int(output["num_items_in_batch"]) == int(loss_mask.sum())
    assert (output["advantages"].numpy()[unknown] == 0).all()


def test_rejects_normalize_then_sum_and_bad_modes(tmp_path):
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.modes import check_mode

    with pytest.raises(ValueError, match="normalize_then_sum"):
        make_trainer(
            tmp_path, "wmrl", args=grpo_args(tmp_path, multi_objective_aggregation="normalize_then_sum")
        )
    # TRL accepts None, which its loss normalisation and every reply cap would then divide or cap by
    with pytest.raises(ValueError, match="max_completion_length must be an integer"):
        make_trainer(tmp_path, "wmrl", args=grpo_args(tmp_path, max_completion_length=None))
    with pytest.raises(ValueError, match="executes every group"):
        check_mode("real", Corrector(CorrectorConfig()))
    with pytest.raises(ValueError, match="world_model"):
        check_mode("world_model", Corrector(CorrectorConfig()))
    with pytest.raises(ValueError, match="mode 'world_model'"):
        check_mode("wmrl", Corrector(CorrectorConfig.preset("world_model")))
    with pytest.raises(ValueError, match="one of"):
        check_mode("both", Corrector(CorrectorConfig()))
    with pytest.raises(ValueError, match="anchor"):
        WMRLGRPOTrainer(
            model=None,
            args=grpo_args(tmp_path),
            train_dataset=prompt_dataset(),
            corrector=Corrector(CorrectorConfig.preset("real")),
            mode="real",
        )
    with pytest.raises(ValueError, match=r"prompt id|prompt_id"):
        make_trainer(tmp_path, "wmrl", dataset=prompt_dataset().remove_columns("prompt_id"))


def test_generation_prefills_each_groups_prompt_once(tmp_path, monkeypatch):
    """TRL hands generation each prompt once per rollout; the trainer encodes it once per group and
    still returns one completion per rollout, each through its first stop token."""
    import wmrl.core.engines.trl.trainer as trainer_module

    calls = []
    real = trainer_module.generate_shared

    def counting(model, prompts, n, pad_id, **kwargs):
        out = real(model, prompts, n, pad_id, **kwargs)
        calls.append((len(prompts), n, out.shape[0]))
        return out

    monkeypatch.setattr(trainer_module, "generate_shared", counting)
    trainer, _, _ = make_trainer(tmp_path, "real", args=grpo_args(tmp_path, prompts_per_step=2, group=3))
    spy = Spy(trainer)
    trainer.train()
    assert calls == [(2, 3, 6), (2, 3, 6)]  # 2 prompts of 3 rollouts, 2 steps
    stops = set(trainer.eos_token_ids)
    for output in spy.outputs:
        ids, mask = output["completion_ids"], output["completion_mask"]
        assert ids.shape[0] == 6
        for row, keep in zip(ids.tolist(), mask.tolist(), strict=True):
            kept = [t for t, m in zip(row, keep, strict=True) if m]
            assert kept and all(t not in stops for t in kept[:-1])  # nothing kept after a stop token
