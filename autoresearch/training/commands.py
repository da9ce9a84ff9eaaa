"""``wmrl train autoresearch``, ``wmrl train autoresearch-sft``, ``wmrl eval autoresearch`` and ``wmrl autoresearch wm-fidelity``.

Registered from :mod:`wmrl.autoresearch.cli`. Training and evaluation take the shared flags of every
domain (:mod:`wmrl.core.cli_runs`); this module imports only the standard library at import time
(``wmrl --help`` stays fast); each handler imports what it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "register_eval",
    "register_fidelity",
    "register_train",
    "run_eval",
]

EXIT_BAD_INPUT = 2
#: ``wmrl eval autoresearch``'s record of every graded turn (reply, status, reward, feedback), one JSON line each.
TRAJECTORIES_FILE = "trajectories.jsonl"


def _fail(message: str) -> int:
    print(f"wmrl: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


# ---------------------------------------------------------------------------------------- train


def register_train(root) -> None:
    root.train(
        "autoresearch",
        "GRPO-train an LLM agent that writes ML code, graded by a world model anchored by real execution",
        config="wmrl.autoresearch.training.config:TrainConfig",
        run="wmrl.autoresearch.training.run:run_from_cli",
        default_out="runs/autoresearch-{time}",
    )
    root.train(
        "autoresearch-sft",
        "warm-start an AutoResearch agent: supervised fine-tuning (LoRA) on executed working solutions of "
        "the training tasks, the policy `wmrl train autoresearch model.path=RUN/final` starts from",
        config="wmrl.autoresearch.training.sft:WarmStartConfig",
        run="wmrl.autoresearch.training.sft:run_sft_from_cli",
        default_out="runs/autoresearch-sft-{time}",
        stage=True,  # supervised: checkpoints complete with wmrl_stage.json, not a correction's state
    )


# ---------------------------------------------------------------------------------------- eval


def register_eval(root) -> None:
    root.evaluate(
        "autoresearch",
        "evaluate a policy on held-out AutoResearch tasks: valid rate and avg@k leaderboard position",
        config="wmrl.autoresearch.evaluation.config:EvalConfig",
        run="wmrl.autoresearch.training.commands:run_eval",
        default_out="runs/eval-autoresearch-{time}",
        shorthands={
            "--model": (
                "model",
                "the policy: a run's final/ folder, a Hugging Face folder, a .gguf file, or 'smollm2'",
            ),
            "--tasks": ("tasks", "'eval' (the bundled held-out tasks), or comma-separated task references"),
            "--samples": ("samples", "rollouts per task (avg@k)"),
            "--train-tasks": ("train_tasks", "comma-separated tasks the policy was trained on"),
            "--max-new-tokens": ("max_new_tokens", "generated tokens per rollout"),
            "--overview-tokens": ("overview_tokens", "token budget of the task overview in the prompt"),
            "--temperature": ("temperature", "sampling temperature"),
            "--backend": ("sandbox.backend", "sandbox backend: bwrap, docker, subprocess or auto"),
            "--time-limit": ("sandbox.time_limit_s", "seconds per execution"),
            "--seeds": ("seeds", "sampling seeds, e.g. [0,1,2] (mean ± SEM over seeds)"),
            "--turns": ("turns", "execution turns with feedback per trajectory (K)"),
            "--action": ("action", "what the policy writes, as in training: script or model (tasks.action)"),
            "--device": ("device", "cpu, cuda or auto"),
            "--in-sample": ("in_sample", "evaluate on training tasks on purpose (labelled in-sample)", True),
            "--mledojo-root": ("mledojo_root", "an MLE-Dojo checkout: leaderboards for DSBench tasks"),
        },
    )


def run_eval(config, out: Path, *, resume: bool, progress: bool) -> tuple[dict[str, Any], list[str]]:
    """``wmrl eval autoresearch``: evaluate, write ``OUT/config.json`` and ``OUT/eval_report.json``."""
    from wmrl.autoresearch.evaluation.run import EvalError, evaluate_policy
    from wmrl.core.config import to_dict
    from wmrl.core.errors import Interrupted, UserError
    from wmrl.core.runlog import write_json_atomic

    if resume:
        raise UserError(
            "wmrl eval autoresearch does not continue an interrupted evaluation; run it again (it is a few "
            "samples per task)"
        )
    device = config.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    opened: list = []  # the trajectories file, opened at the first graded turn (a refused run writes nothing)
    recorded = [0]  # turns written and flushed

    def record(turn: dict[str, Any]) -> None:  # each turn as it is graded: nothing lost if it stops
        if not opened:
            out.mkdir(parents=True, exist_ok=True)
            opened.append((out / TRAJECTORIES_FILE).open("w", encoding="utf-8"))
        opened[0].write(json.dumps(turn) + "\n")
        opened[0].flush()
        recorded[0] += 1

    try:
        report = evaluate_policy(
            config.model,
            tasks=config.tasks,
            samples=config.samples,
            seeds=config.seeds,
            turns=config.turns,
            train_tasks=config.train_tasks or None,
            in_sample=config.in_sample,
            max_new_tokens=config.max_new_tokens,
            overview_tokens=config.overview_tokens,
            action=config.action,
            feedback_max_tokens=config.feedback_max_tokens,
            temperature=config.temperature,
            backend=config.sandbox.backend,
            time_limit_s=config.sandbox.time_limit_s,
            memory_limit_mb=config.sandbox.memory_limit_mb,
            workers=config.sandbox.workers,
            gpus=config.sandbox.gpus,
            gpus_per_slot=config.sandbox.gpus_per_slot,
            mledojo_root=config.mledojo_root,
            data_dir=config.data_dir,
            batch_size=config.batch_size,
            device=device,
            progress=progress,
            record=record,
        )
    except EvalError as err:
        raise UserError(str(err)) from None
    except KeyboardInterrupt:
        # The turns graded so far are on disk; the report needs every trajectory, so there is none,
        # and (unlike training) an evaluation does not continue: say exactly that.
        where = f"kept in {out / TRAJECTORIES_FILE}" if opened else "nothing was written"
        raise Interrupted(
            f"interrupted after {recorded[0]} graded turn(s) ({where}); no report: run the evaluation again"
        ) from None
    finally:
        for file in opened:
            file.close()
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", to_dict(config))
    write_json_atomic(out / "eval_report.json", report.to_dict())
    return report.to_dict(), [
        report.format(),
        f"[wmrl] report: {out / 'eval_report.json'}; every turn: {out / TRAJECTORIES_FILE}",
    ]


# ---------------------------------------------------------------------------------------- fidelity


def register_fidelity(root, hidden: bool = False) -> None:
    sub = root.command(
        "wm-fidelity",
        "measure the world model against real execution on the same solutions (status accuracy, reward "
        "MAE, rank correlation, pairwise accuracy, before and after isotonic calibration)",
        _fidelity,
        hidden=hidden,
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
    sub.add_argument("--no-progress", action="store_true", help="hide progress bars")


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
            progress=not args.no_progress,
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
