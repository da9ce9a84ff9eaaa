"""Arms compared at equal cost: what each buys for the compute it spends.

Equal steps say how much cheaper a step is; a user needs the quality they get for what they spend.
Every function here reads per-seed curves of one arm: the true reward after each step,
``(steps + 1,)``, and the cumulative cost after each step, ``(steps + 1,)`` (0 before training).
A curve is a step function of cost: the reward an arm *has* at cost ``c`` is its reward after the
last step whose cumulative cost is at most ``c``. Arms run until they reach the cost they are read
at (``run_arm(..., until_cost=...)``); a curve that stops short of ``c`` is unknown there (``None``),
never extrapolated.

Definitions (all on the seed-mean or per seed, as named):

* ``reward_at(c)``: per seed, the reward at cost ``c``; mean and 95% t-interval over seeds.
* ``cost_to(level)``: the cost at which the *seed-mean* reward curve (on a common cost grid) first
  reaches ``level``; ``None`` when it never does within the costs run.
* ``paired(a, b, c)``: per seed ``reward_a(c) − reward_b(c)`` (same seed = same landscape, world
  model and initial policy), mean and 95% t-interval of the differences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.bench.intervals import ci95, mean_ci

__all__ = [
    "ci95",
    "cost_to",
    "equal_cost_summary",
    "format_equal_cost",
    "mean_ci",
    "mean_curve",
    "paired",
    "reward_at",
]


def reward_at(reward: npt.NDArray[Any], cost: npt.NDArray[Any], at: float) -> float | None:
    """The reward a run has at cumulative cost ``at`` (``None`` when it stopped before spending it).

    Args:
        reward: ``(steps + 1,)`` true reward after each step (index 0: before training).
        cost: ``(steps + 1,)`` cumulative cost after each step, non-decreasing, ``cost[0] = 0``.
    """
    reward, cost = np.asarray(reward, dtype=float), np.asarray(cost, dtype=float)
    if cost[-1] < at and not np.isclose(cost[-1], at):
        return None
    last = int(np.searchsorted(cost, at * (1 + 1e-12), side="right")) - 1
    return float(reward[max(last, 0)])


def mean_curve(
    rewards: Sequence[npt.NDArray[Any]], costs: Sequence[npt.NDArray[Any]], grid: npt.NDArray[Any]
) -> npt.NDArray[Any]:
    """Seed-mean reward on a cost ``grid`` (NaN at grid points some seed did not reach)."""
    out = np.full((len(rewards), grid.size), np.nan)
    for i, (r, c) in enumerate(zip(rewards, costs, strict=True)):
        for j, at in enumerate(grid):
            value = reward_at(r, c, float(at))
            if value is not None:
                out[i, j] = value
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(out).any(axis=0), np.nan, out.mean(axis=0))


def cost_to(
    rewards: Sequence[npt.NDArray[Any]],
    costs: Sequence[npt.NDArray[Any]],
    level: float,
    grid_points: int = 400,
) -> float | None:
    """The cost at which the seed-mean reward first reaches ``level`` (``None``: never, in the costs run).

    The grid is every step's cost of the first seed's run, thinned to ``grid_points`` points per
    decade-free linear span up to the smallest final cost over seeds, plus the exact step costs of
    the seed-mean curve (so an arm's first crossing is found at its own resolution).
    """
    top = min(float(np.asarray(c)[-1]) for c in costs)
    if top <= 0:
        return None
    own = np.unique(np.concatenate([np.asarray(c, dtype=float) for c in costs]))
    own = own[own <= top]
    if own.size > grid_points * 4:
        own = own[np.linspace(0, own.size - 1, grid_points * 4).astype(int)]
    grid = np.unique(np.concatenate([own, np.linspace(0.0, top, grid_points)]))
    curve = mean_curve(rewards, costs, grid)
    hit = np.flatnonzero(curve >= level)
    return float(grid[hit[0]]) if hit.size else None


def paired(
    a: Sequence[tuple[npt.NDArray[Any], npt.NDArray[Any]]],
    b: Sequence[tuple[npt.NDArray[Any], npt.NDArray[Any]]],
    at: float,
) -> dict[str, float | int | None]:
    """Per-seed differences ``reward_a(at) − reward_b(at)`` (seeds in the same order), mean and 95% CI.

    ``a``, ``b``: per seed ``(reward, cost)`` curves. Seeds where either run stopped short are left out.
    """
    diffs = []
    for (ra, ca), (rb, cb) in zip(a, b, strict=True):
        va, vb = reward_at(ra, ca, at), reward_at(rb, cb, at)
        if va is not None and vb is not None:
            diffs.append(va - vb)
    summary: dict[str, float | int | None] = mean_ci(diffs)
    return summary


#: ``{arm: {seed: (reward, cost)}}``: each arm's per-seed curves, ``(steps + 1,)`` each or longer.
Curves = Mapping[str, Mapping[int, tuple[npt.NDArray[Any], npt.NDArray[Any]]]]


def equal_cost_summary(
    curves: Curves, seeds: Sequence[int], steps: int, references: Sequence[str] = ("real_cache",)
) -> dict[str, Any]:
    """Every arm against ``real`` (which must be in ``curves``) at equal steps and at equal cost.

    Per arm: ``reward_at_steps`` and ``cost_at_steps`` (after ``steps`` steps), ``reward_at_real_cost``
    and ``reward_at_third`` (at ``real``'s mean cost after ``steps`` steps, and a third of it; each
    run must have been continued that far), ``cost_to_95`` / ``cost_to_100`` (the cost at which the
    seed-mean curve first reaches 95% / 100% of ``real``'s final reward; ``None``: never within
    the costs run), and ``paired[ref]``: per-seed differences against each reference arm at steps,
    at ``real``'s cost and at a third of it.
    """
    real = curves["real"]
    real_final = float(np.mean([real[s][0][steps] for s in seeds]))
    real_cost = float(np.mean([real[s][1][steps] for s in seeds]))
    out: dict[str, Any] = {"real_final": real_final, "real_cost": real_cost, "steps": steps, "arms": {}}
    for arm, per_seed in curves.items():
        runs = [(np.asarray(per_seed[s][0]), np.asarray(per_seed[s][1])) for s in seeds]
        row: dict[str, Any] = {
            "reward_at_steps": mean_ci([r[steps] for r, _ in runs]),
            "cost_at_steps": float(np.mean([c[steps] for _, c in runs])),
            "reward_at_real_cost": mean_ci([reward_at(r, c, real_cost) for r, c in runs]),
            "reward_at_third": mean_ci([reward_at(r, c, real_cost / 3) for r, c in runs]),
            "cost_to_95": cost_to([r for r, _ in runs], [c for _, c in runs], 0.95 * real_final),
            "cost_to_100": cost_to([r for r, _ in runs], [c for _, c in runs], real_final),
            "paired": {},
        }
        for ref in references:
            if ref == arm or ref not in curves:
                continue
            ref_runs = [(np.asarray(curves[ref][s][0]), np.asarray(curves[ref][s][1])) for s in seeds]
            row["paired"][ref] = {
                "at_steps": mean_ci([a[0][steps] - b[0][steps] for a, b in zip(runs, ref_runs, strict=True)]),
                "at_real_cost": paired(runs, ref_runs, real_cost),
                "at_third": paired(runs, ref_runs, real_cost / 3),
            }
        out["arms"][arm] = row
    return out


def _cell(cell: Mapping[str, Any] | None) -> str:
    if cell is None or cell.get("mean") is None:
        return "—"
    return f"{cell['mean']:.3f} ± {cell['ci95']:.3f}"


def _k(value: float | None) -> str:
    return "never" if value is None else f"{value / 1000:.1f}k"


def format_equal_cost(summary: Mapping[str, Any]) -> str:
    """The summary as a text table (reward ± 95% CI over seeds; costs in thousands of units)."""
    steps = summary["steps"]
    lines = [
        f"real: final reward {summary['real_final']:.3f} after {steps} steps, at cost {summary['real_cost']:.0f}",
        f"{'arm':<22}{f'@{steps} steps':>16}{'cost':>9}{'@real cost':>16}{'@cost/3':>16}{'→95%':>9}{'→100%':>9}",
    ]
    for arm, row in summary["arms"].items():
        lines.append(
            f"{arm:<22}{_cell(row['reward_at_steps']):>16}{_k(row['cost_at_steps']):>9}"
            f"{_cell(row['reward_at_real_cost']):>16}{_cell(row['reward_at_third']):>16}"
            f"{_k(row['cost_to_95']):>9}{_k(row['cost_to_100']):>9}"
        )
    refs = sorted({ref for row in summary["arms"].values() for ref in row["paired"]})
    for ref in refs:
        lines.append(
            f"\npaired per seed against {ref} (at {steps} steps | at real's cost | at a third of it):"
        )
        for arm, row in summary["arms"].items():
            p = row["paired"].get(ref)
            if p:
                lines.append(
                    f"  {arm:<20}{_cell(p['at_steps']):>16}{_cell(p['at_real_cost']):>16}{_cell(p['at_third']):>16}"
                )
    return "\n".join(lines)
