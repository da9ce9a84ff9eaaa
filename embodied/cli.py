"""Subcommands of the ``wmrl`` command contributed by ``wmrl.embodied``.

``register`` must import only the standard library and ``wmrl.core``; heavy imports go inside handlers.
"""

from __future__ import annotations

import argparse
import sys
import time


def parse_index_list(text: str) -> tuple[int, ...]:
    """``"0,2,5-7"`` -> ``(0, 2, 5, 6, 7)``; ranges are inclusive."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                first, last = int(lo), int(hi)
                if last < first:
                    raise argparse.ArgumentTypeError(f"range {part!r} runs backwards")
                out.extend(range(first, last + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected integers or ranges like 0,2,5-7; got {text!r}"
            ) from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected at least one index; got {text!r}")
    return tuple(out)


def _add_eval_libero(root) -> None:
    p = root.subcommand(
        "eval",
        "libero",
        "evaluate a VLA policy on LIBERO: success per task over initial states, Best@k/All@k, in-domain vs held-out",
        _eval_libero,
    )
    p.add_argument(
        "--suite",
        default="libero_10",
        help="libero_10 (LIBERO-Long, default), libero_spatial, libero_object, libero_goal, libero_90",
    )
    p.add_argument(
        "--tasks", type=parse_index_list, default=None, help="task indices, e.g. 0,1 or 0-4 (default: all)"
    )
    p.add_argument(
        "--states",
        type=parse_index_list,
        default=None,
        help="initial-state indices, e.g. 0-15 (default: those of --split)",
    )
    p.add_argument(
        "--split",
        choices=("all", "in_domain", "held_out"),
        default="all",
        help="in_domain = states 0-15, held_out = 16-49 (default: all)",
    )
    p.add_argument(
        "--rollouts-per-state",
        "-k",
        type=int,
        default=1,
        help="k rollouts per (task, state), for Best@k and All@k (default 1)",
    )
    p.add_argument(
        "--policy",
        default="random",
        help="'random' or a saved-policy folder with policy.json (default: random)",
    )
    p.add_argument("--videos", type=int, default=0, help="number of episodes to save as mp4 (default 0)")
    p.add_argument(
        "--workers", type=int, default=1, help="simulator processes; 0 = in this process (default 1)"
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="policy steps per episode (default: the suite's, 520 for libero_10)",
    )
    p.add_argument(
        "--settle-steps",
        type=int,
        default=10,
        help="no-op steps after placing the initial state (default 10)",
    )
    p.add_argument("--seed", type=int, default=0, help="base seed of every episode seed (default 0)")
    p.add_argument(
        "--cameras",
        default="agentview,robot0_eye_in_hand",
        help="comma-separated cameras, or 'none' (default: agentview,robot0_eye_in_hand)",
    )
    p.add_argument("--image-size", type=int, default=256, help="square image side in pixels (default 256)")
    p.add_argument(
        "--orientation",
        choices=("upright", "rotate180", "raw"),
        default="upright",
        help="image orientation (default upright)",
    )
    p.add_argument(
        "--soft-reset",
        action="store_true",
        help="reuse the MuJoCo model between episodes (faster; default: hard reset)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output folder for eval_info.json and videos/ (default: runs/eval_libero/<suite>-<time>)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the JSON report on stdout instead of the summary table"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _eval_libero(args: argparse.Namespace) -> int:
    import json

    from wmrl.embodied.env.libero_setup import LiberoUnavailableError
    from wmrl.embodied.eval.libero_eval import LiberoEvalConfig, format_summary, run_libero_eval

    out = args.out or f"runs/eval_libero/{args.suite}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        config = LiberoEvalConfig(
            suite=args.suite,
            tasks=args.tasks,
            states=args.states,
            split=args.split,
            rollouts_per_state=args.rollouts_per_state,
            policy=args.policy,
            videos=args.videos,
            workers=args.workers,
            max_steps=args.max_steps,
            settle_steps=args.settle_steps,
            seed=args.seed,
            cameras=args.cameras,
            image_size=args.image_size,
            orientation=args.orientation,
            hard_reset=not args.soft_reset,
            out_dir=out,
        )
        report = run_libero_eval(config, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, LiberoUnavailableError) as exc:
        print(f"wmrl eval libero: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_summary(report))
        print(f"report: {out}/eval_info.json")
    return 0


def _add_train_embodied(root) -> None:
    p = root.subcommand(
        "train",
        "embodied",
        "GRPO for a VLA policy on LIBERO with rewards corrected by WMRL (modes: sparse, world_model, wmrl)",
        _train_embodied,
    )
    p.add_argument(
        "--config",
        default=None,
        help="a preset name (smoke) or a .json/.toml config file, e.g. a run's config.json (default: built-in defaults)",
    )
    p.add_argument("--smoke", action="store_true", help="the CPU smoke preset (same as --config smoke)")
    p.add_argument("--out", default=None, help="run directory (default: runs/train_embodied/<mode>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, e.g. mode=sparse steps=10 env.tasks=[0,1] ppo.lr=3e-5 corrector.scheduler.fraction=0.2",
    )


def _train_embodied(args: argparse.Namespace) -> int:
    import json

    from wmrl.core.config import ConfigError
    from wmrl.embodied.training.config import load_train_config

    if args.smoke and args.config not in (None, "smoke"):
        print("wmrl train embodied: error: give --smoke or --config, not both", file=sys.stderr)
        return 2
    try:
        config = load_train_config("smoke" if args.smoke else args.config, args.overrides)
    except (ConfigError, ValueError) as exc:
        print(f"wmrl train embodied: error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    if args.resume and args.out is None:
        print(
            "wmrl train embodied: error: --resume needs --out (the run directory to continue)",
            file=sys.stderr,
        )
        return 2
    from wmrl.embodied.env.libero_setup import LiberoUnavailableError
    from wmrl.embodied.training.trainer import train

    out = args.out or f"runs/train_embodied/{config.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        report = train(config, out, resume=args.resume, progress=not args.no_progress)
    except (FileExistsError, FileNotFoundError, LiberoUnavailableError, ConfigError) as exc:
        print(f"wmrl train embodied: error: {exc}", file=sys.stderr)
        return 2
    spent = report["spent"]
    print(
        f"trained {report['steps_logged']} step(s), {report['episodes']} episodes, mode {config.mode}; "
        f"rollouts {spent['generation']['wall_s']:.1f} s, Robometer {spent['world_model']['wall_s']:.1f} s, "
        f"update {spent['update']['wall_s']:.1f} s"
    )
    print(f"run directory: {out} (config.json, metrics.jsonl, plots/, cost_report.json, checkpoints/)")
    return 0


def register(root) -> None:
    """Add this package's commands to the ``wmrl`` command tree (see ``wmrl.core.cli.CommandRoot``)."""
    _add_eval_libero(root)
    _add_train_embodied(root)
