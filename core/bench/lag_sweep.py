"""``wmrl bench synthetic --lag-sweep``: asynchronous anchors on the simulated problem.

For each anchor lag ``d`` (``corrector.asynchrony.max_anchor_lag``) the ``wmrl`` arm (the default
design, whatever the corrector settings given) runs on the same seeds as with ``d = 0``, with the
configured ``late_update``; extra rows run the other late updates and the importance-weighted late
gradient at one lag. It reports:

* the final true reward (mean ± 95% t-interval over seeds) and the per-seed paired difference against
  ``d = 0`` (equal steps; executions per step are nearly equal, so equal steps is close to equal cost:
  the executions spent are reported);
* the **modelled** wall time of the run for execution latencies ``L`` (in step-times: one step's
  generation and world-model scoring take 1), as a ratio to the synchronous run at the same ``L``
  (:func:`wmrl.core.late.modelled_step_times`). It is a model of the timeline, not a measurement: a
  synchronous step with executions lasts ``1 + L``, an asynchronous one waits only for what is due.

A reward does not depend on ``L`` here: a step's executions always land ``d`` steps later (the run
waits for them if needed), so ``L`` changes only how long that wait is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.bench.intervals import ci95
from wmrl.core.bench.simulation import ArmResult, SimConfig, run_arm
from wmrl.core.late import LATE_UPDATES, modelled_step_times
from wmrl.core.modes import apply_changes

__all__ = ["LAGS", "LATENCIES", "format_lag_sweep", "lag_sweep"]

LAGS = (0, 1, 2, 4, 8)
LATENCIES = (1.0, 2.0, 4.0, 8.0)


def _rows(lags: Sequence[int], default: str) -> list[tuple[str, int, dict[str, Any], float | None]]:
    """(label, lag, corrector changes, importance clip) per row of the sweep: every lag with the
    configured late update (``default``), then the other late updates and the importance weight at one lag."""
    rows: list[tuple[str, int, dict[str, Any], float | None]] = [
        (f"lag {d}", d, {"asynchrony.max_anchor_lag": d}, None) for d in lags
    ]
    probe = next((d for d in lags if d >= 2), None) or next((d for d in lags if d > 0), None)
    if probe is not None:
        for update in LATE_UPDATES:
            if update != default:
                changes = {"asynchrony.max_anchor_lag": probe, "asynchrony.late_update": update}
                rows.append((f"lag {probe}, {update}", probe, changes, None))
        rows.append((f"lag {probe}, IS clip 2", probe, {"asynchrony.max_anchor_lag": probe}, 2.0))
    return rows


def lag_sweep(
    cfg: SimConfig,
    seeds: Sequence[int],
    lags: Sequence[int] = LAGS,
    latencies: Sequence[float] = LATENCIES,
    run: Any = run_arm,
    arm: str = "wmrl",
) -> dict[str, Any]:
    """Run the sweep (see the module docstring); returns a JSON-able result."""
    if 0 not in lags:
        lags = (0, *lags)
    out: dict[str, Any] = {"arm": arm, "seeds": list(seeds), "latencies": list(latencies), "rows": []}
    baseline: npt.NDArray[Any] | None = None
    sync_walls: dict[float, npt.NDArray[Any]] = {}
    for label, lag, changes, clip in _rows(lags, cfg.corrector.asynchrony.late_update):
        row_cfg = replace(cfg, corrector=apply_changes(cfg.corrector, changes), late_importance_clip=clip)
        results: list[ArmResult] = [run(row_cfg, arm, s) for s in seeds]
        final = np.array([r.true_reward[-1] for r in results])
        walls = {
            latency: np.array(
                [modelled_step_times([e > 0 for e in r.executions], latency, lag)[-1] for r in results]
            )
            for latency in latencies
        }
        if lag == 0 and baseline is None:
            baseline = final
            sync_walls = walls
        paired = final - baseline if baseline is not None else None
        out["rows"].append(
            {
                "label": label,
                "lag": lag,
                "late_update": row_cfg.corrector.asynchrony.late_update,
                "importance_clip": clip,
                "final_true_reward": float(final.mean()),
                "final_true_reward_ci95": ci95(final),
                "paired_vs_lag0": None if paired is None else float(paired.mean()),
                "paired_vs_lag0_ci95": None if paired is None else ci95(paired),
                "executions": float(np.mean([r.executions.sum() for r in results])),
                "modelled_wall": {f"{L:g}": float(w.mean()) for L, w in walls.items()},
                "modelled_speedup_vs_sync": {
                    f"{L:g}": float(np.mean(sync_walls[L] / w)) for L, w in walls.items()
                },
            }
        )
    return out


def format_lag_sweep(result: dict[str, Any]) -> str:
    """The sweep as a text table."""
    lat = [f"{L:g}" for L in result["latencies"]]
    head = f"{'row':<18} {'final reward':>16} {'vs lag 0 (paired)':>20} {'executions':>11} " + " ".join(
        f"{'L=' + x:>7}" for x in lat
    )
    lines = [head]
    for row in result["rows"]:
        paired = (
            "-"
            if row["lag"] == 0 and row["label"] == "lag 0"
            else f"{row['paired_vs_lag0']:+.3f} ± {row['paired_vs_lag0_ci95']:.3f}"
        )
        speed = " ".join(f"{row['modelled_speedup_vs_sync'][x]:>6.2f}x" for x in lat)
        lines.append(
            f"{row['label']:<18} {row['final_true_reward']:>8.3f} ± {row['final_true_reward_ci95']:.3f} "
            f"{paired:>20} {row['executions']:>11.0f} {speed}"
        )
    lines.append(
        "L=...: modelled wall-time speedup over the synchronous run at execution latency L step-times "
        "(a model of the timeline, not a measurement)"
    )
    return "\n".join(lines)
