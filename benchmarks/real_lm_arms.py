"""Issue 32 on the real language model: ``real``, ``real_cache``, the paper's preset and the default.

Every arm is the quickstart (``wmrl train autoresearch``: the model action on ``penguin-body-mass``,
2 prompts x groups of 8, 8 steps, from ``smollm2-warm-model``) on the same seeds, with one setting
changed; then the final policy is evaluated in-sample (``wmrl eval autoresearch --in-sample``), the
same for every arm, since each arm executes a different subset of its rollouts during training (the
default executes each group's top-ranked unknown solutions, so its executed rollouts are not a
sample of the policy):

* ``real``: ``mode=real sandbox.cache=false`` (every rollout executed, no cache);
* ``real_cache``: ``mode=real corrector.memory.enabled=true`` (a solution executed once is graded from
  the execution memory afterwards);
* ``paper``: ``corrector_preset=paper`` (whole anchor groups at 10%, at least one a step; its fusion);
* ``wmrl``: the per-rollout design with the gain fusion (``corrector.fusion.mode=gain``);
* ``wmrl_flat``: the same with every weight 1 (``corrector.fusion.mode=none``);
* ``wmrl_surrogate``: ``wmrl_flat`` with the language world model fused with a surrogate learned from
  the run's executions (``world_model.surrogate.enabled=true``, issue 32 part 6).

Per run it records the wall time, real executions spent in training (the cost ledger's anchor items),
memory hits, the fusion's measurements (``wmrl/wm_gain`` and the random-effects parts), the executed
position per step (training's own log, over the rollouts each arm executed) and the in-sample
evaluation (valid rate and avg@k position over ``--samples`` fresh rollouts). Finished runs and
evaluations are kept in ``--out``: the same command continues an interrupted benchmark.

    python benchmarks/real_lm_arms.py --out runs/real-lm --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ARMS: dict[str, list[str]] = {  # real_cache last: its policy is real's (execution is deterministic)
    "real": ["mode=real", "sandbox.cache=false"],
    # the two fusions of the per-rollout design, named whatever the default is
    "wmrl": ["corrector.fusion.mode=gain"],
    "wmrl_flat": ["corrector.fusion.mode=none"],
    "wmrl_surrogate": ["corrector.fusion.mode=none", "world_model.surrogate.enabled=true"],
    "paper": ["corrector_preset=paper"],
    "real_cache": ["mode=real", "corrector.memory.enabled=true"],
}
TASK = "penguin-body-mass"


def _run(cmd: list[str], log: Path) -> tuple[int, float]:
    started = time.perf_counter()
    with log.open("w") as fh:
        code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    return code, time.perf_counter() - started


def _metrics(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "wmrl/step" in r]


def _mean(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return float(np.mean(known)) if known else None


def train_and_eval(wmrl: str, out: Path, arm: str, seed: int, samples: int) -> dict[str, Any]:
    name = f"{arm}-s{seed}"
    run = out / name
    result_file = out / f"{name}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    if not (run / "final").exists():
        cmd = [wmrl, "train", "autoresearch", "--out", str(run), "--no-progress", f"seed={seed}", *ARMS[arm]]
        if run.exists():
            cmd.append("--resume")
        code, wall = _run(cmd, out / f"{name}.train.log")
        if code != 0:
            raise SystemExit(f"{name}: training failed (exit {code}); see {out / f'{name}.train.log'}")
    else:
        wall = None
    eval_dir = out / f"{name}-eval"
    cmd = [
        wmrl, "eval", "autoresearch", "--model", str(run / "final"), "--tasks", TASK, "--in-sample",
        "--samples", str(samples), "--no-progress", "--json", "--out", str(eval_dir),
    ]  # fmt: skip
    started = time.perf_counter()
    with (out / f"{name}.eval.log").open("w") as log:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    eval_wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"{name}: evaluation failed (exit {done.returncode}); see {out / f'{name}.eval.log'}"
        )
    report = json.loads(done.stdout[done.stdout.index("{") :])
    (out / f"{name}.eval.json").write_text(json.dumps(report, indent=1))
    rows = _metrics(run)
    summary = json.loads((run / "run_summary.json").read_text())
    cost = json.loads((run / "cost_report.json").read_text())
    result = {
        "arm": arm,
        "seed": seed,
        "settings": ARMS[arm],
        "train_wall_s": summary.get("wall_s_total", wall),
        "eval_wall_s": eval_wall,
        # what the sandbox ran, from the cost ledger (memory hits book nothing there)
        "executions": float((cost.get("spent") or {}).get("anchor", {}).get("items", 0)),
        "executions_logged": float(np.nansum([r.get("wmrl/executions") or 0 for r in rows])),
        "memory_hits": float(np.nansum([r.get("memory/hits") or 0 for r in rows])),
        "executed_position": [r.get("executed/position") for r in rows],
        "wm_gain": [r.get("wmrl/wm_gain") for r in rows],
        "wm_slope": [r.get("wmrl/wm_slope") for r in rows],
        "wm_residual_var": [r.get("wmrl/wm_residual_var") for r in rows],
        "wm_fresh_var": [r.get("wmrl/wm_fresh_var") for r in rows],
        "wm_icc": [r.get("wmrl/wm_icc") for r in rows],
        "fusion_bound": [r.get("wmrl/fusion_bound") for r in rows],
        "weight_anchor": [r.get("wmrl/weight_anchor") for r in rows],
        "weight_world_model": [r.get("wmrl/weight_world_model") for r in rows],
        # the fused world model's sources (world_model.surrogate.enabled): their weights once measured
        "source_weights": [
            {
                k.removeprefix("world_model/weight/"): v
                for k, v in r.items()
                if k.startswith("world_model/weight/")
            }
            for r in rows
        ],
        "surrogate_learned": [r.get("world_model/learned/surrogate") for r in rows],
        "spent": cost.get("spent"),
        "eval": {
            "position": report.get("overall"),
            "position_sem": report.get("overall_sem"),
            "valid_rate": report.get("valid_rate"),
            "samples": report.get("samples"),
            "seeds": report.get("seeds"),
        },
    }
    result_file.write_text(json.dumps(result, indent=1))
    return result


def _executions(result: dict[str, Any]) -> float:
    """What the sandbox ran in training: the ledger's anchor items (results recorded before the
    ledger was read summed ``wmrl/executions``, which then counted memory hits in mode ``real``)."""
    spent = result.get("spent") or {}
    return float(spent.get("anchor", {}).get("items", result["executions"]))


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    from wmrl.core.bench.intervals import ci95 as ci

    out: dict[str, Any] = {}
    for arm in ARMS:
        rs = [r for r in results if r["arm"] == arm]
        if not rs:
            continue
        position = [r["eval"]["position"] for r in rs]
        valid = [r["eval"]["valid_rate"] for r in rs]
        out[arm] = {
            "seeds": [r["seed"] for r in rs],
            "eval_position": {"mean": float(np.mean(position)), "ci95": ci(position), "per_seed": position},
            "eval_valid": {"mean": float(np.mean(valid)), "ci95": ci(valid), "per_seed": valid},
            "executions": float(np.mean([_executions(r) for r in rs])),
            "memory_hits": float(np.mean([r["memory_hits"] for r in rs])),
            "train_wall_s": float(np.mean([r["train_wall_s"] for r in rs if r["train_wall_s"] is not None])),
            "executed_position_steps_5_8": _mean([_mean(r["executed_position"][4:8]) for r in rs]),
            "wm_gain_last": _mean([r["wm_gain"][-1] for r in rs]),
            "wm_slope_last": _mean([r["wm_slope"][-1] for r in rs]),
            "wm_icc_last": _mean([r["wm_icc"][-1] for r in rs]),
            "fusion_bound_share": _mean([_mean(r["fusion_bound"]) for r in rs]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/real-lm")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--samples", type=int, default=32, help="in-sample evaluation rollouts per run")
    parser.add_argument("--wmrl", default=str(Path(sys.executable).with_name("wmrl")))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        print(f"unknown arms {unknown}; known: {list(ARMS)}", file=sys.stderr)
        return 2
    results = []
    for seed in seeds:  # seed-major: an interrupted benchmark has every arm on the first seeds
        for arm in arms:
            print(f"[real-lm] {arm} seed {seed} ...", flush=True)
            results.append(train_and_eval(args.wmrl, out, arm, seed, args.samples))
            r = results[-1]
            print(
                f"[real-lm]   train {r['train_wall_s']:.0f} s, {r['executions']:.0f} executions, "
                f"eval position {r['eval']['position']}",
                flush=True,
            )
    summary = summarise(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for arm, s in summary.items():
        print(
            f"{arm:<11} eval position {s['eval_position']['mean']:.3f} ± {s['eval_position']['ci95']:.3f}  "
            f"valid {s['eval_valid']['mean']:.2f}  executions {s['executions']:.0f}  "
            f"memory hits {s['memory_hits']:.0f}  train {s['train_wall_s']:.0f} s  gain {s['wm_gain_last']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
