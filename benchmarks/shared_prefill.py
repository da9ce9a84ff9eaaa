"""What the CPU GRPO step saves by not encoding shared prompt prefixes twice, side by side in one run.

Three measurements on SmolLM2-135M-Instruct (the embedded model, fp32, this machine's threads), each
the same work done both ways, alternating which goes first over the rounds so load drift hits both:

* ``world_model``: status-probability scoring of the warm-start corpus's scripts of one task, with
  the backend reusing the previous prompt's key/value cache for their common prefix (the world
  model's instructions and the task overview) against a fresh prefill per script.
* ``generation``: G samples of one GRPO prompt (the script action's, ~1,250 tokens) with one
  prefill per group (:mod:`wmrl.core.engines.trl.shared_prefill`) against TRL's path (the prompt
  encoded G times); a fixed reply length (``min_new_tokens``) so both decode the same tokens.
* ``update``: one LoRA forward + backward of G rollouts with adapters in every layer against
  ``lora.last_layers=8`` (the backward pass stops below the last 8 of 30 layers).

Usage::

    python benchmarks/shared_prefill.py --rounds 2 --json /tmp/shared_prefill.json

Prints one JSON object: seconds per way and round, and the ratios (old / new).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from pathlib import Path


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _alternate(ways: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each way per round, the order flipped every round."""
    names = list(ways)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(_timed(ways[name]))
    return out


def world_model(loaded, task, scripts: list[str], rounds: int) -> dict[str, list[float]]:
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.overview import OverviewConfig, from_task
    from wmrl.autoresearch.llm import TransformersBackend
    from wmrl.autoresearch.training.builders import AGENT_LIBRARIES
    from wmrl.autoresearch.worldmodel.prompts import ASSISTANT_PREFIX, build_messages

    env = SandboxEnvironment.from_task(task, libraries=AGENT_LIBRARIES)
    overview = from_task(
        task, environment=env, config=OverviewConfig(max_tokens=400), tokens=loaded.tokenizer
    )
    prompts = [build_messages(overview, code, 4000, False) for code in scripts]
    candidates = ['valid"', 'runtime_error"', 'no_submission"', 'invalid_submission"', 'timeout"']

    def score(reuse: bool):
        backend = TransformersBackend(loaded.model, loaded.tokenizer)
        if not reuse:
            backend.MIN_SHARED_PREFIX = 10**9  # never reuse: a full prefill per prompt
        return lambda: [backend.score_continuations(p, ASSISTANT_PREFIX, candidates) for p in prompts]

    return _alternate({"fresh_prefill": score(False), "shared_prefix": score(True)}, rounds)


def generation(
    loaded, prompt_ids: list[int], group: int, new_tokens: int, rounds: int
) -> dict[str, list[float]]:
    import torch
    from transformers import GenerationConfig

    from wmrl.core.engines.trl.shared_prefill import generate_shared

    model, pad = loaded.model, loaded.tokenizer.pad_token_id
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=0.7,
        pad_token_id=pad,
    )

    def repeated():
        ids = torch.tensor([prompt_ids] * group)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)

    def shared():
        with torch.no_grad():
            generate_shared(model, [prompt_ids], group, pad, generation_config=config)

    return _alternate({"prompt_per_rollout": repeated, "prefill_per_group": shared}, rounds)


def update(loaded, prompt_ids: list[int], group: int, new_tokens: int, rounds: int) -> dict[str, list[float]]:
    import torch
    from peft import LoraConfig, get_peft_model

    total = loaded.model.config.num_hidden_layers
    x = torch.tensor([prompt_ids + [100] * new_tokens] * group)

    def step(layers):
        model = get_peft_model(
            copy.deepcopy(loaded.model),
            LoraConfig(
                r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], layers_to_transform=layers
            ),
        )
        model.train()

        def run():
            for row in x:  # one rollout a micro-batch, as grpo.micro_batch_size keeps memory bounded
                out = model(input_ids=row[None], logits_to_keep=new_tokens + 1)
                out.logits.float().log_softmax(-1)[..., 0].mean().backward()

        return run

    return _alternate(
        {"every_layer": step(None), "last_8_layers": step(list(range(total - 8, total)))}, rounds
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--task", default="penguin-body-mass")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="rollouts per GRPO group (G)")
    parser.add_argument(
        "--new-tokens", type=int, default=128, help="reply length of the generation and update"
    )
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()

    import torch

    from wmrl.autoresearch.llm.models import load_model
    from wmrl.autoresearch.tasks.suite import load_bundled
    from wmrl.autoresearch.training.builders import AGENT_LIBRARIES
    from wmrl.autoresearch.training.corpus import TaskSchema, recipes_for, render_script
    from wmrl.autoresearch.training.data import TrainingTask, build_prompt_rows

    loaded = load_model(args.model)
    task = load_bundled(args.task)
    schema = TaskSchema.from_task(task)
    scripts = [render_script(schema, r) for r in recipes_for(schema)[:6]]
    row = build_prompt_rows(
        [TrainingTask(ref=args.task, task=task)], tokens=loaded.tokenizer, libraries=AGENT_LIBRARIES
    )[0]
    text = loaded.tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    prompt_ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]

    results = {
        "world_model": world_model(loaded, task, scripts, args.rounds),
        "generation": generation(loaded, prompt_ids, args.group, args.new_tokens, args.rounds),
        "update": update(loaded, prompt_ids, args.group, args.new_tokens, args.rounds),
    }
    ratios = {}
    for name, ways in results.items():
        old, new = (statistics.median(v) for v in ways.values())
        ratios[name] = round(old / new, 2)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
        },
        "settings": {**vars(args), "prompt_tokens": len(prompt_ids), "scripts": len(scripts)},
        "seconds": {k: {w: [round(s, 2) for s in v] for w, v in ways.items()} for k, ways in results.items()},
        "speedup_old_over_new": ratios,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
