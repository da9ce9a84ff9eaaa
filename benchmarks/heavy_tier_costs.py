"""What a solution costs on the heavy tier, measured: executions through the real sandbox.

For each task, the model action's solutions (the fixed pipeline around each model block the warm
start learned to write, :func:`wmrl.autoresearch.training.model_slot.slot_recipes`, the same scripts a
policy's replies assemble into) are executed one at a time through the bubblewrap sandbox with the
task's limits, and their wall time, CPU time, peak memory, status and leaderboard position recorded.
Standard-suite tasks run beside them for comparison. One execution at a time, so the seconds are
those of an execution alone on the machine (2 cores here).

    python benchmarks/heavy_tier_costs.py --per-family 1 --out benchmarks/results/heavy-tier-2026-12-06/costs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HEAVY = ("flight-delay-full", "flight-delay-minutes")
STANDARD = ("penguin-body-mass", "flight-arrival-delay")


def measure(task_id: str, grader, per_family: int | None) -> list[dict]:
    """Execute the slot recipes of ``task_id`` (the first ``per_family`` of each model family, or
    all), one at a time."""
    from wmrl.autoresearch.tasks.load import load_task
    from wmrl.autoresearch.training.corpus import TaskSchema, recipes_for
    from wmrl.autoresearch.training.model_slot import (
        assemble,
        model_block,
        pipeline_head,
        pipeline_tail,
        slot_recipes,
    )

    task = load_task(task_id)
    schema = TaskSchema.from_task(task)
    recipes = slot_recipes(recipes_for(schema))
    if per_family is not None:
        seen: dict[str, int] = {}
        chosen = []
        for recipe in recipes:
            seen[recipe.model] = seen.get(recipe.model, 0) + 1
            if seen[recipe.model] <= per_family:
                chosen.append(recipe)
        recipes = chosen
    head, tail = pipeline_head(schema), pipeline_tail(schema)
    rows = []
    for recipe in recipes:
        started = time.perf_counter()
        graded = grader.grade(task, assemble(head, model_block(schema, recipe), tail))
        rows.append(
            {
                "recipe": recipe.name,
                "status": graded.status,
                "position": graded.position,
                "wall_s": graded.resources.get("wall_s"),
                "cpu_s": graded.resources.get("cpu_s"),
                "peak_rss_mb": graded.resources.get("peak_rss_mb"),
                "grade_s": round(time.perf_counter() - started, 2),
            }
        )
        print(
            f"{task_id:20s} {recipe.name:32s} {graded.status:18s} wall {rows[-1]['wall_s'] or float('nan'):7.1f}s "
            f"position {graded.position if graded.position is not None else float('nan'):.3f}",
            flush=True,
        )
    return rows


def summarise(rows: list[dict]) -> dict:
    """Wall seconds of the valid executions (quartiles), and of all of them."""
    valid = sorted(r["wall_s"] for r in rows if r["status"] == "valid" and r["wall_s"] is not None)
    every = sorted(r["wall_s"] for r in rows if r["wall_s"] is not None)

    def quartiles(values: list[float]) -> dict | None:
        if not values:
            return None
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        return {"n": len(values), "min": values[0], "q1": q[0], "median": q[1], "q3": q[2], "max": values[-1]}

    best = max((r for r in rows if r["position"] is not None), key=lambda r: r["position"], default=None)
    return {
        "valid": quartiles(valid),
        "all": quartiles(every),
        "statuses": {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})},
        "best": None
        if best is None
        else {"recipe": best["recipe"], "position": best["position"], "wall_s": best["wall_s"]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--tasks", default=",".join((*HEAVY, *STANDARD)))
    parser.add_argument(
        "--per-family", type=int, default=None, help="the first N recipes of each model family (default: all)"
    )
    parser.add_argument("--backend", default="bwrap")
    args = parser.parse_args(argv)

    from wmrl.autoresearch.grading.grader import ExecutionGrader

    grader = ExecutionGrader(backend=args.backend)
    result = {"backend": args.backend, "tasks": {}}
    for task_id in args.tasks.split(","):
        rows = measure(task_id, grader, args.per_family)
        result["tasks"][task_id] = {"summary": summarise(rows), "executions": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")  # after each task: nothing lost
        print(json.dumps({task_id: result["tasks"][task_id]["summary"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
