"""Issue 33 on the heavy tier: ``real``, synchronous ``wmrl``, asynchronous ``wmrl`` and ``world_model``
on a task whose executions take 20-60 s, with the real language model, wall time measured.

Every arm is the quickstart (``wmrl train autoresearch``: the model action, 2 prompts x groups of 8,
from ``smollm2-warm-model``) on ``--task`` (default ``flight-delay-full``) for ``--steps`` steps, on
the same seeds, interleaved seed by seed so that load falls on every arm alike:

* ``real``: ``mode=real`` (every rollout executed; the sandbox's result cache serves a script
  executed before, the strongest real-execution baseline);
* ``wmrl``: the default (synchronous anchors);
* ``wmrl_async``: ``corrector.asynchrony.max_anchor_lag=1`` (a step's executions land one step later);
* ``world_model``: ``mode=world_model`` (nothing executed).

Per run: the measured wall time of training and of each step (``step_time``, with the wall-clock time
each step ended, so the executed position can be read against wall time), the seconds the trainer
waited on asynchronous executions (the ledger's ``anchor_wait``; None for a synchronous run, whose
executions' seconds, ``anchor_s``, are on its steps' path), the executions, the executed position per step
(training's own log, over what each arm executed), and an in-sample evaluation of the final policy
(``wmrl eval autoresearch --in-sample``: fresh rollouts executed, the same for every arm). Finished
runs are kept in ``--out``: the same command continues an interrupted benchmark.

``--split-cores 0:1`` pins every arm's trainer to core 0 (``taskset``) and its executions to core 1
(``sandbox.cores``): training and execution stop competing for the two cores, as when sandboxes run on
machines of their own (the regime asynchronous anchors are for); by default they share both cores.

    python benchmarks/heavy_tier_arms.py --out runs/heavy-arms --seeds 0,1,2 --steps 4 --samples 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from real_lm_arms import _metrics, _run

from wmrl.core.bench.intervals import mean_and_ci95

ARMS: dict[str, list[str]] = {
    "real": ["mode=real"],
    "wmrl": [],
    "wmrl_async": ["corrector.asynchrony.max_anchor_lag=1"],
    "world_model": ["mode=world_model"],
}


def parse_split(text: str | None) -> tuple[list[int], list[int]] | None:
    """``"0:1"`` -> ``([0], [1])``: the trainer's cores and the executions' (``"0,1:2,3"`` for several)."""
    if not text:
        return None
    try:
        trainer, sandbox = ([int(c) for c in part.split(",") if c] for part in text.split(":"))
    except ValueError as exc:
        raise SystemExit(f"--split-cores takes TRAINER:SANDBOX core lists such as 0:1; got {text!r}") from exc
    if not trainer or not sandbox or set(trainer) & set(sandbox):
        raise SystemExit(f"--split-cores needs two disjoint, non-empty core lists; got {text!r}")
    return trainer, sandbox


def train_and_eval(
    wmrl: str,
    out: Path,
    arm: str,
    seed: int,
    task: str,
    steps: int,
    samples: int,
    split: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    name = f"{arm}-s{seed}"
    run, result_file = out / name, out / f"{name}.json"
    cores = None if split is None else {"trainer": split[0], "sandbox": split[1]}
    if result_file.exists():
        done = json.loads(result_file.read_text())
        if done.get("cores") != cores:
            raise SystemExit(
                f"{result_file} was measured with cores {done.get('cores')}, not {cores}: use another --out"
            )
        return done
    if run.exists():
        raise SystemExit(
            f"{run} holds an unfinished run: remove it (a resumed run's wall time is not comparable)"
        )
    cmd = [
        wmrl, "train", "autoresearch", "--out", str(run), "--no-progress", f"seed={seed}", f"steps={steps}",
        f"tasks.ids=[{task}]", *ARMS[arm],
    ]  # fmt: skip
    if split is not None:  # the trainer on its cores, the executions on theirs (world_model: none run)
        trainer, sandbox = split
        cmd = [
            "taskset",
            "-c",
            ",".join(map(str, trainer)),
            *cmd,
            f"sandbox.cores=[{','.join(map(str, sandbox))}]",
        ]
    code, wall = _run(cmd, out / f"{name}.train.log")
    if code != 0:
        raise SystemExit(f"{name}: training failed (exit {code}); see {out / f'{name}.train.log'}")
    evaluation = None
    if samples:
        cmd = [
            wmrl, "eval", "autoresearch", "--model", str(run / "final"), "--tasks", task, "--in-sample",
            "--samples", str(samples), "--no-progress", "--json", "--out", str(out / f"{name}-eval"),
        ]  # fmt: skip
        started = time.perf_counter()
        with (out / f"{name}.eval.log").open("w") as log:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"{name}: evaluation failed (exit {done.returncode}); see {out / f'{name}.eval.log'}"
            )
        report = json.loads(done.stdout[done.stdout.index("{") :])
        evaluation = {
            "position": report.get("overall"),
            "position_sem": report.get("overall_sem"),
            "valid_rate": report.get("valid_rate"),
            "samples": report.get("samples"),
            "wall_s": time.perf_counter() - started,
        }
    rows = _metrics(run)
    cost = json.loads((run / "cost_report.json").read_text())
    spent = cost.get("spent") or {}
    start = rows[0]["time"] - rows[0]["step_time"] if rows else None
    result = {
        "arm": arm,
        "seed": seed,
        "task": task,
        "steps": steps,
        "settings": ARMS[arm],
        "cores": cores,
        "train_wall_s": wall,
        "step_s": [r.get("step_time") for r in rows],
        # seconds from the first step's start to each step's end: position against wall time
        "step_end_s": [r["time"] - start for r in rows] if start is not None else [],
        # the ledger books a wait only for asynchronous anchors; a synchronous step's executions are on
        # its path (anchor_s), so without the stream the wait is not measured: None, not 0
        "anchor_wait_s": spent["anchor_wait"]["wall_s"] if "anchor_wait" in spent else None,
        "anchor_s": spent.get("anchor", {}).get("wall_s", 0.0),
        "executions": float(spent.get("anchor", {}).get("items", 0)),
        "executed_position": [r.get("executed/position") for r in rows],
        "spent": spent,
        "eval": evaluation,
    }
    result_file.write_text(json.dumps(result, indent=1))
    return result


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: means with 95% t-intervals over seeds; step time against ``world_model`` and wall time
    against ``wmrl`` paired per seed."""
    by_arm: dict[str, list[dict]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], []).append(r)
    step = {a: {r["seed"]: statistics.fmean(r["step_s"]) for r in rs} for a, rs in by_arm.items()}
    wall = {a: {r["seed"]: r["train_wall_s"] for r in rs} for a, rs in by_arm.items()}
    out = {}
    for arm, rs in by_arm.items():
        seeds = [r["seed"] for r in rs]
        row: dict[str, Any] = {"seeds": seeds}
        for key, values in {
            "train_wall_s": [r["train_wall_s"] for r in rs],
            "step_s": [statistics.fmean(r["step_s"]) for r in rs],
            "anchor_wait_s": [r["anchor_wait_s"] for r in rs],
            "executions": [r["executions"] for r in rs],
            "final_executed_position": [
                r["executed_position"][-1] if r["executed_position"] else None for r in rs
            ],
            "eval_position": [(r["eval"] or {}).get("position") for r in rs],
            "step_vs_world_model": [
                step[arm][s] / step["world_model"][s] for s in seeds if s in step.get("world_model", {})
            ],
            "speedup_vs_wmrl": [wall["wmrl"][s] / wall[arm][s] for s in seeds if s in wall.get("wmrl", {})],
        }.items():
            row[key], row[f"{key}_ci95"] = mean_and_ci95(values)
        out[arm] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/heavy-arms")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--task", default="flight-delay-full")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--samples", type=int, default=16, help="in-sample evaluation rollouts per run (0: none)"
    )
    parser.add_argument("--wmrl", default=str(Path(sys.executable).with_name("wmrl")))
    parser.add_argument(
        "--split-cores",
        default=None,
        help="TRAINER:SANDBOX, e.g. 0:1: train pinned to the first cores (taskset) and execute on the others "
        "(sandbox.cores), as when sandboxes have machines of their own; every arm alike (default: shared)",
    )
    args = parser.parse_args(argv)
    split = parse_split(args.split_cores)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; known: {list(ARMS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in arms:
            print(f"[heavy-arms] {arm} seed {seed} ...", file=sys.stderr, flush=True)
            results.append(
                train_and_eval(args.wmrl, out, arm, seed, args.task, args.steps, args.samples, split)
            )
            summary = summarise(results)
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
