"""The corrector's state (and the cost ledger) live in every checkpoint and come back on resume.

A run of three steps is compared with a run resumed from its second checkpoint: the resumed
run's corrector state after step three must equal the uninterrupted run's exactly (the calibration
window, the fusion estimates, the scheduler's counters: every value, bit for bit).
"""

from __future__ import annotations

import json

import pytest
from cpu_grpo import cpu_grpo_config

pytestmark = [pytest.mark.trl]


def _trainer(tmp_path, out, steps=3, lag=0, turns=1, save_steps=1):
    from datasets import Dataset

    from wmrl.autoresearch.llm.tiny import build_tiny_model
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.fusion import FusionConfig
    from wmrl.core.sources import as_source

    # Six prompts, two per step: all three steps lie in one epoch of TRL's sampler, whose order a
    # resumed run reproduces (TRL's RepeatSampler has no set_epoch, so later epochs would reshuffle).
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Task {k}."}],
            "prompt_id": f"p{k}",
            "task_id": "ab"[k % 2],
            "task_ref": "ab"[k % 2],
        }
        for k in range(2 * steps)
    ]
    model, tokenizer = build_tiny_model(seed=0)
    from wmrl.core.late import AsynchronyConfig

    config = CorrectorConfig(
        debias=DebiasConfig(min_pairs=2),
        fusion=FusionConfig(min_groups=1),
        asynchrony=AsynchronyConfig(max_anchor_lag=lag),
    )
    world_model = as_source(lambda items: [(len(t) % 7) / 7 for t in items], "world_model", "wm")
    anchor = as_source(lambda items: [((3 * len(t)) % 5) / 4 for t in items], "anchor", "real")
    multi_turn = {}
    if turns > 1:
        from vllm_grpo_worker import FeedbackSource, TextEpisode

        world_model = FeedbackSource(lambda t: (len(t) % 7) / 7, "world_model", "wm")
        anchor = FeedbackSource(lambda t: ((3 * len(t)) % 5) / 4, "anchor", "real")
        multi_turn = {"episodes": TextEpisode, "turns": turns}
    return WMRLGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=cpu_grpo_config(
            out,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=10,
            max_steps=steps,
            save_strategy="steps",
            save_steps=save_steps,
            seed=0,
            learning_rate=1e-2,
        ),
        train_dataset=Dataset.from_list(rows),
        corrector=Corrector(CorrectorConfig.preset("wmrl", base=config)),
        mode="wmrl",
        world_model=world_model,
        anchor=anchor,
        item_fn=lambda text, row: text,
        solution_key=lambda text: text,  # the execution memory keeps outcomes by the completion's text
        **multi_turn,
    )


def _state(corrector) -> str:
    from wmrl.core.corrector import _jsonable

    return json.dumps(_jsonable(corrector.state_dict()), sort_keys=True)


def test_resume_restores_the_corrector_exactly(tmp_path):
    from wmrl.core.corrector import Corrector
    from wmrl.core.pipeline import CORRECTOR_FILE, LEDGER_FILE

    full = _trainer(tmp_path, tmp_path / "full")
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert (checkpoint / CORRECTOR_FILE).is_file() and (checkpoint / LEDGER_FILE).is_file()
    for step in (1, 2, 3):  # every checkpoint holds the corrector as it was at that step
        saved = Corrector.load(tmp_path / "full" / f"checkpoint-{step}" / CORRECTOR_FILE)
        assert saved.step_count == step
    assert _state(Corrector.load(tmp_path / "full" / "checkpoint-3" / CORRECTOR_FILE)) == _state(
        full.corrector
    )
    # the state is not trivial: calibration pairs, the fusion's evidence (per-rollout pairs by default,
    # whole anchor groups in the group design) and the execution memory
    fusion = full.corrector.fusion
    assert full.corrector.debiaser.n_pairs > 0 and (fusion.groups_measured > 0 or fusion.gain.p_n > 0)
    assert full.corrector.memory is None or len(full.corrector.memory) > 0

    resumed = _trainer(tmp_path, tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.corrector.step_count == 3
    assert _state(resumed.corrector) == _state(full.corrector)
    # the ledger came back too: the resumed run's rollouts count continues from the checkpoint's
    assert resumed.ledger.graded_rollouts == full.ledger.graded_rollouts == 12


@pytest.mark.parametrize("turns", [1, 2], ids=["single-turn", "k-turn"])
def test_an_asynchronous_run_resumed_from_its_checkpoint_continues_exactly(tmp_path, turns):
    """Asynchronous anchors (lag 1), a checkpoint every 2 steps: the steps between checkpoints hold
    executions in flight, the checkpointing ones drain them. Resumed from checkpoint 2 (what a
    ``kill -9`` at step 3, its executions in flight, leaves), the run ends in the state of the run that
    was never stopped."""
    full = _trainer(tmp_path, tmp_path / "full", steps=4, lag=1, turns=turns, save_steps=2)
    in_flight = []
    submit = full.pipeline.in_flight.submit
    full.pipeline.in_flight.submit = lambda work: in_flight.append(full.state.global_step) or submit(work)
    full.train()
    assert in_flight == [0, 2], "steps 1 and 3 hold executions in flight; steps 2 and 4 drain"
    assert not full.pipeline.in_flight.pending
    resumed = _trainer(tmp_path, tmp_path / "resumed", steps=4, lag=1, turns=turns, save_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed.corrector.step_count == 4
    assert _state(resumed.corrector) == _state(full.corrector)
    assert full.corrector.debiaser.n_pairs > 0
    assert resumed.ledger.graded_rollouts == full.ledger.graded_rollouts == 16


def test_restoring_refuses_a_different_corrector_or_a_foreign_checkpoint(tmp_path):
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.pipeline import CORRECTOR_FILE

    trainer = _trainer(tmp_path, tmp_path / "a", steps=1)
    trainer.train()
    folder = tmp_path / "a" / "checkpoint-1"
    Corrector(CorrectorConfig(seed=7)).save(folder / CORRECTOR_FILE)
    with pytest.raises(ValueError, match="configured differently"):
        trainer.load_wmrl_state(folder)
    (folder / CORRECTOR_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="not written by a WMRL trainer"):
        trainer.load_wmrl_state(folder)


def test_a_ledger_saved_by_several_ranks_resumes_on_one(tmp_path):
    """A checkpoint written by two ranks holds each rank's ledger; one process resuming it takes
    their sum (so the run's total cost is kept) with the accelerators it holds itself."""
    from wmrl.core.ledger import CostLedger
    from wmrl.core.pipeline import LEDGER_FILE

    trainer = _trainer(tmp_path, tmp_path / "a", steps=1)
    trainer.train()
    folder = tmp_path / "a" / "checkpoint-1"
    assert list(json.loads((folder / LEDGER_FILE).read_text())) == ["ranks"]
    ranks = []
    for anchor_s in (3.0, 5.0):
        ledger = CostLedger({"generation": 1.0, "update": 1.0, "world_model": 1.0, "anchor": 0.0})
        ledger.add("anchor", anchor_s, items=2)
        ledger.add("generation", 1.0, items=4)
        ledger.count_rollouts(4)
        ranks.append(ledger.state_dict())
    (folder / LEDGER_FILE).write_text(json.dumps({"ranks": ranks}))
    held = dict(trainer.ledger.accelerators)
    trainer.load_wmrl_state(folder)
    assert trainer.ledger.streams["anchor"].wall_s == 8.0 and trainer.ledger.streams["anchor"].items == 4
    assert trainer.ledger.graded_rollouts == 8
    assert trainer.ledger.accelerators == held  # this process's, not the two ranks' sum


def test_too_few_prompts_for_one_generation_batch_is_refused(tmp_path):
    """TRL's sampler drops an incomplete batch, so training would stop at step 0 without a word."""
    from datasets import Dataset

    from wmrl.autoresearch.llm.tiny import build_tiny_model
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.sources import as_source

    model, tokenizer = build_tiny_model(seed=0)
    rows = [{"prompt": [{"role": "user", "content": "Task."}], "prompt_id": "p0", "task_id": "a"}]
    args = cpu_grpo_config(tmp_path / "out", per_device_train_batch_size=4, num_generations=2)
    with pytest.raises(ValueError, match=r"needs 2 distinct prompts.*has 1"):
        WMRLGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            args=args,
            train_dataset=Dataset.from_list(rows),
            corrector=Corrector(CorrectorConfig()),
            world_model=as_source(lambda items: [0.5] * len(items), "world_model", "wm"),
            anchor=as_source(lambda items: [0.5] * len(items), "anchor", "real"),
        )
