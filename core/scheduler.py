"""Anchor scheduling: which GRPO groups are graded by real execution this step.

Selection is a pure function of ``(seed, step, group keys)`` plus counters that every rank
updates identically, so separate processes (ranks of a multi-GPU run) agree on the anchor set
without communicating. It never looks at real outcomes: the anchor stream must stay an
unbiased sample of what the world model grades, or the calibration it feeds is biased.

Per step, with ``n`` groups and target fraction ``f``:

1. ``k`` is ``f·n`` rounded stochastically with a hashed coin, so the long-run fraction is
   exactly ``f`` in expectation without per-rank state;
2. the floor raises ``k`` to at least ``floor`` (calibration must never starve);
3. a concurrency cap lowers ``k`` to the free anchor slots, **but never below the floor**: when
   the two conflict the cap yields, because a step with no anchors silently stops the
   correction while one extra execution in flight only costs time;
4. the ``k`` groups are chosen: optionally a share *actively* (the groups whose world-model
   scores sit where the calibration is least certain), the rest *stratified* by task (the task
   whose anchors lag its share of groups most goes first) or uniformly at random, ties broken by a
   per-(seed, step, key) hash.

Two optional ways to spend executions below the group level, both outcome-blind:

* *per-rollout anchors* (``rollout_share``): that share of the budget beyond the floor is spent on
  single rollouts instead of whole groups, at the same number of executions: each chosen group's
  top-scored rollout (the one the world model pushes the policy toward hardest), then the
  second-ranked, and so on (:meth:`AnchorScheduler.select_rollouts`). Selection reads only
  world-model scores, so the calibration's ``E[r | x]`` stays unbiased;
* *repeats* (``repeat_share``): that share of the executed rollouts is executed a second time, so
  the execution noise can be measured (:meth:`AnchorScheduler.select_repeats`).
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.config import require

__all__ = ["AnchorScheduler", "SchedulerConfig", "stable_uniform", "stable_uniforms"]


def stable_uniform(*parts: Any) -> float:
    """A uniform number in [0, 1) that depends only on ``parts`` (same in every process)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


_MASK64 = (1 << 64) - 1


def stable_uniforms(seed: int, step: int, keys: Sequence[str]) -> npt.NDArray[Any]:
    """One uniform in [0, 1) per key, depending only on ``(seed, step, key)``; shape ``(len(keys),)``.

    Each key is reduced with CRC-32 (stable across processes, unlike ``hash``) and mixed with the
    seed and step by SplitMix64's finaliser, vectorised: a few microseconds for thousands of groups.
    """
    h = np.fromiter((zlib.crc32(k.encode()) for k in keys), dtype=np.uint64, count=len(keys))
    base = np.uint64((stable_uniform_int(seed, step)) & _MASK64)
    with np.errstate(over="ignore"):
        z = h * np.uint64(0x9E3779B97F4A7C15) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def stable_uniform_int(*parts: Any) -> int:
    """A 64-bit integer that depends only on ``parts``."""
    return int.from_bytes(
        hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "little"
    )


@dataclass(frozen=True)
class SchedulerConfig:
    """How many groups are anchored and how they are chosen.

    Attributes:
        fraction: target share of groups graded by real execution, in [0, 1].
        floor: minimum anchor groups per step (the calibration's lifeline); 0 allows anchor-free steps.
        max_concurrent: cap on anchor groups in flight (``None`` = no cap). Yields to ``floor``.
        stratify: choose anchors so that every task's share of anchors tracks its share of groups.
        active_share: share of each step's anchors chosen actively (0 = none, 1 = all), preferring
            groups whose world-model scores fall where the calibration is least certain.
        rollout_share: share of the execution budget beyond ``floor`` spent on single rollouts
            (each chosen group's top-scored one) instead of whole groups (0 = whole groups only).
        rollout_depth: single rollouts are chosen only among each group's ``rollout_depth``
            top-ranked distinct solutions, ranked by what is known (the execution memory's outcome,
            else the world model's score): with 1, a group's best-looking solution is executed
            unless it is already known, and nothing else. ``None``: any rank, until the budget is spent.
        reject_share: share of the single-rollout budget spent on solutions the world model ranks
            in the bottom half of their group (its possible false negatives) instead of the top.
        repeat_share: share of executed rollouts executed a second time to measure execution
            noise (0 = off). Repeats cost executions on top of the budget.
    """

    fraction: float = 0.1
    floor: int = 1
    max_concurrent: int | None = None
    stratify: bool = True
    active_share: float = 0.0
    rollout_share: float = 0.0
    rollout_depth: int | None = None
    reject_share: float = 0.0
    repeat_share: float = 0.0

    def __post_init__(self) -> None:
        require(
            isinstance(self.fraction, (int, float)) and 0.0 <= self.fraction <= 1.0,
            f"scheduler.fraction must be in [0, 1]; got {self.fraction}",
        )
        require(
            isinstance(self.floor, int) and self.floor >= 0,
            f"scheduler.floor must be an integer >= 0; got {self.floor}",
        )
        require(
            self.max_concurrent is None
            or (isinstance(self.max_concurrent, int) and self.max_concurrent >= 1),
            f"scheduler.max_concurrent must be None or an integer >= 1; got {self.max_concurrent}",
        )
        require(
            self.rollout_depth is None
            or (
                isinstance(self.rollout_depth, int)
                and not isinstance(self.rollout_depth, bool)
                and self.rollout_depth >= 1
            ),
            f"scheduler.rollout_depth must be None or an integer >= 1; got {self.rollout_depth!r}",
        )
        for name in ("active_share", "rollout_share", "reject_share", "repeat_share"):
            value = getattr(self, name)
            require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0,
                f"scheduler.{name} must be in [0, 1]; got {value!r}",
            )


class AnchorScheduler:
    """Chooses anchor groups deterministically; see the module docstring for the rules."""

    def __init__(self, config: SchedulerConfig | None = None, seed: int = 0) -> None:
        self.config = config or SchedulerConfig()
        self.seed = int(seed)
        self.total_groups = 0
        self.total_anchors = 0
        self._seen: dict[str, int] = {}
        self._anchored: dict[str, int] = {}

    def describe(self, n_groups: int, group_size: int, fraction: float | None = None) -> str:
        """What this scheduler executes per step, in words (the one place a log line asks)."""
        cfg = self.config
        f = cfg.fraction if fraction is None else fraction
        whole = (
            f"at least {cfg.floor} whole anchor group(s) a step" if cfg.floor else "no whole anchor groups"
        )
        if cfg.rollout_share >= 1.0:
            depth = "" if cfg.rollout_depth is None else f" among its {cfg.rollout_depth} top-ranked"
            return (
                f"per-rollout anchors: in each of the {n_groups} groups of {group_size}, up to {f * group_size:g} "
                f"solutions{depth} not yet known are executed for real, best-ranked first (fraction {f:g}); {whole}"
            )
        k = min(max(f * n_groups, cfg.floor), n_groups)
        text = f"{k:g} of the {n_groups} groups of each step are executed for real (fraction {f:g}, floor {cfg.floor})"
        if cfg.rollout_share > 0:
            text += f", {cfg.rollout_share:g} of the budget beyond the floor on single top-ranked rollouts"
        return text

    # -- selection ---------------------------------------------------------------------------
    def count(self, step: int, n_groups: int, in_flight: int = 0, fraction: float | None = None) -> int:
        """Number of anchor groups for a step with ``n_groups`` groups."""
        if n_groups == 0:
            return 0
        f = self.config.fraction if fraction is None else fraction
        require(0.0 <= f <= 1.0, f"anchor fraction must be in [0, 1]; got {f}")
        quota = f * n_groups
        k = math.floor(quota)
        if stable_uniform(self.seed, step, "__count__") < quota - k:
            k += 1
        k = min(max(k, self.config.floor), n_groups)
        if self.config.max_concurrent is not None:
            room = max(self.config.max_concurrent - max(in_flight, 0), 0)
            k = max(min(k, room), min(self.config.floor, n_groups))
        return k

    def split(self, step: int, k: int, n_groups: int) -> int:
        """Whole anchor groups out of a budget of ``k`` group-equivalents (the rest goes to single rollouts).

        ``(1 - rollout_share)·k`` rounded with a hashed coin, never below the floor, never above ``k``.
        """
        share = self.config.rollout_share
        if share <= 0 or k == 0:
            return k
        quota = (1.0 - share) * k
        whole = math.floor(quota)
        if stable_uniform(self.seed, step, "__split__") < quota - whole:
            whole += 1
        return int(min(max(whole, min(self.config.floor, n_groups)), k))

    def select(
        self,
        step: int,
        group_keys: Sequence[str],
        task_keys: Sequence[str] | None = None,
        uncertainty: Sequence[float] | npt.NDArray[Any] | None = None,
        in_flight: int = 0,
        fraction: float | None = None,
        count: int | None = None,
    ) -> npt.NDArray[Any]:
        """Boolean mask of shape ``(n_groups,)``: True for the groups graded by real execution.

        Args:
            step: the training step (part of the hash, so each step draws afresh).
            group_keys: one unique string per group (e.g. prompt id + sample index).
            task_keys: one task id per group, for stratification (``None``: one stratum).
            uncertainty: per-group calibration uncertainty (larger = more useful to anchor), used
                by the active share; required when ``active_share > 0``.
            in_flight: anchor groups still executing from earlier steps (for the cap).
            fraction: overrides the configured fraction (the adaptive budget uses this).
            count: the number of groups to choose, when the caller has already split the budget
                (:meth:`split`); default :meth:`count`.

        Selection does not change the scheduler's counters; :meth:`commit` does.
        """
        keys = [str(k) for k in group_keys]
        n = len(keys)
        if len(set(keys)) != n:
            raise ValueError("group keys must be unique within a step (they seed the anchor draw)")
        tasks = [""] * n if task_keys is None else [str(t) for t in task_keys]
        if len(tasks) != n:
            raise ValueError(f"got {len(tasks)} task keys for {n} groups: one per group")
        k = self.count(step, n, in_flight, fraction) if count is None else int(count)
        mask = np.zeros(n, dtype=bool)
        if k == 0:
            return mask
        draws = stable_uniforms(self.seed, step, keys)
        n_active = round(self.config.active_share * k)
        if n_active:
            if uncertainty is None:
                raise ValueError("scheduler.active_share > 0 needs per-group uncertainty scores")
            u = np.asarray(uncertainty, dtype=float)
            if u.shape != (n,) or not np.all(np.isfinite(u)):
                raise ValueError(f"uncertainty must be {n} finite numbers, one per group")
            # Highest uncertainty first; the hash breaks ties so the choice stays deterministic.
            order = np.lexsort((draws, -u))
            mask[order[:n_active]] = True
        remaining = k - int(mask.sum())
        if remaining:
            f = self.config.fraction if fraction is None else fraction
            mask |= self._pick(remaining, draws, tasks, mask, fraction=max(f, k / n))
        return mask

    def _pick(
        self, k: int, draws: npt.NDArray[Any], tasks: list[str], taken: npt.NDArray[Any], fraction: float
    ) -> npt.NDArray[Any]:
        mask = np.zeros(len(draws), dtype=bool)
        by_draw = np.argsort(draws, kind="stable")
        free = by_draw[~taken[by_draw]].tolist()
        if not self.config.stratify:
            mask[free[:k]] = True
            return mask
        # A task's deficit = anchors owed for its share of groups so far (this step included)
        # minus anchors it got. The most indebted task goes next; hashes order within a task.
        deficit: dict[str, float] = {}
        for t, was_taken in zip(tasks, taken.tolist(), strict=True):
            if t not in deficit:
                deficit[t] = fraction * self._seen.get(t, 0) - self._anchored.get(t, 0)
            deficit[t] += fraction - float(was_taken)
        queues: dict[str, list[int]] = {}
        for i in free:
            queues.setdefault(tasks[i], []).append(i)
        for _ in range(k):
            task = max((t for t in queues if queues[t]), key=lambda t: (deficit[t], -draws[queues[t][0]]))
            mask[queues[task].pop(0)] = True
            deficit[task] -= 1.0
        return mask

    def select_rollouts(
        self,
        step: int,
        group_keys: Sequence[str],
        wm_scores: npt.NDArray[Any],
        anchor: npt.NDArray[Any],
        budget: int,
        solution_keys: npt.NDArray[Any] | None = None,
        known: npt.NDArray[Any] | None = None,
        known_values: npt.NDArray[Any] | None = None,
        calibrated: npt.NDArray[Any] | None = None,
        per_group: float | None = None,
        in_flight: frozenset[str] = frozenset(),
    ) -> npt.NDArray[Any]:
        """Single rollouts to execute outside the anchor groups, shape ``(n_groups, G)`` bool.

        Each group's rollouts are ranked by their current estimate: the real outcome where the
        execution memory knows it (``known``, ``known_values``), the world-model score otherwise
        (``calibrated``: through the calibration map, which puts it on the real outcomes' scale; ties
        of the map's flat steps broken by the raw score, then by column). Candidates are the rollouts
        of non-anchor groups with a world-model score and no known outcome whose rank is below
        ``scheduler.rollout_depth`` (``None``: any rank).

        * ``per_group=None``: the ``budget`` highest-priority candidates over the step: first every
          group's top-ranked candidate, then every group's second, and so on; within a rank the group
          order is the per-(seed, step, key) hash.
        * ``per_group=q``: each group, in order, executes its ``q`` (hash-rounded per group)
          top-ranked candidates. A group's choice then depends only on its own scores and the groups
          before it, so its executions can start as soon as its world-model scores are in
          (:meth:`select_group`); ``budget`` is ignored.

        A share ``scheduler.reject_share`` of the executions goes instead to candidates ranked in the
        bottom half of their group (one per group, in hash order): the false negatives a top-ranked
        selection never tests.

        With ``solution_keys`` (``(n_groups, G)`` object, ``None`` = unknown) a solution is executed
        once per step: ranks count distinct solutions within a group, and a solution already in an
        anchor group or already chosen is skipped (its real score serves every rollout of it), as is
        one whose execution is still ``in_flight`` from an earlier step (asynchronous anchors).
        """
        wm = np.asarray(wm_scores, dtype=float)
        n, width = wm.shape
        mask = np.zeros((n, width), dtype=bool)
        if per_group is None and budget <= 0:
            return mask
        anchor = np.asarray(anchor, dtype=bool)
        known_real = np.zeros((n, width), dtype=bool) if known is None else np.asarray(known, dtype=bool)
        values = None if known_values is None else np.asarray(known_values, dtype=float)
        cal = None if calibrated is None else np.asarray(calibrated, dtype=float)
        keys = None if solution_keys is None else np.asarray(solution_keys, dtype=object)
        covered = set() if keys is None else {k for k in keys[anchor].reshape(-1).tolist() if k is not None}
        covered |= set(in_flight) if keys is not None else set()
        if per_group is not None:
            for r in range(n):
                if anchor[r]:
                    continue
                mask[r] = self.select_group(
                    step,
                    group_keys[r],
                    wm[r],
                    per_group,
                    None if keys is None else keys[r],
                    known_real[r],
                    None if values is None else values[r],
                    None if cal is None else cal[r],
                    covered,
                )
            return mask
        draws = stable_uniforms(self.seed, step, [f"{k}\x1frollout" for k in group_keys])
        top, bottom = [], []  # (distinct rank, draw, row, col, key)
        for r in range(n):
            if anchor[r]:
                continue
            row_top, row_bottom = self._rank_group(
                wm[r],
                None if keys is None else keys[r],
                known_real[r],
                None if values is None else values[r],
                None if cal is None else cal[r],
            )
            top += [(rank, draws[r], r, c, key) for rank, c, key in row_top]
            bottom += [(0, draws[r], r, c, key) for _, c, key in row_bottom]
        rejects = self._rounded(self.config.reject_share * budget, step, "__reject__")
        chosen_rows: set[int] = set()
        for _, _, r, c, key in sorted(bottom, key=lambda t: t[1]):
            if rejects <= 0:
                break
            if r in chosen_rows or (key is not None and key in covered):
                continue
            if key is not None:
                covered.add(key)
            chosen_rows.add(r)
            mask[r, c] = True
            rejects -= 1
            budget -= 1
        for _, _, r, c, key in sorted(top, key=lambda t: (t[0], t[1])):
            if budget <= 0:
                break
            if mask[r, c] or (key is not None and key in covered):
                continue
            if key is not None:
                covered.add(key)
            mask[r, c] = True
            budget -= 1
        return mask

    def select_group(
        self,
        step: int,
        group_key: str,
        wm_row: npt.NDArray[Any],
        quota: float,
        keys_row: npt.NDArray[Any] | None = None,
        known_row: npt.NDArray[Any] | None = None,
        values_row: npt.NDArray[Any] | None = None,
        calibrated_row: npt.NDArray[Any] | None = None,
        covered: set[str] | None = None,
    ) -> npt.NDArray[Any]:
        """One group's single rollouts to execute, ``(G,)`` bool (the ``per_group`` rule of
        :meth:`select_rollouts`): ``quota`` rounded with a per-(seed, step, group) hashed coin, its
        reject share likewise, each solution at most once per step (``covered``, updated in place)."""
        width = len(wm_row)
        out = np.zeros(width, dtype=bool)
        covered = set() if covered is None else covered
        count = self._rounded(quota, step, group_key, "__quota__")
        if count <= 0:
            return out
        top, bottom = self._rank_group(
            np.asarray(wm_row, dtype=float),
            keys_row,
            np.zeros(width, dtype=bool) if known_row is None else np.asarray(known_row, dtype=bool),
            values_row,
            calibrated_row,
        )
        rejects = min(self._rounded(self.config.reject_share * count, step, group_key, "__reject__"), 1)
        if rejects and bottom:
            # a hashed pick among the bottom half, so which false negative is tested is not always the worst
            order = stable_uniforms(self.seed, step, [f"{group_key}\x1fbottom\x1f{c}" for _, c, _ in bottom])
            for index in np.argsort(order, kind="stable").tolist():
                _, c, key = bottom[index]
                if key is None or key not in covered:
                    out[c] = True
                    count -= 1
                    if key is not None:
                        covered.add(key)
                    break
        for _, c, key in top:
            if count <= 0:
                break
            if out[c] or (key is not None and key in covered):
                continue
            out[c] = True
            count -= 1
            if key is not None:
                covered.add(key)
        return out

    def _rounded(self, quota: float, *parts: Any) -> int:
        """``quota`` rounded down or up with a coin hashed from ``(seed, *parts)`` (exact in expectation)."""
        whole = math.floor(quota)
        if stable_uniform(self.seed, *parts) < quota - whole:
            whole += 1
        return int(whole)

    def _rank_group(
        self,
        wm: npt.NDArray[Any],
        keys: npt.NDArray[Any] | None,
        known: npt.NDArray[Any],
        values: npt.NDArray[Any] | None,
        calibrated: npt.NDArray[Any] | None,
    ) -> tuple[list[tuple[int, int, Any]], list[tuple[int, int, Any]]]:
        """One group's candidates: ``(top, bottom)`` lists of ``(distinct rank, column, key)``, top in
        rank order (within ``rollout_depth``), bottom the candidates in the lower half of the ranking."""
        width = wm.size
        estimate = wm.copy() if calibrated is None else np.asarray(calibrated, dtype=float).copy()
        if values is not None:
            estimate = np.where(known, values, estimate)
        ranked = ~np.isnan(estimate)
        candidate = ranked & ~known & ~np.isnan(wm)
        order = np.lexsort(
            (
                np.arange(width),
                np.where(ranked & ~np.isnan(wm), -wm, 0.0),
                np.where(ranked, -estimate, np.inf),
            )
        )
        listed = [c for c in order.tolist() if ranked[c]]
        depth = self.config.rollout_depth
        seen: set[str] = set()
        rank = 0
        top, bottom = [], []
        for position, c in enumerate(listed):
            key = None if keys is None else keys[c]
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            rank += 1
            if not candidate[c]:
                continue
            if depth is None or rank <= depth:
                top.append((rank, c, key))
            if position >= len(listed) / 2:
                bottom.append((rank, c, key))
        return top, bottom

    def select_repeats(
        self, step: int, group_keys: Sequence[str], execute: npt.NDArray[Any]
    ) -> npt.NDArray[Any]:
        """Executed rollouts to execute a second time, shape ``(n_groups, G)`` bool.

        Each executed rollout is repeated when its per-(seed, step, group key, column) hash falls
        below ``repeat_share``: exact in expectation, the same on every rank.
        """
        execute = np.asarray(execute, dtype=bool)
        share = self.config.repeat_share
        if share <= 0 or not execute.any():
            return np.zeros_like(execute)
        rows, cols = np.nonzero(execute)
        draws = stable_uniforms(
            self.seed, step, [f"{group_keys[r]}\x1frepeat\x1f{c}" for r, c in zip(rows, cols, strict=True)]
        )
        mask = np.zeros_like(execute)
        mask[rows, cols] = draws < share
        return mask

    def commit(self, mask: npt.NDArray[Any], task_keys: Sequence[str] | None = None) -> None:
        """Record a step's selection (call once per step, with the mask :meth:`select` returned)."""
        mask = np.asarray(mask, dtype=bool)
        tasks = [""] * len(mask) if task_keys is None else [str(t) for t in task_keys]
        for t, chosen in zip(tasks, mask.tolist(), strict=True):
            self._seen[t] = self._seen.get(t, 0) + 1
            self._anchored[t] = self._anchored.get(t, 0) + int(chosen)
        self.total_groups += len(mask)
        self.total_anchors += int(mask.sum())

    @property
    def realised_fraction(self) -> float:
        """Share of all groups so far that were anchored (0 before any step)."""
        return self.total_anchors / self.total_groups if self.total_groups else 0.0

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "total_groups": self.total_groups,
            "total_anchors": self.total_anchors,
            "seen": dict(self._seen),
            "anchored": dict(self._anchored),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.total_groups = int(state["total_groups"])
        self.total_anchors = int(state["total_anchors"])
        self._seen = {str(k): int(v) for k, v in state["seen"].items()}
        self._anchored = {str(k): int(v) for k, v in state["anchored"].items()}
