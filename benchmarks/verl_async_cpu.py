"""Issue 33: verl steps with synchronous and asynchronous anchors, side by side, on this CPU.

The launch of ``tests/verl_env/test_verl_cpu_step.py`` (``python -m verl.trainer.main_ppo`` with WMRL's
``wmrl_sync`` trainer, a tiny random Qwen2, rollouts through vLLM's CPU build), with an anchor whose
every call takes ``--latency`` seconds (an execution with a latency: :class:`SlowAnchor`), run in each
of ``--arms`` (``LAG:WORKERS``: ``corrector.asynchrony.max_anchor_lag`` and ``.workers``; ``0:1`` is
synchronous) for ``--steps`` steps (one checkpoint, at the last step, which drains), the arms
alternated ``--repeats`` times. Measured per run: verl's own ``timing_s/step`` of each step
and the seconds the trainer waited on executions in flight (``async/wait_s``). The steps compared
are the steady ones, from the first at which executions land (the first step warms up) to the one
before the last (which drains); the first and the last are reported apart.

Run it in ``.venv-verl`` (``bash .ci/setup`` builds it):

    .venv-verl/bin/python benchmarks/verl_async_cpu.py --out runs/verl-async-cpu --latency 8 --steps 6 \
        --repeats 2 --arms 0:1,1:1,2:2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "verl_env"))

import test_verl_cpu_step as launch_kit  # noqa: E402  (the launch the slow test runs)


def mean_or_none(values: list) -> float | None:
    """The mean of the values logged (``None`` where a step logged none); ``None`` when none was logged."""
    logged = [v for v in values if v is not None]
    return statistics.mean(logged) if logged else None


def run_arm(folder: Path, lag: int, workers: int, steps: int, latency: float) -> dict:
    """One launch: its exit code, each step's ``timing_s/step`` and ``async/wait_s``, the log's path."""
    folder.mkdir(parents=True, exist_ok=True)
    model_dir, train, wmrl_config = launch_kit.build_assets(
        folder, max_anchor_lag=lag, anchor="make_slow_anchor", workers=workers
    )
    epochs = -(-steps // 2)  # two batches of two prompts per epoch
    ray_tmp = Path(tempfile.mkdtemp(prefix="wr-", dir="/tmp"))
    try:
        env = {**launch_kit.launch_env(wmrl_config, ray_tmp), "WMRL_CPU_STEP_ANCHOR_S": str(latency)}
        args = launch_kit.overrides(
            model_dir, train, folder / "checkpoints", steps, epochs=epochs, save_freq=steps
        )
        code, log = launch_kit.launch(folder, args, env, folder / "run.log")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    metrics = launch_kit.step_metrics(log)
    return {
        "lag": lag,
        "workers": workers,
        "exit_code": code,
        "steps": sorted(metrics),
        "step_s": [metrics[s].get("timing_s/step") for s in sorted(metrics)],
        "wait_s": [metrics[s].get("async/wait_s") for s in sorted(metrics)],
        "late_rows": [metrics[s].get("wmrl/late_rows") for s in sorted(metrics)],
        "log": str(folder / "run.log"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/verl-async-cpu")
    parser.add_argument("--latency", type=float, default=8.0, help="seconds each anchor call takes")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--arms", default="0:1,1:1", help="LAG:WORKERS,... (0:1 is synchronous)")
    args = parser.parse_args(argv)
    try:
        arms = [tuple(int(x) for x in arm.split(":")) for arm in args.arms.split(",")]
    except ValueError:
        parser.error(f"--arms takes LAG:WORKERS pairs such as 0:1,1:1; got {args.arms!r}")
    if any(len(arm) != 2 or arm[0] < 0 or arm[1] < 1 for arm in arms):
        parser.error(f"--arms takes LAG:WORKERS pairs with LAG >= 0 and WORKERS >= 1; got {args.arms!r}")
    if args.steps < 2 + max(lag for lag, _ in arms):
        parser.error("--steps must exceed every arm's lag + 1: the steady steps lie between")
    out = Path(args.out).resolve()  # the launch runs in its own folder: every path absolute
    runs = []
    for repeat in range(args.repeats):
        for lag, workers in arms:  # alternated, so that load falls on every arm alike
            name = f"lag{lag}-w{workers}"
            print(f"repeat {repeat}, {name} ...", flush=True)
            run = run_arm(out / f"{name}-r{repeat}", lag, workers, args.steps, args.latency)
            run["repeat"] = repeat
            if run["exit_code"] != 0 or len(run["steps"]) != args.steps:
                raise SystemExit(
                    f"the launch failed (exit {run['exit_code']}, steps {run['steps']}): {run['log']}"
                )
            runs.append(run)
            print(f"  step s: {[round(s, 2) for s in run['step_s']]}", flush=True)
    summary: dict = {}
    for lag, workers in arms:
        mine = [r for r in runs if (r["lag"], r["workers"]) == (lag, workers)]
        # steady state: from the first step at which executions land (the first step warms up), the last
        # (it drains) apart
        start = max(lag, 1)
        middle = [s for r in mine for s in r["step_s"][start:-1]]
        summary[f"lag{lag}-w{workers}"] = {
            "middle_step_s_mean": statistics.mean(middle),
            "middle_step_s": middle,
            "first_step_s": [r["step_s"][0] for r in mine],
            "last_step_s": [r["step_s"][-1] for r in mine],
            # a synchronous run logs no wait (its executions are on the step's path): None, not 0
            "middle_wait_s_mean": mean_or_none([w for r in mine for w in r["wait_s"][start:-1]]),
        }
    if (0, 1) in arms:  # each arm's middle step against the synchronous one
        sync = summary["lag0-w1"]["middle_step_s_mean"]
        for arm in summary.values():
            arm["sync_over_this"] = sync / arm["middle_step_s_mean"]
    result = {
        "latency_s": args.latency,
        "steps": args.steps,
        "repeats": args.repeats,
        "runs": runs,
        "summary": summary,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
