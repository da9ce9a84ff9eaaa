"""Does a surrogate learned from the run add to the language world model, on real code? (issue 32, part 6)

A replay of recorded training runs: each run's ``anchor_pairs.jsonl`` holds every script it executed
(``code``), the task, the step (``recipe: anchor@stepN``) and the real reward. Per run, step by
step, in the order the run executed them:

1. every *new* script of the step (its normalised key not executed before in this run; a repeat
   is graded exactly by the execution memory, so it is neither scored nor learned) is graded by
   * ``lm``: the language world model (``status_probs``), calibrated linearly on the run's earlier
     executions and nothing else (``FusedWorldModel([lm])``), and by
   * ``fused``: the same language model fused with the surrogate (``with_surrogate``: per task, the
     ``k`` nearest executed scripts in the code embedding), each calibrated and weighted by its own
     measured error;
2. then both learn the step's real rewards (prequential: a prediction never saw its own outcome).

Reported over the new scripts graded once both are measured (after ``--min-pairs`` executions):
the squared error of each against the real reward, the within-step Pearson correlation (what a
group's advantages use: the steps' rows are a few groups of one task), the surrogate's final weight,
and per run the paired differences, pooled over runs with a t interval. Runs that executed the same
scripts in the same order (``real`` and ``real_cache`` of one seed execute the same sequence of new
scripts) replay identically and are pooled once. The language model is
named by ``--world-model``; a recorded run's own world model (a warm start) must be built first.

    python benchmarks/surrogate_replay.py --world-model smollm2 \\
        --runs benchmarks/results/real-lm-2026-12-06/*-s? --out runs/surrogate-replay/base.json
    python benchmarks/surrogate_replay.py --summarise runs/surrogate-replay/base.json   # pool again
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

_STEP = re.compile(r"@step(\d+)$")


def load_pairs(run: Path) -> list[list[dict[str, Any]]]:
    """The run's executions grouped by step, in step order (rows in the order they were recorded)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for line in (run / "anchor_pairs.jsonl").read_text().splitlines():
        row = json.loads(line)
        match = _STEP.search(str(row.get("recipe", "")))
        if match is None or row.get("reward") is None:
            continue
        steps.setdefault(int(match.group(1)), []).append(row)
    return [steps[k] for k in sorted(steps)]


def fingerprint(steps: list[list[dict[str, Any]]]) -> str:
    """What a replay depends on: each step's new scripts (task, normalised code) and rewards, in order
    (steps with no new script left out: a run that executed nothing new in a step replays the same)."""
    from wmrl.autoresearch.tasks.normalised import normalised_code

    seen: set[tuple[str, str]] = set()
    groups = []
    for executed in steps:
        group = []
        for row in executed:
            key = (str(row["task_ref"]), normalised_code(row["code"]))
            if key not in seen:
                seen.add(key)
                group.append([*key, row["reward"]])
        if group:
            groups.append(group)
    return hashlib.sha256(json.dumps(groups).encode()).hexdigest()[:16]


def _pearson(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def replay(language_model: Any, steps: list[list[dict[str, Any]]], surrogate: Any) -> dict[str, Any]:
    """One run's replay (see the module docstring): the graded rows and their summary."""
    from wmrl.autoresearch.tasks import Solution
    from wmrl.autoresearch.tasks.normalised import solution_key
    from wmrl.autoresearch.worldmodel.surrogate import with_surrogate
    from wmrl.core.surrogate import FusedWorldModel

    alone = FusedWorldModel([language_model], min_pairs=surrogate.min_pairs, name="lm")
    fused = with_surrogate(language_model, surrogate)
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    for step, executed in enumerate(steps, start=1):
        items, rewards = [], []
        for row in executed:
            item = Solution(row["task_ref"], row["code"])
            key = solution_key(item)
            if key in seen:
                continue
            seen.add(key)
            items.append(item)
            rewards.append(float(row["reward"]))
        if not items:
            continue
        measured = alone.weights()[0] is not None and fused.weights()[0] is not None
        for reward, a, f in zip(rewards, alone.grade(items), fused.grade(items), strict=True):
            rows.append(
                {
                    "step": step,
                    "reward": reward,
                    "lm_raw": a.info["scores"]["world_model"],
                    "lm": a.value,
                    "fused": f.value,
                    "surrogate_raw": f.info["scores"]["surrogate"],
                    "measured": measured,
                }
            )
        alone.learn(items, rewards)
        fused.learn(items, rewards)
    graded = [r for r in rows if r["measured"] and r["lm"] is not None and r["fused"] is not None]
    summary: dict[str, Any] = {"new_scripts": len(rows), "graded": len(graded)}
    for arm in ("lm", "fused"):
        errors = [(r[arm] - r["reward"]) ** 2 for r in graded]
        summary[f"{arm}_mse"] = float(np.mean(errors)) if errors else None
        per_step = []
        for step in sorted({r["step"] for r in graded}):
            at = [r for r in graded if r["step"] == step]
            rho = _pearson([r[arm] for r in at], [r["reward"] for r in at])
            if rho is not None:
                per_step.append(rho)
        summary[f"{arm}_within_step_r"] = float(np.mean(per_step)) if per_step else None
    summary["surrogate_weight_final"] = fused.weights()[1]
    summary["surrogate_known_share"] = (
        float(np.mean([r["surrogate_raw"] is not None for r in graded])) if graded else None
    )
    return {"summary": summary, "rows": rows}


def pooled(diffs: list[float]) -> dict[str, Any]:
    """Mean of per-run paired differences with a 95% t interval (``None`` below two runs)."""
    if not diffs:
        return {"runs": 0, "mean": None, "ci95": None}
    mean = float(np.mean(diffs))
    if len(diffs) < 2:
        return {"runs": 1, "mean": mean, "ci95": None}
    half = float(stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / math.sqrt(len(diffs)))
    return {"runs": len(diffs), "mean": mean, "ci95": [mean - half, mean + half]}


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """The paired differences pooled over the distinct runs (see the module docstring)."""
    distinct: dict[str, str] = {}
    for folder in results:
        distinct.setdefault(fingerprint(load_pairs(Path(folder))), folder)
    summaries = [results[folder]["summary"] for folder in distinct.values()]

    def paired(fused: str, lm: str) -> dict[str, Any]:
        return pooled([s[fused] - s[lm] for s in summaries if s[fused] is not None and s[lm] is not None])

    return {
        "distinct_runs": sorted(distinct.values()),
        "mse_fused_minus_lm": paired("fused_mse", "lm_mse"),
        "within_step_r_fused_minus_lm": paired("fused_within_step_r", "lm_within_step_r"),
        "graded": sum(s["graded"] for s in summaries),
    }


def main() -> None:
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig
    from wmrl.autoresearch.worldmodel.surrogate import SurrogateConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", help="run folders with anchor_pairs.jsonl")
    parser.add_argument("--world-model", help="the language world model (a model spec or folder)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--radius", type=float, default=None)
    parser.add_argument("--min-pairs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", help="the report (JSON)")
    parser.add_argument("--summarise", metavar="REPORT", help="pool an existing report again (in place)")
    args = parser.parse_args()

    if args.summarise:
        path = Path(args.summarise)
        report = json.loads(path.read_text())
        report.update(summarise(report["runs"]))
        path.write_text(json.dumps(report, indent=1))
        print(
            json.dumps(
                {
                    k: report[k]
                    for k in ("distinct_runs", "mse_fused_minus_lm", "within_step_r_fused_minus_lm")
                }
            )
        )
        return
    if not (args.runs and args.world_model and args.out):
        parser.error("--runs, --world-model and --out are required (or --summarise REPORT)")
    surrogate = SurrogateConfig(enabled=True, k=args.k, radius=args.radius, min_pairs=args.min_pairs)
    started = time.perf_counter()
    loaded = load_model(args.world_model)
    backend = TransformersBackend(
        loaded.model, loaded.tokenizer, model_id=loaded.model_id, batch_size=args.batch_size
    )
    # one language model for every run: its prediction cache answers a script any run executed before
    language_model = WorldModel(backend, WorldModelConfig(), task_resolver=load_task, tokens=loaded.tokenizer)
    results: dict[str, Any] = {}
    for folder in map(Path, args.runs):
        if not (folder / "anchor_pairs.jsonl").is_file():
            print(f"skip {folder}: no anchor_pairs.jsonl", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        results[str(folder)] = replay(language_model, load_pairs(folder), surrogate)
        s = results[str(folder)]["summary"]
        print(
            f"{folder}: {s['new_scripts']} new scripts, {s['graded']} graded; MSE lm {s['lm_mse']} fused "
            f"{s['fused_mse']}; within-step r lm {s['lm_within_step_r']} fused {s['fused_within_step_r']}; "
            f"surrogate weight {s['surrogate_weight_final']} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    report = {
        "command": " ".join(sys.argv),
        "world_model": args.world_model,
        "surrogate": vars(surrogate),
        "runs": results,
        **summarise(results),
        "wall_s": time.perf_counter() - started,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(
        json.dumps({k: report[k] for k in ("mse_fused_minus_lm", "within_step_r_fused_minus_lm", "wall_s")})
    )


if __name__ == "__main__":
    main()
