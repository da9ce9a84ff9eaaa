"""The example third domain (``examples/hpo``): does its policy learn, and what does the world model save?

Runs ``wmrl train hpo`` in the modes ``real``, ``world_model`` and ``wmrl`` (and ``wmrl_rollout``: the
``wmrl`` mode with per-rollout anchors, the synthetic benchmark's winning option) on the same seeds,
side by side in one run, and reports per mode: the true score of the policy's greedy configuration
(cross-validated, averaged over the tasks) at the start and at the end, and the compute each stream
spent (wall seconds from the cost ledger; the greedy evaluation that measures learning is outside the
ledger, it trains nothing).

    python benchmarks/hpo_domain.py [--steps 30] [--seeds 2] [--out runs/bench-hpo] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

#: arm -> (mode, extra overrides)
MODES = {
    "real": ("real", ()),
    "world_model": ("world_model", ()),
    "wmrl": ("wmrl", ()),
    "wmrl_rollout": ("wmrl", ("corrector.scheduler.rollout_share=1", "corrector.scheduler.floor=0")),
    # the same, at the execution budget ``wmrl`` realises here (its floor of one group in four: 0.25)
    "wmrl_rollout_0.25": (
        "wmrl",
        (
            "corrector.scheduler.rollout_share=1",
            "corrector.scheduler.floor=0",
            "corrector.scheduler.fraction=0.25",
        ),
    ),
}


def run(arm: str, seed: int, steps: int, out: Path) -> dict:
    mode, extra = MODES[arm]
    folder = out / f"{arm}-seed{seed}"
    if not (folder / "cost_report.json").is_file():  # finished runs are kept: rerunning resumes the table
        subprocess.run(
            [sys.executable, "-m", "wmrl.core.cli", "train", "hpo", "--out", str(folder), "--no-progress",
             f"mode={mode}", f"seed={seed}", f"steps={steps}", "logging.plots=false", *extra],
            check=True,
        )  # fmt: skip
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    greedy = [r["policy/greedy_true_score"] for r in rows]
    report = json.loads((folder / "cost_report.json").read_text())
    spent = report["spent"]
    return {
        "start": greedy[0],
        "end": statistics.fmean(greedy[-3:]),
        "grading_s": spent["world_model"]["wall_s"] + spent["anchor"]["wall_s"],
        "executions": spent["anchor"]["items"],
        "total_s": report["total"]["wall_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", default="runs/bench-hpo")
    parser.add_argument("--json", help="also write the table as JSON here")
    parser.add_argument("--arms", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(MODES))
    if unknown:
        parser.error(f"--arms: unknown {unknown}")
    if "real" not in arms:
        parser.error("--arms must include real: every cost ratio is against it")
    out = Path(args.out)
    table = {m: [run(m, s, args.steps, out) for s in range(args.seeds)] for m in arms}
    real_cost = statistics.fmean(r["total_s"] for r in table["real"])
    print(
        f"{'mode':<12} {'greedy start':>12} {'greedy end':>11} {'executions':>10} {'grading s':>10} {'total s':>8} {'cost vs real':>12}"
    )
    summary = {}
    for mode, runs in table.items():
        row = {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}
        row["end_per_seed"] = [r["end"] for r in runs]
        row["cost_vs_real"] = row["total_s"] / real_cost
        summary[mode] = row
        print(
            f"{mode:<12} {row['start']:>12.3f} {row['end']:>11.3f} {row['executions']:>10.0f} "
            f"{row['grading_s']:>10.1f} {row['total_s']:>8.1f} {row['cost_vs_real']:>12.2f}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"steps": args.steps, "seeds": args.seeds, "modes": summary}, indent=2)
        )


if __name__ == "__main__":
    main()
