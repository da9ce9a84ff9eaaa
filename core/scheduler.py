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
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wmrl.core.config import require

__all__ = ["AnchorScheduler", "SchedulerConfig", "stable_uniform", "stable_uniforms"]


def stable_uniform(*parts: Any) -> float:
    """A uniform number in [0, 1) that depends only on ``parts`` (same in every process)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


_MASK64 = (1 << 64) - 1


def stable_uniforms(seed: int, step: int, keys: Sequence[str]) -> np.ndarray:
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
    """

    fraction: float = 0.1
    floor: int = 1
    max_concurrent: int | None = None
    stratify: bool = True
    active_share: float = 0.0

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
            0.0 <= self.active_share <= 1.0,
            f"scheduler.active_share must be in [0, 1]; got {self.active_share}",
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

    def select(
        self,
        step: int,
        group_keys: Sequence[str],
        task_keys: Sequence[str] | None = None,
        uncertainty: Sequence[float] | np.ndarray | None = None,
        in_flight: int = 0,
        fraction: float | None = None,
    ) -> np.ndarray:
        """Boolean mask of shape ``(n_groups,)``: True for the groups graded by real execution.

        Args:
            step: the training step (part of the hash, so each step draws afresh).
            group_keys: one unique string per group (e.g. prompt id + sample index).
            task_keys: one task id per group, for stratification (``None``: one stratum).
            uncertainty: per-group calibration uncertainty (larger = more useful to anchor), used
                by the active share; required when ``active_share > 0``.
            in_flight: anchor groups still executing from earlier steps (for the cap).
            fraction: overrides the configured fraction (the adaptive budget uses this).

        Selection does not change the scheduler's counters; :meth:`commit` does.
        """
        keys = [str(k) for k in group_keys]
        n = len(keys)
        if len(set(keys)) != n:
            raise ValueError("group keys must be unique within a step (they seed the anchor draw)")
        tasks = [""] * n if task_keys is None else [str(t) for t in task_keys]
        if len(tasks) != n:
            raise ValueError(f"got {len(tasks)} task keys for {n} groups: one per group")
        k = self.count(step, n, in_flight, fraction)
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
        self, k: int, draws: np.ndarray, tasks: list[str], taken: np.ndarray, fraction: float
    ) -> np.ndarray:
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

    def commit(self, mask: np.ndarray, task_keys: Sequence[str] | None = None) -> None:
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
