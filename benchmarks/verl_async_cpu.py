"""Issue 33: verl steps with synchronous and asynchronous anchors, side by side, on this CPU.

The launch of ``tests/verl_env/test_verl_cpu_step.py`` (``python -m verl.trainer.main_ppo`` with WMRL's
``wmrl_sync`` trainer, a tiny random Qwen2, rollouts through vLLM's CPU build), with an anchor whose
every call takes ``--latency`` seconds (an execution with a latency: :class:`SlowAnchor`), run with
``max_anchor_lag = 0`` and ``= 1`` for ``--steps`` steps (one checkpoint, at the last step, which
drains), alternately ``--repeats`` times. Measured per run: verl's own ``timing_s/step`` of each step
and the seconds the trainer waited on executions in flight (``async/wait_s``). The steps compared
are the middle ones: the first (warm-up, nothing lands) and the last (it drains) are reported apart.

Run it in ``.venv-verl`` (``bash .ci/setup`` builds it):

    .venv-verl/bin/python benchmarks/verl_async_cpu.py --out runs/verl-async-cpu --latency 8 --steps 6 --repeats 2
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


def run_arm(folder: Path, lag: int, steps: int, latency: float) -> dict:
    """One launch: its exit code, each step's ``timing_s/step`` and ``async/wait_s``, the log's path."""
    folder.mkdir(parents=True, exist_ok=True)
    model_dir, train, wmrl_config = launch_kit.build_assets(
        folder, max_anchor_lag=lag, anchor="make_slow_anchor"
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
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be >= 3: the first and the last steps are reported apart")
    out = Path(args.out).resolve()  # the launch runs in its own folder: every path absolute
    runs = []
    for repeat in range(args.repeats):
        for lag in (0, 1):  # alternated, so that load falls on both alike
            print(f"repeat {repeat}, max_anchor_lag={lag} ...", flush=True)
            run = run_arm(out / f"lag{lag}-r{repeat}", lag, args.steps, args.latency)
            run["repeat"] = repeat
            if run["exit_code"] != 0 or len(run["steps"]) != args.steps:
                raise SystemExit(
                    f"the launch failed (exit {run['exit_code']}, steps {run['steps']}): {run['log']}"
                )
            runs.append(run)
            print(f"  step s: {[round(s, 2) for s in run['step_s']]}", flush=True)
    summary = {}
    for lag in (0, 1):
        middle = [s for r in runs if r["lag"] == lag for s in r["step_s"][1:-1]]
        waits = [w or 0.0 for r in runs if r["lag"] == lag for w in r["wait_s"][1:-1]]
        summary[f"lag{lag}"] = {
            "middle_step_s_mean": statistics.mean(middle),
            "middle_step_s": middle,
            "first_step_s": [r["step_s"][0] for r in runs if r["lag"] == lag],
            "last_step_s": [r["step_s"][-1] for r in runs if r["lag"] == lag],
            "middle_wait_s_mean": statistics.mean(waits),
        }
    summary["middle_step_ratio_sync_over_async"] = (
        summary["lag0"]["middle_step_s_mean"] / summary["lag1"]["middle_step_s_mean"]
    )
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
