"""Success metrics over k rollouts per initial state: Avg, Best@k, All@k, by split and by task.

Definitions (the WMRL paper's, Table "LIBERO-Long"), for a set S of (task, initial state) cells,
each with k rollouts whose successes are s_1..s_k in {0, 1}:

* ``avg``        = mean over all episodes in S of s_i (the plain success rate);
* ``best_at_k``  = fraction of cells in S with at least one success (max_i s_i);
* ``all_at_k``   = fraction of cells in S where all k rollouts succeed (min_i s_i).

So ``all_at_k <= avg <= best_at_k``, with equality when k = 1. The splits are those of
:mod:`wmrl.embodied.env.splits` (in-domain states 0-15, held-out 16-49, and all). A split with no
evaluated cell has ``None`` metrics (unknown), never 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from wmrl.embodied.env.splits import SPLITS, split_of

__all__ = [
    "EpisodeOutcome",
    "SuccessMetrics",
    "across_seeds",
    "group_cells",
    "metrics_by_split",
    "per_task_metrics",
    "summarize",
    "t_interval",
    "wilson_interval",
]


@dataclass(frozen=True)
class EpisodeOutcome:
    """The success of one episode and where it came from."""

    task_id: int
    init_state: int
    rollout: int
    success: bool


@dataclass(frozen=True)
class SuccessMetrics:
    """Metrics over a set of (task, initial state) cells; rates are fractions in [0, 1] or ``None``.

    Attributes:
        n_tasks: distinct tasks among the cells.
        n_states: number of (task, initial state) cells.
        n_episodes: episodes over those cells (``n_states * k``).
        k: rollouts per cell (``None`` when there is no cell).
        avg: success rate over episodes.
        best_at_k: fraction of cells with at least one success.
        all_at_k: fraction of cells where every rollout succeeded.
    """

    n_tasks: int
    n_states: int
    n_episodes: int
    k: int | None
    avg: float | None
    best_at_k: float | None
    all_at_k: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def group_cells(outcomes: Iterable[EpisodeOutcome]) -> dict[tuple[int, int], list[bool]]:
    """Successes per (task, initial state), ordered by rollout index.

    Raises:
        ValueError: on no outcomes, a repeated (task, state, rollout), a non-boolean success,
            cells with different numbers of rollouts, or rollout indices that are not 0..k-1.
    """
    cells: dict[tuple[int, int], dict[int, bool]] = defaultdict(dict)
    count = 0
    for o in outcomes:
        count += 1
        if not isinstance(o.success, bool):
            raise ValueError(
                f"success must be a bool (unknown outcomes cannot enter success metrics); got {o!r}"
            )
        cell = cells[(o.task_id, o.init_state)]
        if o.rollout in cell:
            raise ValueError(
                f"duplicate outcome for task {o.task_id}, state {o.init_state}, rollout {o.rollout}"
            )
        cell[o.rollout] = o.success
    if count == 0:
        raise ValueError("no episode outcomes to summarise")
    sizes = {len(c) for c in cells.values()}
    if len(sizes) != 1:
        raise ValueError(
            f"every (task, initial state) needs the same number of rollouts k; got sizes {sorted(sizes)}"
        )
    k = sizes.pop()
    for key, cell in cells.items():
        if sorted(cell) != list(range(k)):
            raise ValueError(
                f"rollout indices of task {key[0]} state {key[1]} must be 0..{k - 1}; got {sorted(cell)}"
            )
    return {key: [cell[r] for r in range(k)] for key, cell in sorted(cells.items())}


def _metrics(cells: dict[tuple[int, int], list[bool]]) -> SuccessMetrics:
    if not cells:
        return SuccessMetrics(0, 0, 0, None, None, None, None)
    runs = list(cells.values())
    k = len(runs[0])
    n_eps = sum(len(r) for r in runs)
    return SuccessMetrics(
        n_tasks=len({task for task, _ in cells}),
        n_states=len(cells),
        n_episodes=n_eps,
        k=k,
        avg=sum(sum(r) for r in runs) / n_eps,
        best_at_k=sum(any(r) for r in runs) / len(runs),
        all_at_k=sum(all(r) for r in runs) / len(runs),
    )


def summarize(outcomes: Iterable[EpisodeOutcome], split: str = "all") -> SuccessMetrics:
    """Metrics over the cells of one split (``"all"``, ``"in_domain"`` or ``"held_out"``)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    cells = group_cells(outcomes)
    if split != "all":
        cells = {key: runs for key, runs in cells.items() if split_of(key[1]) == split}
    return _metrics(cells)


def metrics_by_split(outcomes: Iterable[EpisodeOutcome]) -> dict[str, SuccessMetrics]:
    """``{"all": ..., "in_domain": ..., "held_out": ...}``."""
    outcomes = list(outcomes)
    return {split: summarize(outcomes, split) for split in SPLITS}


def per_task_metrics(outcomes: Iterable[EpisodeOutcome]) -> dict[int, dict[str, SuccessMetrics]]:
    """``{task_id: metrics_by_split(that task's outcomes)}`` in task order."""
    outcomes = list(outcomes)
    group_cells(outcomes)  # validate k across the whole table, not only within each task
    by_task: dict[int, list[EpisodeOutcome]] = defaultdict(list)
    for o in outcomes:
        by_task[o.task_id].append(o)
    return {task: metrics_by_split(by_task[task]) for task in sorted(by_task)}


# -- several seeds -----------------------------------------------------------------------------------

# Two-sided 95% quantiles of Student's t by degrees of freedom (standard table values); above 30
# degrees of freedom the normal quantile 1.96 is used. A table, so the embodied extra needs no scipy.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
_T975.update({10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110})
_T975.update({18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060})
_T975.update({26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042})


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% confidence interval of the mean of ``values`` (Student's t); ``None`` for fewer than 2."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _T975.get(n - 1, 1.96) * sd / math.sqrt(n)
    return (mean - half, mean + half)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """Wilson score 95% interval of a success rate from ``successes`` of ``n`` episodes (``None`` if n = 0)."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def across_seeds(per_seed: Sequence[SuccessMetrics]) -> dict:
    """Mean over seeds of each rate, with a 95% t-interval across seeds and a Wilson interval of ``avg``.

    Each element is one seed's :class:`SuccessMetrics` over the same cells. The interval across seeds
    measures seed-to-seed variation (it is ``None`` with one seed: unknown, not zero); the Wilson
    interval treats every episode of every seed as one Bernoulli trial.
    """
    if not per_seed:
        raise ValueError("no seeds to summarise")
    first = per_seed[0]
    out: dict = {
        "n_tasks": first.n_tasks,
        "n_states": first.n_states,
        "n_episodes": sum(m.n_episodes for m in per_seed),
        "k": first.k,
        "n_seeds": len(per_seed),
    }
    for name in ("avg", "best_at_k", "all_at_k"):
        values = [getattr(m, name) for m in per_seed]
        if any(v is None for v in values):
            out[name] = None
            out[f"{name}_ci95"] = None
            continue
        out[name] = sum(values) / len(values)
        ci = t_interval(values)
        out[f"{name}_ci95"] = None if ci is None else [ci[0], ci[1]]
    n = out["n_episodes"]
    wins = round(sum((m.avg or 0.0) * m.n_episodes for m in per_seed))
    wi = wilson_interval(wins, n) if n else None
    out["avg_wilson95"] = None if wi is None else [wi[0], wi[1]]
    return out
