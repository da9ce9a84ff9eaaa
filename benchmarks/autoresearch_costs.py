"""AutoResearch training costs on this machine: one rollout graded by the sandbox vs by the world
model; the quickstart's wall time; the corrector's share of a training step.

Usage::

    # grading cost per rollout (the fidelity corpus's scripts, each grader alone, one at a time)
    python benchmarks/autoresearch_costs.py rollout [--model smollm2] [--json out.json]

    # run the quickstart (`wmrl train autoresearch`) and report its wall time and step breakdown
    python benchmarks/autoresearch_costs.py quickstart [--out runs/quickstart-bench] [--json out.json]

    # the same breakdown for an existing run directory
    python benchmarks/autoresearch_costs.py run RUN_DIR [--json out.json]

``rollout`` times every corpus script (timeouts excluded: each costs exactly the corpus time limit,
reported separately) through (a) the bubblewrap sandbox + grader, cache off; (b) the world model
with one-prefill status-probability scoring; (c) the world model sampling 4 JSON predictions.
Each grader runs alone and one item at a time, so the numbers are per-rollout costs, not
throughput (batching is measured in ``benchmarks/wm_throughput.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _summary(seconds: list[float]) -> dict:
    return {
        "n": len(seconds),
        "mean_s": statistics.fmean(seconds),
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
    }


def rollout_costs(model: str = "smollm2") -> dict:
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.overview import OverviewConfig, from_task
    from wmrl.autoresearch.fidelity.corpus import load_corpus
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.tasks import Solution, load_task
    from wmrl.autoresearch.training.builders import AGENT_LIBRARIES
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    corpus = load_corpus()
    entries = [e for e in corpus.entries if e.expected_status != "timeout"]
    tasks = {e.task: load_task(e.task) for e in entries}
    grader = ExecutionGrader(
        backend="bwrap", time_limit_s=corpus.time_limit_s, memory_limit_mb=corpus.memory_limit_mb
    )
    grader.grade(tasks[entries[0].task], entries[0].code)  # warm the page cache and the grader
    sandbox = []
    for e in entries:
        start = time.perf_counter()
        result = grader.grade(tasks[e.task], e.code)
        sandbox.append(time.perf_counter() - start)
        assert result.status == e.expected_status, (e.file, result.status)

    loaded = load_model(model)
    budget = OverviewConfig(max_tokens=400)
    overviews = {
        t: from_task(
            task,
            environment=SandboxEnvironment.from_task(task, libraries=AGENT_LIBRARIES),
            config=budget,
            tokens=loaded.tokenizer,
        )
        for t, task in tasks.items()
    }
    out = {
        "items": len(entries),
        "sandbox": _summary(sandbox),
        "timeouts_excluded": sum(1 for e in corpus.entries if e.expected_status == "timeout"),
        "timeout_cost_s": corpus.time_limit_s,
    }
    backend = TransformersBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id)
    for name, cfg in (
        (
            "world_model_status_probs",
            WorldModelConfig(scoring="status_probs", worked_example=False, overview_tokens=400),
        ),
        (
            "world_model_samples4",
            WorldModelConfig(scoring="samples", samples=4, max_new_tokens=128, overview_tokens=400),
        ),
    ):
        wm = WorldModel(backend, cfg, overview_fn=overviews.__getitem__, cache=False, tokens=loaded.tokenizer)
        wm.predict([Solution(entries[0].task, entries[0].code)])  # warm-up
        times, gated = [], 0
        for e in entries:
            start = time.perf_counter()
            outcome = wm.predict([Solution(e.task, e.code)])[0]
            times.append(time.perf_counter() - start)
            gated += outcome.grade.info.get("source") == "gate"
        modelled = [t for t, e in zip(times, entries, strict=True) if e.expected_status != "syntax_error"]
        out[name] = {**_summary(times), "gated": gated, "model_calls": _summary(modelled)}
    out["ratio_sandbox_over_status_probs"] = (
        out["sandbox"]["mean_s"] / out["world_model_status_probs"]["mean_s"]
    )
    out["ratio_sandbox_over_samples4"] = out["sandbox"]["mean_s"] / out["world_model_samples4"]["mean_s"]
    return out


def run_breakdown(run_dir: str | Path) -> dict:
    run = Path(run_dir)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "step_time" in r]
    report = json.loads((run / "cost_report.json").read_text())
    summary = (
        json.loads((run / "run_summary.json").read_text()) if (run / "run_summary.json").exists() else {}
    )
    per_step = []
    for r in steps:
        step = r["step_time"]
        per_step.append(
            {
                "step": r["step"],
                "step_s": step,
                "generation_s": r.get("cost/generation_s"),
                "world_model_s": r.get("cost/world_model_s"),
                "anchor_s": r.get("cost/anchor_s"),
                "corrector_s": r.get("cost/corrector_s"),
                "corrector_share": (r.get("cost/corrector_s") or 0.0) / step,
            }
        )
    return {
        "run_dir": str(run),
        "wall_s": summary.get("wall_s"),
        "steps": per_step,
        "corrector_share_mean": statistics.fmean(p["corrector_share"] for p in per_step)
        if per_step
        else None,
        "spent": report["spent"],
        "real_mode_estimate": report["real_mode_estimate"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("rollout")
    r.add_argument("--model", default="smollm2")
    q = sub.add_parser("quickstart")
    q.add_argument("--out", default=time.strftime("runs/quickstart-bench-%Y%m%d-%H%M%S"))
    q.add_argument("overrides", nargs="*")
    b = sub.add_parser("run")
    b.add_argument("run_dir")
    for p in (r, q, b):
        p.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.what == "rollout":
        result = rollout_costs(args.model)
    elif args.what == "quickstart":
        start = time.perf_counter()
        subprocess.run(["wmrl", "train", "autoresearch", "--out", args.out, *args.overrides], check=True)
        result = {"command_wall_s": time.perf_counter() - start, **run_breakdown(args.out)}
    else:
        result = run_breakdown(args.run_dir)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
