"""GRPO with the real streams: the bubblewrap sandbox executes, the world model (a frozen tiny LM,
status-probability scoring) predicts, for a tiny policy that writes real scripts.

Every anchor reward the corrector received is checked against an independent re-grading of the
same script on the same task by the real grader; the world model is checked to be silent in
``real`` mode and the sandbox in ``world_model`` mode.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_grpo import cpu_grpo_config

# ~6 s on an idle 2-core machine (teaching the tiny coder, then real executions)
pytestmark = [pytest.mark.trl, pytest.mark.bwrap]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from datasets import Dataset

    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.training.tiny_coder import train_tiny_coder

    root = tmp_path_factory.mktemp("tasks")
    tasks = {
        "toy-regression": make_toy_task(root, "toy-regression", time_limit_s=30),
        "toy-binary": make_toy_task(root, "toy-binary", kind="binary", time_limit_s=30),
    }
    rows = []
    for k in range(4):
        task_id = ("toy-regression", "toy-binary")[k % 2]
        rows.append(
            {
                # one prompt text for every task: the tiny coder learns it once (the task comes from task_ref)
                "prompt": [{"role": "user", "content": "Write a script for the task."}],
                "prompt_id": f"{task_id}-{k}",
                "task_id": task_id,
                "task_ref": str(root / task_id),
            }
        )
    prompts = [rows[0]["prompt"]]
    coder = tmp_path_factory.mktemp("coder")
    train_tiny_coder(prompts, save_to=coder)
    return {"tasks": tasks, "dataset": Dataset.from_list(rows), "coder": coder}


def sources(setup):
    from wmrl.autoresearch.grading import ExecutionGrader, ExecutionRewardSource
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.sandbox import SandboxPool, make_sandbox
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    pool = SandboxPool(make_sandbox("bwrap"), slots=2, cache="memory")
    anchor = ExecutionRewardSource(ExecutionGrader(sandbox=pool), max_workers=2)
    frozen = load_model(setup["coder"])
    wm = WorldModel(
        TransformersBackend(frozen.model, frozen.tokenizer, model_id="tiny-coder"),
        WorldModelConfig(scoring="status_probs", worked_example=False, overview_tokens=600),
        task_resolver=load_task,
    )
    return wm, anchor


class Recorder:
    """Records the items built from completions and each correction's inputs."""

    def __init__(self, trainer):
        from wmrl.autoresearch.training.streams import solution_items

        self.items, self.corrections = [], []
        make = solution_items()

        def item_fn(text, row):
            item = make(text, row)
            self.items.append(item)
            return item

        trainer.item_fn = item_fn
        correct = trainer.corrector.correct

        def spy(plan, wm, real, var=None, **extra):
            result = correct(plan, wm, real, var, **extra)
            self.corrections.append((plan, np.array(wm), np.array(real), result))
            return result

        trainer.corrector.correct = spy


@pytest.mark.parametrize("mode", ["real", "world_model", "wmrl"])
def test_grpo_with_the_sandbox_and_the_world_model(tmp_path, setup, mode):

    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.llm import load_model
    from wmrl.autoresearch.tasks import Solution, load_task
    from wmrl.autoresearch.training.builders import ANCHOR_STATUSES
    from wmrl.autoresearch.training.streams import execution_metrics
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.rollouts import Exact

    wm, anchor = sources(setup)
    executed = []
    grade_results = anchor.grade_results
    anchor.grade_results = lambda items: executed.extend(items) or grade_results(items)
    policy = load_model(setup["coder"])
    args = cpu_grpo_config(
        tmp_path / "out",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=96,
        max_steps=2,
        save_strategy="no",
        seed=0,
        temperature=1.0,
    )
    corrector = Corrector(
        CorrectorConfig.preset(mode, base=CorrectorConfig(debias=DebiasConfig(min_pairs=4)))
    )
    trainer = WMRLGRPOTrainer(
        model=policy.model,
        processing_class=policy.tokenizer,
        args=args,
        train_dataset=setup["dataset"],
        corrector=corrector,
        mode=mode,
        world_model=wm,
        anchor=anchor,
        statuses=ANCHOR_STATUSES,
        real_metrics=execution_metrics,
    )
    rec = Recorder(trainer)
    trainer.train()
    assert len(rec.corrections) == 2

    if mode == "real":
        assert wm.stats.items == 0, "real mode must not call the world model"
    else:
        assert wm.stats.items > 0
    if mode == "world_model":
        assert not executed, "world_model mode must not execute anything"
    else:
        assert executed

    # every real reward is what an independent grading of the same script gives
    regrade = ExecutionGrader(backend="bwrap")
    items = iter(rec.items)
    kinds = set()
    for plan, _wm, real, result in rec.corrections:
        # what was executed (anchor groups, single rollouts of other groups) or recalled from memory
        graded = plan.execute_mask(real.shape[1]) | (plan.known if plan.known is not None else False)
        for g in range(real.shape[0]):
            for j in range(real.shape[1]):
                item = next(items)
                kinds.add("malformed" if isinstance(item, Exact) else "script")
                if not graded[g, j]:
                    assert np.isnan(real[g, j])
                    continue
                if isinstance(item, Exact):
                    assert real[g, j] == item.value == 0.0
                    continue
                assert isinstance(item, Solution)
                expected = regrade.grade(load_task(item.task_id), item.code).reward
                assert real[g, j] == pytest.approx(expected, abs=1e-12), item.code
        assert np.all(result.rewards[plan.anchor] == real[plan.anchor])
    assert "script" in kinds, "the tiny coder wrote no script; the test graded nothing"
    if mode == "real":  # 16 executed rollouts: more than one outcome (seeded sampling)
        rewards = np.concatenate([r[p.anchor].ravel() for p, _, r, _ in rec.corrections])
        assert len(set(np.round(rewards[~np.isnan(rewards)], 6))) >= 2, "all real rewards equal: no signal"
    if mode != "world_model":  # the logged status shares are those of the executed rollouts
        logged = trainer.state.log_history[0]
        shares = {k.split("/", 1)[1]: v for k, v in logged.items() if k.startswith("anchor_status/")}
        assert sum(shares.values()) == pytest.approx(1.0) and shares["unknown"] == 0.0
        first_anchor = sum(int(p.execute_mask(4).sum()) for p, *_ in rec.corrections[:1])
        assert all(round(v * first_anchor, 6) == round(v * first_anchor) for v in shares.values())
        # the step's measured valid rate is over the same executions as the status shares
        assert logged["executed/valid_rate"] == pytest.approx(shares.get("valid", 0.0))
        assert 0.0 <= logged["executed/position"] <= logged["executed/valid_rate"]
    else:
        assert not any(k.startswith("executed/") for k in trainer.state.log_history[0])
    if mode == "wmrl":
        assert trainer.corrector.debiaser.n_pairs >= 8
        assert trainer.ledger.streams["anchor"].items > 0 and trainer.ledger.streams["world_model"].items > 0
