"""Anchors off the critical path: real executions in flight while training goes on, and what they
contribute when they land.

With ``max_anchor_lag = d > 0`` a step's real executions are submitted and not awaited. The step
trains at once on what is known: the world model's calibrated scores (an executed rollout in flight
is graded like any other until its result is in), the execution memory, and whatever has landed. The
executions of step ``t`` are consumed at the start of step ``t + d`` exactly (the trainer waits for
them there if they are still running): a fixed landing step keeps a run deterministic for its seed,
whatever the sandboxes' timing. When they land:

* their (world model, real) pairs feed the calibration, the fusion's measurements and the memory,
  before step ``t + d`` is planned and corrected;
* their groups' gradient is applied in step ``t + d``'s update: the advantages of step ``t``'s groups
  recomputed with the landed real scores in place of what was used at ``t``
  (:func:`late_advantages`). ``late_update="correction"`` applies the *difference* from what step
  ``t`` already applied, so each group's total contribution over the two steps is what a synchronous
  step would have applied (stale by ``d`` steps); ``"full"`` applies the recomputed advantages again
  (the rollouts count twice, as in the design experiment in ``docs/method.md``).

``overdue_after_s`` bounds the wait at the landing step: an execution still running then is
*overdue*; the step goes on without it and, when it lands, its pairs are used for calibration and
the memory only (no gradient, and the run is no longer deterministic: the metrics count them).

A step that writes a checkpoint first waits for every execution in flight and applies it, and runs
its own executions synchronously, so a checkpoint never holds executions in flight: a run resumed
from it (after ``kill -9``) continues exactly as the run that was never stopped, which drained at
the same steps. (Resubmitting in-flight executions on resume would need every domain to serialise
its rollouts, tokens and behaviour log-probabilities into the checkpoint; a drain every
``checkpoint.every`` steps costs one synchronous step in ``every``.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from wmrl.core.advantages import AdvantageConfig, group_advantages
from wmrl.core.config import require, require_int

__all__ = [
    "ASYNC_METRICS",
    "LATE_UPDATES",
    "AnchorsInFlight",
    "AsynchronyConfig",
    "InFlight",
    "LateGroups",
    "late_advantages",
    "modelled_step_times",
    "refuse_asynchrony",
    "running_keys",
]

#: The metrics an asynchronous step adds (``max_anchor_lag > 0``), documented in ``docs/architecture.md``.
ASYNC_METRICS: dict[str, str] = {
    "async/landed_executions": "real executions of earlier steps consumed at this step",
    "async/landed_pairs": "(world model, real) pairs they added to the calibration",
    "async/landed_groups": "earlier steps' groups with a landed execution, whose update is applied now",
    "async/late_rollouts": "rollouts of those groups with a late advantage in this step's update",
    "async/recorded": "landed outcomes added to the execution memory at this step",
    "async/lag_mean": "mean lag, in steps, of the executions consumed now (None: none consumed)",
    "async/wait_s": "seconds this step waited for executions due at it (the trainer idle on anchors)",
    "async/overdue": "executions due at this step still running after asynchrony.overdue_after_s (calibration only when they land)",
    "async/overdue_landed": "overdue executions that landed since the last step (used for calibration and memory only)",
    "async/overdue_pending": "overdue executions still running",
    "async/in_flight_executions": "executions submitted and not consumed after this step",
}

LateUpdate = Literal["correction", "executed", "full"]
#: any numpy array (matrices here are ``(n_groups, G)`` floats or bools)
Array = npt.NDArray[Any]
LATE_UPDATES: tuple[str, ...] = ("correction", "executed", "full")


@dataclass(frozen=True)
class AsynchronyConfig:
    """Real executions off the critical path (see the module docstring).

    Attributes:
        max_anchor_lag: steps after its own at which a step's executions are consumed (0: every step
            waits for its own executions, the synchronous method, unchanged bit for bit).
        late_update: what a landed group's update applies: ``"correction"`` (its advantages with the
            real scores minus those already applied), ``"executed"`` (the same on the rollouts whose
            real scores landed only: the other rollouts' share of the correction is the shift of their
            group's baseline, which carries no expected gradient; an engine then re-trains only the
            executed rollouts) or ``"full"`` (its advantages with the real scores, again).
        overdue_after_s: the longest a step waits for executions due at it (seconds; ``None``: as long
            as they take, which keeps the run deterministic). Later results are used for
            calibration and the memory only.
        workers: how many steps' execution passes may run at once. With 1 (the default) they run one
            after another, so a step lasts at least one pass, whatever the lag: asynchrony then hides
            the rest of the step behind the executions, not the executions behind each other. More
            lets ``max_anchor_lag`` passes overlap (``d`` steps' executions in flight at once, a step
            down to a ``d``-th of a pass); the anchor source must then be safe to call from several
            threads at once. Landing stays at fixed steps, so a run is as deterministic as with 1.
    """

    max_anchor_lag: int = 0
    # "executed" ties "correction" on the simulation's tuning seeds and re-trains only the executed
    # rollouts (docs/benchmarks/method.md, "Asynchronous anchors")
    late_update: LateUpdate = "executed"
    overdue_after_s: float | None = None
    workers: int = 1

    def __post_init__(self) -> None:
        require(
            isinstance(self.max_anchor_lag, int)
            and not isinstance(self.max_anchor_lag, bool)
            and self.max_anchor_lag >= 0,
            f"asynchrony.max_anchor_lag must be an integer >= 0 (0: synchronous); got {self.max_anchor_lag!r}",
        )
        require(
            self.late_update in LATE_UPDATES,
            f"asynchrony.late_update must be one of {LATE_UPDATES}; got {self.late_update!r}",
        )
        require(
            self.overdue_after_s is None
            or (isinstance(self.overdue_after_s, (int, float)) and self.overdue_after_s > 0),
            f"asynchrony.overdue_after_s must be None or > 0 seconds; got {self.overdue_after_s!r}",
        )

        require_int(self.workers, "asynchrony.workers")

    @property
    def enabled(self) -> bool:
        return self.max_anchor_lag > 0


def refuse_asynchrony(config: AsynchronyConfig, engine: str, why: str) -> None:
    """Refuse ``max_anchor_lag > 0`` in an engine that cannot apply late groups (yet), saying why."""
    if config.enabled:
        raise ValueError(
            f"corrector.asynchrony.max_anchor_lag={config.max_anchor_lag} is not supported by {engine}: {why}. "
            "Set it to 0 (synchronous anchors); the loop trainer (embodied-free domains such as examples/hpo) "
            "supports it"
        )


def late_advantages(
    applied_rewards: Array,
    applied_advantages: Array,
    landed: Array,
    cell_weights: Callable[[Array, Array], Array] | None = None,
    config: AdvantageConfig | None = None,
    update: LateUpdate = "correction",
) -> tuple[Array, Array]:
    """What a landed step's groups add to a later update.

    Args:
        applied_rewards: ``(n_groups, G)`` the rewards the step trained on (NaN = unknown then).
        applied_advantages: ``(n_groups, G)`` the (weighted) advantages it applied (NaN = none).
        landed: ``(n_groups, G)`` real scores that landed (NaN = not executed or unknown).
        cell_weights: ``(rewards, contributes) -> (n_groups, G)`` weights on the recomputed advantages
            (the fusion's rule; default 1).
        config: the advantages' settings (the run's).
        update: ``"correction"``, ``"executed"`` or ``"full"`` (:class:`AsynchronyConfig`).

    Returns:
        ``(rewards, advantages)``, both ``(n_groups, G)``: the rewards with the landed scores in, and
        the advantages to apply now; NaN in every cell of a group where nothing landed (nothing
        changes there) and where a rollout has no reward.
    """
    applied_rewards = np.asarray(applied_rewards, dtype=np.float64)
    applied_advantages = np.asarray(applied_advantages, dtype=np.float64)
    landed = np.asarray(landed, dtype=np.float64)
    if not (applied_rewards.shape == applied_advantages.shape == landed.shape) or landed.ndim != 2:
        raise ValueError(
            "applied_rewards, applied_advantages and landed must be (n_groups, G) matrices of one shape; got "
            f"{applied_rewards.shape}, {applied_advantages.shape}, {landed.shape}"
        )
    if update not in LATE_UPDATES:
        raise ValueError(f"update must be one of {LATE_UPDATES}; got {update!r}")
    arrived = ~np.isnan(landed)
    rewards = np.where(arrived, landed, applied_rewards)
    ga = group_advantages(rewards, None, config)
    weights = np.ones_like(rewards) if cell_weights is None else cell_weights(rewards, ga.contributes)
    advantages = ga.advantages * weights
    if update in ("correction", "executed"):
        advantages = advantages - np.nan_to_num(applied_advantages, nan=0.0)
    # a group nothing landed in is unchanged: no late update there
    advantages = np.where(arrived.any(axis=1)[:, None] & ~np.isnan(rewards), advantages, np.nan)
    if update == "executed":  # the rollouts whose real scores landed (their group's baseline shift aside)
        advantages = np.where(arrived, advantages, np.nan)
    return rewards, advantages


@dataclass
class LateGroups:
    """One earlier step's groups, with what their landed executions add to this step's update.

    ``groups``: the rollouts as generated (tokens or actions, behaviour log-probabilities: whatever the
    domain kept in them); ``advantages``: ``(len(groups), G)``, NaN = nothing to apply to that rollout;
    ``rewards``: the rewards with the landed real scores in; ``step``: the step they were generated at;
    ``lag``: steps between that step and this one.
    """

    step: int
    lag: int
    groups: Any
    advantages: Array
    rewards: Array


@dataclass
class InFlight:
    """One step's executions in flight, and what the step trained on while they ran.

    Matrices are ``(n_groups, G)``; ``rows``: the flat rollouts' cells (``cells[i, j]``: group ``i`` has a
    rollout ``j``); ``future``: the real-execution pass (a :class:`~wmrl.core.pipeline.Scores`).
    """

    step: int
    due: int
    plan: Any
    groups: Any
    items: list[Any]
    cells: Array
    wm: Array
    wm_variance: Array
    rewards: Array
    advantages: Array
    solution_keys: Array | None
    executions: int
    future: Future[Any]
    keys: frozenset[str] = field(default_factory=frozenset)


def running_keys(solution_keys: Array | None, executed: Array) -> frozenset[str]:
    """The solutions a step submitted for execution: ``solution_keys`` (``(n_groups, G)`` object, ``None`` =
    no key; ``None`` for none at all) where ``executed`` (bool, same shape) is set."""
    if solution_keys is None:
        return frozenset()
    return frozenset(k for k in np.asarray(solution_keys, dtype=object)[executed].tolist() if k is not None)


class AnchorsInFlight:
    """The executions a run has submitted and not consumed yet, oldest first.

    ``workers`` threads run them in submission order. With one (the default) an anchor source need not
    be thread-safe: it is never called by two threads at once, since the synchronous path waits for
    this queue to be empty before it executes. With more, several steps' passes run at once
    (``AsynchronyConfig.workers``).
    """

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self.pending: list[InFlight] = []
        self.overdue: list[InFlight] = []

    def submit(self, work: Callable[[], Any]) -> Future[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="wmrl-anchors")
        return self._pool.submit(work)

    def add(self, entry: InFlight) -> None:
        self.pending.append(entry)

    def executions(self) -> int:
        """Executions submitted and not consumed (the concurrency cap's count)."""
        return sum(e.executions for e in self.pending)

    def group_equivalents(self, width: int) -> int:
        """Executions in flight in whole-group units of ``width`` rollouts (the scheduler's cap counts groups)."""
        return math.ceil(self.executions() / max(width, 1))

    def solution_keys(self) -> frozenset[str]:
        """Solutions being executed now: not chosen again until their outcome is known."""
        out: set[str] = set()
        for entry in self.pending:
            out |= entry.keys
        return frozenset(out)

    def due(self, step: int | None) -> list[InFlight]:
        """Remove and return the entries due at ``step`` (every entry with ``None``), oldest first."""
        ready = [e for e in self.pending if step is None or e.due <= step]
        self.pending = [e for e in self.pending if not (step is None or e.due <= step)]
        return ready

    def wait(self, entries: Sequence[InFlight], timeout_s: float | None) -> tuple[list[Any], float]:
        """Wait for ``entries``' results (at most ``timeout_s`` in all; ``None``: as long as they take).

        Returns ``(results, waited seconds)``: per entry its Scores, or ``None`` for one still running
        at the deadline (it moves to :attr:`overdue`). A failed execution pass raises here.
        """
        start = time.perf_counter()
        results: list[Any] = []
        for entry in entries:
            left = None if timeout_s is None else max(timeout_s - (time.perf_counter() - start), 0.0)
            try:
                results.append(entry.future.result(timeout=left))
            except FutureTimeout:
                self.overdue.append(entry)
                results.append(None)
        return results, time.perf_counter() - start

    def landed_overdue(self) -> list[tuple[InFlight, Any]]:
        """Overdue entries whose results are in now (removed from :attr:`overdue`)."""
        done = [(e, e.future.result()) for e in self.overdue if e.future.done()]
        self.overdue = [e for e in self.overdue if not e.future.done()]
        return done

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=False)
            self._pool = None


def modelled_step_times(executed: Sequence[bool], latency: float, lag: int, generation: float = 1.0) -> Array:
    """A model of wall time, not a measurement: the start time of each step and the end, ``(steps + 1,)``.

    Each step generates and scores with the world model for ``generation`` time units, then submits its
    executions (``executed[t]``: whether it has any), which take ``latency`` units each batch, as many
    running at once as are submitted (enough sandboxes). A step's update waits for the executions due at
    it: its own with ``lag = 0`` (a synchronous step lasts ``generation + latency``), step ``t - lag``'s
    otherwise, once step ``t``'s rollouts are generated (steady state:
    ``max(generation, (generation + latency) / (1 + lag))`` per step).
    """
    require(latency >= 0 and generation > 0, "need latency >= 0 and generation > 0")
    n = len(executed)
    start = np.zeros(n + 1)
    landed = np.full(n, -np.inf)
    for t in range(n):
        submitted = start[t] + generation
        if executed[t]:
            landed[t] = submitted + latency
        source = t - lag
        wait_until = landed[source] if source >= 0 else -np.inf
        start[t + 1] = max(submitted, wait_until)
    if lag > 0 and n:  # the run's last executions are awaited before it ends (its final checkpoint)
        start[n] = max(start[n], float(np.max(landed[max(n - lag, 0) :])))
    return start
