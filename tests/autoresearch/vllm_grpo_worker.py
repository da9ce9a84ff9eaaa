"""GRPO through TRL's vLLM integration (colocate) on CPU, with the fake vLLM of ``tests/fakes``.

Run by ``test_vllm_wiring.py`` in a subprocess whose ``PYTHONPATH`` starts with ``tests/fakes``, so
that TRL finds "vLLM 0.30.0" and runs its real ``VLLMGeneration`` (colocate: ``vllm.LLM`` in
process, weights pushed with ``load_weights`` every step) against the fake's interface. Trains
2 steps single-turn and 2 steps with K=2 turns, then writes what it saw to ``OUT/vllm.json``.

Usage: ``python vllm_grpo_worker.py OUT``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_training_trainer import (
    Counting,
    Spy,
    grpo_args,
    prompt_dataset,
    real_formula,
    text_item,
    wm_formula,
)

from wmrl.core.rollouts import RolloutNeeds
from wmrl.core.sources import Grade


class FeedbackSource(Counting):
    """A closed-form source that also says what the policy sees next (K-turn episodes need it)."""

    needs = RolloutNeeds(text=True, feedback=True)

    def grade(self, items):
        return [Grade(v, status="graded", feedback=f"score {v:.2f}") for v in self.score(items)]


class TextEpisode:
    """K-turn episode over text: the reward is the last turn's; the next message shows the feedback."""

    def __init__(self, prompt, row):
        self.rewards = []

    def add_reply(self, text):
        return text

    def add_outcome(self, reward, feedback, status):
        self.rewards.append(reward)
        return f"feedback: {feedback}. try again." if len(self.rewards) < 2 else None

    def reward(self):
        return self.rewards[-1]

    def aggregate(self, rewards):
        return rewards[-1]


def train(out: Path, turns: int) -> dict:
    import vllm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.core.corrector import CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.fusion import FusionConfig

    folder = save_tiny_model(out / f"policy-{turns}")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    args = grpo_args(
        out / f"run-{turns}",
        max_len=10,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
    )
    source = FeedbackSource if turns > 1 else Counting
    wm, anchor = source(wm_formula, "world_model", "wm"), source(real_formula, "anchor", "real")
    pushed = []
    trainer = WMRLGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=prompt_dataset(),
        corrector=CorrectorConfig(debias=DebiasConfig(min_pairs=2), fusion=FusionConfig(min_groups=1)),
        mode="wmrl",
        world_model=wm,
        anchor=anchor,
        item_fn=text_item,
        episodes=TextEpisode if turns > 1 else None,
        turns=turns,
    )
    llm = vllm.INSTANCES[-1]
    load = llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights

    def counting_load(weights):
        weights = list(weights)
        pushed.append(len(weights))
        return load(weights)

    llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights = counting_load
    outputs = []
    original = trainer._generate_and_score_completions

    def spy_output(inputs):
        result = original(inputs)
        outputs.append(
            {
                "completion_ids": result["completion_ids"].tolist(),
                "advantages": result["advantages"].tolist(),
                "completion_mask": result["completion_mask"].tolist(),
                "tool_mask": result["tool_mask"].tolist() if result.get("tool_mask") is not None else None,
                "sampling_logps": result["sampling_per_token_logps"].tolist()
                if result.get("sampling_per_token_logps") is not None
                else None,
            }
        )
        return result

    trainer._generate_and_score_completions = spy_output
    spy = Spy(trainer)
    trainer.train()
    return {
        "turns": turns,
        "engine_kwargs": {k: str(v) for k, v in llm.engine_kwargs.items()},
        "model_path": llm.model_path,
        "generated": [list(map(int, g)) for g in llm.generated],
        "weight_pushes": pushed,
        "parameters": len(list(trainer.model.named_parameters())),
        "steps": len(spy.corrections),
        "outputs": outputs,
        "log_keys": sorted({k for h in trainer.state.log_history for k in h}),
    }


def main(out: Path) -> None:
    from wmrl.core.distributed import close_process_group

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        # TRL's colocate mode sets RANK/WORLD_SIZE/MASTER_ADDR for vLLM, so the second trainer's
        # Accelerate opens a (gloo) process group; left open, its threads can abort the interpreter
        # at exit ("terminate called without an active exception"), as run_training avoids too.
        results = [train(out, 1), train(out, 2)]
    finally:
        close_process_group()
    (out / "vllm.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
