"""``wmrl bench synthetic``, ``wmrl bench cost`` and ``wmrl bench overhead``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wmrl.core.cli import CommandRoot


def register(root: CommandRoot) -> None:
    syn = root.subcommand(
        "bench", "synthetic", "simulated GRPO: WMRL against real-execution GRPO", _synthetic
    )
    syn.add_argument("--quick", action="store_true", help="small problem that finishes in under 2 minutes")
    syn.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5, quick 3)")
    syn.add_argument("--seed0", type=int, default=0, help="first seed")
    syn.add_argument("--exec-cost", type=float, default=5.0, help="cost units of one real execution")
    syn.add_argument("--sweep", action="store_true", help="also sweep world-model quality (bias x noise)")
    syn.add_argument(
        "--exec-noise",
        choices=["none", "gaussian", "flaky", "bernoulli"],
        default="none",
        help="real execution's noise in the main run (default none: exact)",
    )
    syn.add_argument(
        "--noise-sweep",
        action="store_true",
        help="also run the main arms under every kind of execution noise",
    )
    syn.add_argument(
        "--arms", default=None, help="comma-separated arms to run (default all; real always runs)"
    )
    syn.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override the corrector config every arm starts from, e.g. fusion.bias_horizon=8 (repeatable)",
    )
    syn.add_argument(
        "--variants",
        type=int,
        default=1,
        help="how solutions recur: each in V variants that share its outcome but not its key (1: exact "
        "recurrence, the default problem; 0: nothing recurs)",
    )
    syn.add_argument(
        "--equal-steps",
        action="store_true",
        help="compare at equal steps only (default: every arm is also continued to real's cost and compared "
        "at equal cost)",
    )
    syn.add_argument(
        "--exec-latency",
        type=float,
        default=0.0,
        help="duration of one batch of real executions in step-times (a step's generation and world-model "
        "scoring take 1): the modelled wall time of asynchronous anchors (default 0)",
    )
    syn.add_argument(
        "--lag-sweep",
        action="store_true",
        help="also run the default arm with asynchronous anchors at lags 0, 1, 2, 4, 8 (and the other late "
        "updates and an importance-weighted one): final reward, paired against lag 0, and modelled wall time",
    )
    syn.add_argument("--out", default="runs/bench-synthetic", help="output directory")
    cost = root.subcommand(
        "bench", "cost", "a finished run's measured costs against a measured real-execution run", _cost
    )
    cost.add_argument("run", help="the run folder")
    cost.add_argument("--against", required=True, help="a finished mode=real run of the same work")
    cost.add_argument("--json", default=None, help="also write the comparison here")
    over = root.subcommand("bench", "overhead", "corrector step time and debiaser refit time", _overhead)
    over.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    over.add_argument("--out", default="runs/bench-overhead", help="output directory")


def _synthetic(args: argparse.Namespace) -> int:
    from wmrl.core.bench.synthetic import run_from_cli

    return run_from_cli(args)


def _overhead(args: argparse.Namespace) -> int:
    from wmrl.core.bench.overhead import run_from_cli

    try:
        return run_from_cli(args)
    except KeyboardInterrupt:
        # Timings are not kept: a rerun measures them all again on the machine as it is then.
        print("\ninterrupted: no timings written (rerun to measure)", file=sys.stderr)
        return 130


def _cost(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from wmrl.core.bench.cost_compare import compare_costs, format_comparison

    try:
        result = compare_costs(args.run, args.against)
    except (FileNotFoundError, ValueError) as err:
        print(f"wmrl bench cost: {err}", file=sys.stderr)
        return 2
    print(format_comparison(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
