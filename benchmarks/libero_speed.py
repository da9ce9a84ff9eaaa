"""How fast does the LIBERO simulator run here? Steps per second and rollouts per minute.

Measures, on the real simulator (rpent-libero on robosuite 1.5.2 + MuJoCo, software rendering
unless MUJOCO_GL says otherwise):

1. environment steps per second of one LiberoEnv (libero_10 task 0, random actions) with no
   camera, one camera and the standard two cameras (agentview + wrist) at --image-size;
2. rollouts per minute through RolloutRunner with 1 and 2 worker processes (a random policy, the
   standard two cameras, --episode-steps policy steps per episode; simulators are built and warmed
   up before timing), and from their measured reset and step times the throughput in full
   LIBERO-Long episodes (reset with 10 settle steps + 520 policy steps, no early success);
3. the estimated wall time of a full LIBERO-Long evaluation (10 tasks x 50 initial states x k)
   at the best measured throughput, simulation only (the policy's own time comes on top).

Usage:
    python benchmarks/libero_speed.py [--image-size 256] [--steps 60] [--episode-steps 40]
        [--episodes 4] [--workers 1,2] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from wmrl.embodied.env import LiberoEnv, LiberoEnvConfig
from wmrl.embodied.policy import RandomPolicy
from wmrl.embodied.rollout import EpisodeSpec, RolloutConfig, RolloutRunner, episode_seed


def env_steps_per_second(cameras: tuple[str, ...], size: int, steps: int, seed: int = 0) -> dict:
    """Steps/s of one environment with random actions, after a reset (build and reset timed apart)."""
    t0 = time.perf_counter()
    env = LiberoEnv(
        LiberoEnvConfig(task_id=0, cameras=cameras, image_height=size, image_width=size, max_steps=steps + 10)
    )
    env.reset(seed=seed, options={"init_state": 0})
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    env.reset(seed=seed, options={"init_state": 1})
    reset_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    for _ in range(5):  # warm-up (first renders compile shaders, numba JIT)
        env.step(rng.uniform(-1, 1, 7))
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(rng.uniform(-1, 1, 7))
    elapsed = time.perf_counter() - t0
    env.close()
    return {
        "cameras": list(cameras),
        "image_size": size,
        "steps": steps,
        "steps_per_s": steps / elapsed,
        "ms_per_step": 1000 * elapsed / steps,
        "build_and_first_reset_s": build_s,
        "reset_s": reset_s,
    }


def rollouts_per_minute(workers: int, size: int, episode_steps: int, episodes: int) -> dict:
    """Episodes/min with ``workers`` simulator processes, random policy, standard two cameras."""
    cfg = LiberoEnvConfig(task_id=0, image_height=size, image_width=size, max_steps=episode_steps)
    slots = max(1, workers)
    policies = [RandomPolicy() for _ in range(slots)]
    with RolloutRunner(cfg, RolloutConfig(workers=workers)) as runner:
        t0 = time.perf_counter()
        runner.start()
        # Warm-up: one short episode per worker builds every simulator.
        warm = [EpisodeSpec(0, s, episode_seed(1, 0, s, 0)) for s in range(slots)]
        runner.run(policies, warm)
        startup_s = time.perf_counter() - t0
        specs = [
            EpisodeSpec(0, s % 50, episode_seed(0, 0, s % 50, s // 50), s // 50) for s in range(episodes)
        ]
        t0 = time.perf_counter()
        records = runner.run(policies, specs)
        elapsed = time.perf_counter() - t0
    # Per worker, an episode costs its reset (incl. the 10 settle steps) plus its policy steps; a full
    # LIBERO-Long episode that never succeeds is one reset plus 520 steps.
    reset_s = float(np.mean([r.reset_s for r in records]))
    step_s = float(np.mean([(r.wall_s - r.reset_s) / r.steps for r in records]))
    full_episode_s = reset_s + 520 * step_s
    return {
        "workers": workers,
        "episodes": episodes,
        "episode_policy_steps": episode_steps,
        "elapsed_s": elapsed,
        "startup_and_warmup_s": startup_s,
        "rollouts_per_min": 60 * episodes / elapsed,
        "mean_reset_s": reset_s,
        "mean_step_s_per_worker": step_s,
        "full_episode_s_per_worker": full_episode_s,
        "full_libero_long_rollouts_per_min": 60 * slots / full_episode_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=60, help="timed steps per single-env measurement")
    p.add_argument("--episode-steps", type=int, default=40, help="policy steps per timed rollout")
    p.add_argument("--episodes", type=int, default=4, help="timed rollouts per worker count")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)

    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "osmesa (set by wmrl)"),
            "load_avg_at_start": os.getloadavg(),
        },
        "env": [],
        "rollouts": [],
    }
    size = args.image_size
    for cameras in ((), ("agentview",), ("agentview", "robot0_eye_in_hand")):
        r = env_steps_per_second(cameras, size, args.steps)
        results["env"].append(r)
        print(
            f"env  cameras={'+'.join(cameras) or 'none':30s} {size}px  {r['steps_per_s']:7.1f} steps/s "
            f"({r['ms_per_step']:.1f} ms/step; build+reset {r['build_and_first_reset_s']:.1f} s, reset {r['reset_s']:.2f} s)",
            flush=True,
        )
    for workers in (int(w) for w in args.workers.split(",")):
        r = rollouts_per_minute(workers, size, args.episode_steps, args.episodes)
        results["rollouts"].append(r)
        print(
            f"rollouts workers={workers}: {r['rollouts_per_min']:.2f} rollouts/min of {args.episode_steps} steps "
            f"(reset {r['mean_reset_s']:.1f} s, {1000 * r['mean_step_s_per_worker']:.0f} ms/step per worker) -> "
            f"{r['full_libero_long_rollouts_per_min']:.3f} full LIBERO-Long rollouts/min",
            flush=True,
        )
    best = max(results["rollouts"], key=lambda r: r["full_libero_long_rollouts_per_min"])
    hours = {k: 10 * 50 * k / best["full_libero_long_rollouts_per_min"] / 60 for k in (1, 8)}
    results["full_libero_long_eval_hours"] = {
        "workers": best["workers"],
        **{f"k={k}": h for k, h in hours.items()},
    }
    results["machine"]["load_avg_at_end"] = os.getloadavg()
    print(
        f"full LIBERO-Long evaluation (10 tasks x 50 states, every episode to 520 steps, {best['workers']} workers, "
        f"simulation only): k=1 {hours[1]:.1f} h, k=8 {hours[8]:.1f} h"
    )
    print(
        f"load average: start {results['machine']['load_avg_at_start']}, end {results['machine']['load_avg_at_end']}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
