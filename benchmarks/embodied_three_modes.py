"""The three modes on LIBERO from one SFT policy: success on held-out initial states before and after.

The paper's embodied experiment (MiniVLA-1B from SFT, GRPO with sparse success, Robometer alone, and
WMRL; 37.4 -> 41.2) at the scale a machine allows, with the commands a user runs:

* ``eval-before/``: ``wmrl eval libero`` of the SFT policy on the evaluation states;
* ``train-<mode>-s<seed>/``: ``wmrl train embodied`` in ``mode`` from the SFT policy, seed ``seed``,
  the same steps, groups and rollouts in every mode;
* ``eval-<mode>-s<seed>/``: ``wmrl eval libero`` of its last checkpoint on the evaluation states.

Each piece is skipped when its result exists, so the benchmark runs in pieces (``run`` again after
an interruption, or with more ``--seeds``); ``summary`` tabulates what exists: per mode the
evaluation success of every seed, the episodes pooled over seeds with a Wilson interval, the change
from the SFT policy, the training's wall time and its cost per stream (``cost_report.json``).

Usage (CPU scale; on a GPU raise --group-size, --groups, --steps, --max-steps and --image-size):

    python benchmarks/embodied_three_modes.py run --policy SFT/checkpoints/checkpoint-N/policy \\
        --world-model WM/model --task 5 --train-states 0-15 --eval-states 40-49 --seeds 0,1,2 \\
        --steps 3 --group-size 4 --groups 2 --max-steps 300 --out runs/three-modes
    python benchmarks/embodied_three_modes.py summary --out runs/three-modes
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Each arm: the overrides of ``wmrl train embodied`` that make it. ``wmrl`` is the mode on its default
# corrector; ``wmrl_groups`` the group design that was the embodied default before it (whole anchor
# groups at 10%, at least one a step, the mse fusion): the ``wmrl`` runs recorded before 2026-12-07
# afternoon used it.
ARMS: dict[str, tuple[str, ...]] = {
    "real": ("mode=real",),
    "world_model": ("mode=world_model",),
    "wmrl": ("mode=wmrl",),
    "wmrl_groups": ("mode=wmrl", "corrector_preset=wmrl_groups"),
}
MODES = ("real", "world_model", "wmrl")


def _wmrl() -> list[str]:
    return [sys.executable, "-m", "wmrl.core.cli"]


def _run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` with its output in ``log``; returns its wall seconds. Raises on a non-zero exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    print("$ " + " ".join(cmd), flush=True)
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise SystemExit(f"exit {code}: {' '.join(cmd)} (see {log})")
    return time.perf_counter() - start


def _evaluate(args: argparse.Namespace, policy: str, out: Path) -> None:
    if (out / "eval_info.json").is_file():
        return
    cmd = [
        *_wmrl(),
        "eval",
        "libero",
        "--policy",
        policy,
        "--tasks",
        str(args.task),
        "--states",
        args.eval_states,
        "--max-steps",
        str(args.max_steps),
        "--workers",
        str(args.workers),
        "--soft-reset",
        "--cameras",
        _policy_cameras(policy),
        "--out",
        str(out),
    ]
    _run(cmd, out.with_suffix(".log"))


def _policy_cameras(policy: str) -> str:
    """The cameras a saved policy reads (``agentview``, and its wrist camera if it has one), comma-separated:
    only those are rendered."""
    import json

    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicyConfig

    saved = json.loads((Path(policy) / "minivla.json").read_text())["policy"]
    return ",".join(MiniVLAPolicyConfig(**saved).cameras)


def _last_policy(train_dir: Path) -> str:
    from wmrl.core.rundir import latest_checkpoint

    checkpoint = latest_checkpoint(train_dir)
    if checkpoint is None:
        raise SystemExit(f"{train_dir} holds no complete checkpoint")
    return str(checkpoint / "policy")


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps(vars(args) | {"command": "run"}, indent=2, default=str))
    _evaluate(args, args.policy, out / "eval-before")
    for seed in [int(s) for s in args.seeds.split(",")]:
        for mode in args.modes.split(","):
            if mode not in ARMS:
                raise SystemExit(f"unknown arm {mode!r}; choose from {tuple(ARMS)}")
            train_dir = out / f"train-{mode}-s{seed}"
            if not (train_dir / "cost_report.json").is_file():
                overrides = [
                    *ARMS[mode],
                    f"seed={seed}",
                    f"steps={args.steps}",
                    f"group_size={args.group_size}",
                    f"groups_per_step={args.groups}",
                    f"policy.source={args.policy}",
                    f"env.tasks=[{args.task}]",
                    f"env.states=[{args.train_states}]",
                    f"env.max_episode_steps={args.max_steps}",
                    f"env.workers={args.workers}",
                    "world_model.backend=local",
                    f"world_model.model_path={args.world_model}",
                    f"checkpoint.every={args.steps}",
                    "logging.report_to=[]",
                    f"torch_threads={args.torch_threads}",
                    *args.set,
                ]
                preset = [] if args.config == "none" else ["--config", args.config]
                cmd = [
                    *_wmrl(),
                    "train",
                    "embodied",
                    *preset,
                    *overrides,
                    "--out",
                    str(train_dir),
                    "--no-progress",
                ]
                _run(cmd, out / f"train-{mode}-s{seed}.log")
            _evaluate(args, _last_policy(train_dir), out / f"eval-{mode}-s{seed}")


def _successes(eval_dir: Path) -> list[bool] | None:
    path = eval_dir / "eval_info.json"
    if not path.is_file():
        return None
    return [bool(e["success"]) for e in json.loads(path.read_text())["per_episode"]]


def summarize(out: Path) -> dict[str, Any]:
    from wmrl.embodied.eval.metrics import wilson_interval

    before = _successes(out / "eval-before")
    rows: dict[str, Any] = {"before": None, "modes": {}}
    if before is not None:
        rows["before"] = {
            "successes": sum(before),
            "episodes": len(before),
            "wilson95": wilson_interval(sum(before), len(before)),
        }
    for mode in ARMS:
        seeds = {}
        for train_dir in sorted(out.glob(f"train-{mode}-s*")):
            if not train_dir.is_dir():
                continue
            seed = train_dir.name.rsplit("-s", 1)[1]
            after = _successes(out / f"eval-{mode}-s{seed}")
            cost_path = train_dir / "cost_report.json"
            cost = json.loads(cost_path.read_text()) if cost_path.is_file() else None
            metrics = (
                [json.loads(line) for line in (train_dir / "metrics.jsonl").read_text().splitlines()]
                if (train_dir / "metrics.jsonl").is_file()
                else []
            )
            seeds[seed] = {
                "after_successes": None if after is None else sum(after),
                "after_episodes": None if after is None else len(after),
                "train_wall_s": round(sum(r.get("time/step_s") or 0 for r in metrics), 1),
                "train_success_rate": [r.get("rollout/success_rate") for r in metrics],
                # how the correction weighed the streams per step (wmrl mode; absent elsewhere)
                "weight_world_model": [r.get("wmrl/weight_world_model") for r in metrics],
                "calibrated": [r.get("wmrl/calibrated") for r in metrics],
                "anchor_groups": [r.get("wmrl/anchor_groups") for r in metrics],
                # per-rollout anchors, what the world model's gain measured, and whether a bound set the weights
                "executions": [r.get("wmrl/executions") for r in metrics],
                "wm_gain": [r.get("wmrl/wm_gain") for r in metrics],
                "fusion_bound": [r.get("wmrl/fusion_bound") for r in metrics],
                "spent": None
                if cost is None
                else {
                    k: {"wall_s": round(v["wall_s"], 2), "items": v["items"]}
                    for k, v in cost["spent"].items()
                },
            }
        if not seeds:
            continue
        done = [s for s in seeds.values() if s["after_successes"] is not None]
        pooled = (sum(s["after_successes"] for s in done), sum(s["after_episodes"] for s in done))
        rows["modes"][mode] = {
            "seeds": seeds,
            "after_pooled": None
            if not done
            else {"successes": pooled[0], "episodes": pooled[1], "wilson95": wilson_interval(*pooled)},
        }
    return rows


def _pct(k: int, n: int, ci: Any) -> str:
    return f"{k}/{n} = {100 * k / n:.0f}% [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]" if ci else f"{k}/{n}"


def summary(args: argparse.Namespace) -> None:
    out = Path(args.out)
    rows = summarize(out)
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    b = rows["before"]
    print(
        "before (the SFT policy): "
        + ("not evaluated" if b is None else _pct(b["successes"], b["episodes"], b["wilson95"]))
    )
    print(
        "| mode | after, per seed | after, pooled over seeds | change from before (points) "
        "| training wall s (mean) | spent wall s per stream (mean) |"
    )
    print("|---|---|---|---|---|---|")
    for mode, row in rows["modes"].items():
        seeds = row["seeds"]
        if not seeds:
            continue
        per_seed = ", ".join(f"s{k}: {v['after_successes']}/{v['after_episodes']}" for k, v in seeds.items())
        pooled = row["after_pooled"]
        after = "-" if pooled is None else _pct(pooled["successes"], pooled["episodes"], pooled["wilson95"])
        change = "-"
        if pooled is not None and b is not None:
            delta = pooled["successes"] / pooled["episodes"] - b["successes"] / b["episodes"]
            change = f"{100 * delta:+.0f}"
        streams: dict[str, list[float]] = {}
        for v in seeds.values():
            for name, c in (v["spent"] or {}).items():
                streams.setdefault(name, []).append(c["wall_s"])
        spent = ", ".join(f"{k} {sum(x) / len(x):.1f}" for k, x in streams.items())
        wall = sum(v["train_wall_s"] for v in seeds.values()) / len(seeds)
        print(f"| {mode} | {per_seed} | {after} | {change} | {wall:.0f} | {spent} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and evaluate every (mode, seed) piece not done yet")
    r.add_argument("--policy", required=True, help="the SFT policy folder every mode starts from")
    r.add_argument(
        "--world-model", required=True, help="a Robometer checkpoint folder (wmrl train embodied-wm)"
    )
    r.add_argument("--task", type=int, default=5)
    r.add_argument("--train-states", default="0-15", help="in-domain states trained on, e.g. 0-15 or 0,3,5")
    r.add_argument("--eval-states", default="40-49", help="held-out states evaluated on")
    r.add_argument("--modes", default=",".join(MODES), help=f"arms, from {tuple(ARMS)}")
    r.add_argument("--seeds", default="0,1,2")
    r.add_argument("--steps", type=int, default=3)
    r.add_argument("--group-size", type=int, default=4)
    r.add_argument("--groups", type=int, default=2)
    r.add_argument(
        "--max-steps", type=int, default=300, help="policy steps per episode (training and evaluation)"
    )
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--torch-threads", type=int, default=1, help="torch threads of the trainer's process")
    r.add_argument("--config", default="none", help="a preset or file under the overrides ('none': defaults)")
    r.add_argument("--set", nargs="*", default=[], help="further key=value overrides of wmrl train embodied")
    r.add_argument("--out", required=True)
    s = sub.add_parser("summary", help="tabulate what the pieces measured")
    s.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command == "run":
        from wmrl.embodied.env.splits import parse_indices

        args.train_states = ",".join(str(i) for i in parse_indices(args.train_states))
        run(args)
    summary(args)


if __name__ == "__main__":
    main()
