"""Asynchronous anchors measured, not modelled: ``wmrl train hpo`` with executions in flight.

The example domain (``examples/hpo``) is the one where real execution (3-fold cross-validation of a
gradient-boosted model on the whole dataset) costs more than everything else in a step, so a
synchronous step waits for it. Arms, on the same seeds, side by side in one run (interleaved seed by
seed, so that load on the machine falls on every arm alike):

* ``real`` (every rollout executed), ``world_model`` (none), ``wmrl`` (the default, synchronous),
  ``wmrl_lag1`` and ``wmrl_lag2`` (``corrector.asynchrony.max_anchor_lag`` 1 and 2).

Per run: the measured wall time of the whole run and per step (``time/step_s``), the seconds the
trainer waited on executions (the ledger's ``anchor_wait``), the executions spent, and the true score
of the final policy's greedy configuration per task (cross-validated with a fixed seed, averaged over
the tasks; an evaluation outside the run, which trains nothing). ``report_greedy=false`` in training,
so that no evaluation runs inside a timed step.

    python benchmarks/async_anchors_hpo.py --seeds 3 --steps 12 --out runs/async-hpo --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from wmrl.core.bench.intervals import mean_and_ci95

#: arm -> overrides on top of ``wmrl train hpo``
ARMS = {
    "real": ("mode=real",),
    "world_model": ("mode=world_model",),
    "wmrl": (),
    "wmrl_lag1": ("corrector.asynchrony.max_anchor_lag=1",),
    "wmrl_lag2": ("corrector.asynchrony.max_anchor_lag=2",),
}


def greedy_score(folder: Path) -> float:
    """The final policy's greedy configuration per task, cross-validated with seed 0, averaged over tasks."""
    from wmrl.core.config import load_config
    from wmrl.core.rundir import list_checkpoints
    from wmrl_hpo.config import HPOConfig
    from wmrl_hpo.domain import HPODomain
    from wmrl_hpo.tasks import Rollout, cross_validated

    config = load_config(HPOConfig, folder / "config.json")
    domain = HPODomain(config)
    domain.load(list_checkpoints(folder)[-1])
    return statistics.fmean(
        cross_validated(Rollout(task, domain.greedy(task), seed=0)) for task in domain.tasks
    )


def run(arm: str, seed: int, steps: int, out: Path) -> dict:
    folder = out / f"{arm}-seed{seed}"
    result_file = folder / "async_bench.json"
    if result_file.is_file():  # finished runs are kept: rerunning continues the table
        return json.loads(result_file.read_text())
    if folder.exists():
        raise SystemExit(
            f"{folder} holds an unfinished run: remove it (a resumed run's wall time is not comparable)"
        )
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "wmrl.core.cli", "train", "hpo", "--out", str(folder), "--no-progress",
         f"seed={seed}", f"steps={steps}", "report_greedy=false", "logging.plots=false", *ARMS[arm]],
        check=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((folder / "cost_report.json").read_text())
    spent = report["spent"]
    result = {
        "arm": arm,
        "seed": seed,
        "wall_s": wall,
        "step_s_mean": statistics.fmean(r["time/step_s"] for r in rows),
        "anchor_wait_s": spent.get("anchor_wait", {}).get("wall_s", 0.0),
        "executions": spent["anchor"]["items"],
        "greedy_true_score": greedy_score(folder),
    }
    result_file.write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default="runs/async-hpo")
    parser.add_argument("--json", default=None, help="write the summary here too")
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; known: {list(ARMS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {a: [] for a in arms}
    for seed in range(args.seeds):  # interleaved: every arm of a seed before the next seed
        for arm in arms:
            print(f"[async-hpo] {arm} seed {seed} ...", file=sys.stderr, flush=True)
            results[arm].append(run(arm, seed, args.steps, out))
    base = {r["seed"]: r for r in results.get("wmrl", [])}
    summary = {}
    print(
        f"{'arm':<12} {'wall s':>14} {'step s':>8} {'waited s':>9} {'executions':>10} {'greedy score':>16} {'speedup vs wmrl':>16}"
    )
    for arm, rs in results.items():
        wall, wall_ci = mean_and_ci95([r["wall_s"] for r in rs])
        score, score_ci = mean_and_ci95([r["greedy_true_score"] for r in rs])
        speed = [base[r["seed"]]["wall_s"] / r["wall_s"] for r in rs if r["seed"] in base]
        speedup, speedup_ci = mean_and_ci95(speed) if speed else (None, None)
        summary[arm] = {
            "wall_s": wall,
            "wall_s_ci95": wall_ci,
            "step_s_mean": statistics.fmean(r["step_s_mean"] for r in rs),
            "anchor_wait_s": statistics.fmean(r["anchor_wait_s"] for r in rs),
            "executions": statistics.fmean(r["executions"] for r in rs),
            "greedy_true_score": score,
            "greedy_true_score_ci95": score_ci,
            "speedup_vs_wmrl": speedup,
            "speedup_vs_wmrl_ci95": speedup_ci,
            "runs": rs,
        }
        shown = "-" if speedup is None else f"{speedup:.2f}x ± {speedup_ci:.2f}"
        print(
            f"{arm:<12} {wall:>7.1f} ± {wall_ci:<5.1f} {summary[arm]['step_s_mean']:>8.2f} "
            f"{summary[arm]['anchor_wait_s']:>9.1f} {summary[arm]['executions']:>10.0f} "
            f"{score:>8.4f} ± {score_ci:.4f} {shown:>16}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"seeds": args.seeds, "steps": args.steps, "arms": summary}, indent=2)
        )


if __name__ == "__main__":
    main()
