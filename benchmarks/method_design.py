"""Design experiments of issue 32 on the simulated GRPO problem: every arm at equal cost.

Each arm runs on each seed until it has spent what ``real`` spends in ``--steps`` steps (so arms
cheaper per step run longer), and is read at equal steps (``--steps``) and at equal cost (``real``'s
cost and a third of it), with the cost at which its seed-mean curve first reaches 95% and 100% of
``real``'s final reward, and paired per-seed differences against ``--reference`` arms.

    python benchmarks/method_design.py --variants 1 --seeds 0-9 --arms real_cache,paper,mem_top \\
        --arm 'top_f03=wmrl:scheduler.rollout_share=1;scheduler.floor=0;memory.enabled=true;scheduler.fraction=0.3' \\
        --out runs/design-v1.json

Arms: names of ``wmrl.core.bench.simulation.ARMS`` or ``NAME=PRESET:key=value;key=value`` (dotted
corrector settings on top of the preset). Runs go to ``--jobs`` processes; results are written as
JSON (per arm: the summary and the per-seed curves' summary numbers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.core.bench.equal_cost import equal_cost_summary, format_equal_cost
from wmrl.core.bench.simulation import ARMS, SimConfig, run_arm
from wmrl.core.config import parse_value


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def parse_arm(spec: str) -> tuple[str, Any]:
    """``NAME=PRESET:k=v;k=v`` -> ``(NAME, (PRESET, {k: v}))``."""
    name, _, rest = spec.partition("=")
    preset, _, settings = rest.partition(":")
    changes = {}
    for item in filter(None, settings.split(";")):
        key, _, value = item.partition("=")
        changes[key.strip()] = parse_value(value.strip())
    return name.strip(), (preset.strip(), changes)


def _run(job: tuple) -> tuple[str, int, dict[str, Any]]:
    cfg, arm, spec, seed, until = job
    if spec is not None:
        ARMS[arm] = spec
    result = run_arm(cfg, arm, seed, keep_metrics=True, until_cost=until)
    cost = result.cost(cfg)
    means = {}
    for key in ("wmrl/wm_gain", "wmrl/fusion_bound", "wmrl/weight_world_model", "wmrl/variance_ratio"):
        values = [m.get(key) for m in result.metrics[: cfg.steps] if m.get(key) is not None]
        means[key] = float(np.mean(values)) if values else None
    return (
        arm,
        seed,
        {
            "reward": result.true_reward.tolist(),
            "cost": cost.tolist(),
            "executions_at_steps": float(result.executions[: cfg.steps].sum()),
            "metric_means": means,
        },
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--variants", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--arms", default="real_cache,paper,mem_top")
    parser.add_argument("--arm", action="append", default=[], help="NAME=PRESET:k=v;k=v (repeatable)")
    parser.add_argument("--reference", default="real_cache", help="comma-separated arms to pair against")
    parser.add_argument("--set", action="append", default=[], help="SimConfig field=value (repeatable)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    cfg = SimConfig(steps=args.steps, variants=args.variants)
    for item in args.set:
        key, _, value = item.partition("=")
        cfg = replace(cfg, **{key: parse_value(value)})
    specs: dict[str, Any] = dict.fromkeys(filter(None, args.arms.split(",")))
    for spec in args.arm:
        name, value = parse_arm(spec)
        specs[name] = value
    specs.pop("real", None)
    for name, spec in specs.items():
        if spec is None and name not in ARMS:
            print(f"unknown arm {name!r}", file=sys.stderr)
            return 2
    references = [r for r in args.reference.split(",") if r]
    started = time.perf_counter()
    runs: dict[str, dict[int, dict]] = {"real": {}}
    with ProcessPoolExecutor(args.jobs) as pool:
        for arm, seed, data in pool.map(_run, [(cfg, "real", None, s, None) for s in seeds]):
            runs[arm][seed] = data
        budget = {s: runs["real"][s]["cost"][cfg.steps] for s in seeds}
        jobs = [(cfg, arm, spec, s, budget[s]) for arm, spec in specs.items() for s in seeds]
        for done, (arm, seed, data) in enumerate(pool.map(_run, jobs), start=1):
            runs.setdefault(arm, {})[seed] = data
            if done % max(1, len(jobs) // 10) == 0:
                print(f"  {done}/{len(jobs)} runs ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    curves = {
        arm: {s: (np.asarray(d["reward"]), np.asarray(d["cost"])) for s, d in per_seed.items()}
        for arm, per_seed in runs.items()
    }
    summary = equal_cost_summary(curves, seeds, cfg.steps, references)
    for arm, per_seed in runs.items():
        summary["arms"][arm]["executions_at_steps"] = float(
            np.mean([per_seed[s]["executions_at_steps"] for s in seeds])
        )
        keys = per_seed[seeds[0]]["metric_means"]
        summary["arms"][arm]["metric_means"] = {
            k: (
                None
                if not (
                    v := [
                        per_seed[s]["metric_means"][k]
                        for s in seeds
                        if per_seed[s]["metric_means"][k] is not None
                    ]
                )
                else float(np.mean(v))
            )
            for k in keys
        }
    summary.update(
        seeds=seeds,
        variants=args.variants,
        steps=args.steps,
        arms_spec=dict(specs.items()),
        settings=args.set,
        wall_s=time.perf_counter() - started,
    )
    print(format_equal_cost(summary))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=1, default=str))
        print(f"\nwrote {args.out} ({summary['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
