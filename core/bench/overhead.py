"""``wmrl bench overhead``: corrector step time against batch size, debiaser refit time against window size.

Step time is one full ``plan`` + ``correct`` (scheduling, prequential diagnostics, fusion update,
refit on a full 5,000-pair window, calibration, advantages) on synthetic scores, median over
repeats after warm-up. The scaling column is the exponent ``b`` of ``time ∝ size^b`` between
consecutive rows (1 = linear), computed on CPU time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.corrector import Corrector, CorrectorConfig
from wmrl.core.debias import DebiasConfig, OnlineDebiaser

GROUP_COUNTS = (8, 16, 64, 256, 1024, 4096)
BUFFER_SIZES = (100, 1000, 5000, 20_000, 50_000)
GROUP_SIZE = 8


def _scores(rng: np.random.Generator, n: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    true = rng.random((n, GROUP_SIZE))
    wm = np.clip(0.2 + 0.7 * true**2 + rng.normal(0, 0.05, true.shape), 0, 1)
    return true, wm


def time_step(n_groups: int, repeats: int, warmup: int = 20) -> tuple[float, float]:
    """Median (wall, CPU) seconds of one corrector step with ``n_groups`` groups of 8, window full.

    CPU time (this process) is reported beside wall time because a shared machine inflates wall
    time; the corrector is single-threaded, so CPU time is its own cost.
    """
    rng = np.random.default_rng(0)
    corrector = Corrector(CorrectorConfig())
    # Fill the calibration window so refits run at their steady-state size.
    while corrector.debiaser.n_pairs < corrector.config.debias.max_pairs:
        true, wm = _scores(rng, 64)
        plan = corrector.plan([f"w{corrector.step_count}:{i}" for i in range(64)])
        corrector.correct(plan, wm, np.where(plan.anchor[:, None], true, np.nan))
    wall, cpu = [], []
    for r in range(warmup + repeats):
        true, wm = _scores(rng, n_groups)
        keys = [f"{corrector.step_count}:{i}" for i in range(n_groups)]
        tasks = [f"t{i % 16}" for i in range(n_groups)]
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = corrector.plan(keys, tasks)
        corrector.correct(plan, wm, np.where(plan.anchor[:, None], true, np.nan))
        if r >= warmup:
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return float(np.median(wall)), float(np.median(cpu))


def time_refit(n_pairs: int, repeats: int) -> float:
    """Median seconds of one debiaser refit on a window of ``n_pairs`` pairs."""
    rng = np.random.default_rng(0)
    debiaser = OnlineDebiaser(DebiasConfig(max_pairs=max(n_pairs, 32)))
    steps = max(1, n_pairs // 64)
    for step in range(steps):
        m = n_pairs // steps + (1 if step < n_pairs % steps else 0)
        real = rng.random(m)
        debiaser.observe(
            step, np.clip(0.2 + 0.7 * real**2 + rng.normal(0, 0.05, m), 0, 1), real, np.arange(m) // 8
        )
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        debiaser.refit(steps)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _exponents(sizes: Sequence[int], times: Sequence[float]) -> list[float | None]:
    out: list[float | None] = [None]
    for i in range(1, len(sizes)):
        out.append(float(np.log(times[i] / times[i - 1]) / np.log(sizes[i] / sizes[i - 1])))
    return out


def run_from_cli(args: argparse.Namespace) -> int:
    repeats = 10 if args.quick else 50
    groups = GROUP_COUNTS[:4] if args.quick else GROUP_COUNTS
    buffers = BUFFER_SIZES[:3] if args.quick else BUFFER_SIZES
    measured = [time_step(n, repeats if n <= 1024 else max(5, repeats // 5)) for n in groups]
    step_times = [m[0] for m in measured]
    step_cpu = [m[1] for m in measured]
    refit_times = [time_refit(n, repeats) for n in buffers]
    print(f"Corrector step (plan + correct), groups of {GROUP_SIZE}, calibration window full (5,000 pairs):")
    print(f"{'groups':>8} {'rollouts':>9} {'wall ms':>9} {'cpu ms':>9} {'cpu µs/group':>13} {'scaling':>8}")
    for n, t, c, b in zip(groups, step_times, step_cpu, _exponents(groups, step_cpu), strict=True):
        scaling = "" if b is None else f"{b:.2f}"
        print(f"{n:>8} {n * GROUP_SIZE:>9} {t * 1e3:>9.3f} {c * 1e3:>9.3f} {c * 1e6 / n:>13.1f} {scaling:>8}")
    print("\nDebiaser refit (isotonic fit on the recency-weighted window):")
    print(f"{'pairs':>8} {'ms/refit':>9} {'scaling':>8}")
    for n, t, b in zip(buffers, refit_times, _exponents(buffers, refit_times), strict=True):
        print(f"{n:>8} {t * 1e3:>9.3f} {'' if b is None else f'{b:.2f}':>8}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "step": [
            {"groups": n, "group_size": GROUP_SIZE, "seconds": t, "cpu_seconds": c}
            for n, t, c in zip(groups, step_times, step_cpu, strict=True)
        ],
        "refit": [{"pairs": n, "seconds": t} for n, t in zip(buffers, refit_times, strict=True)],
        "target": "<= 1 ms per step at 64 groups of 8, about linear growth",
    }
    (out / "overhead.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out / 'overhead.json'}")
    return 0
