"""A step's plan: which rollouts are executed for real, made before or while the world model scores.

:class:`Plan` is what :meth:`wmrl.core.corrector.Corrector.plan` returns and every engine follows;
:class:`PlanStream` makes the same plan group by group, so each group's executions can start as soon
as its world-model scores are in. The helpers normalise the keys a plan is made from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from wmrl.core.advantages import as_reward_matrix

if TYPE_CHECKING:
    from wmrl.core.corrector import Corrector

__all__ = ["Plan", "PlanStream", "first_unknown", "solution_key_matrix", "task_keys_of", "task_matrix"]


@dataclass(frozen=True)
class Plan:
    """Which rollouts of a step are graded by real execution.

    Attributes:
        step: the corrector step this plan belongs to.
        group_keys: one unique key per group.
        task_keys: one task per group (``None``: one task).
        anchor: bool ``(n_groups,)``, the anchor groups (every rollout executed; they measure the fusion).
        fraction: the target fraction the scheduler used.
        execute: bool ``(n_groups, G)``, every rollout to execute: the anchor groups' rows, plus single
            rollouts of other groups when ``scheduler.rollout_share > 0``. ``None`` when the plan
            was made without knowing the group size (no ``wm_scores``, no ``group_size``): then
            exactly the anchor rows (see :meth:`execute_mask`).
        repeat: bool ``(n_groups, G)``, executed rollouts to execute a *second* time (independently:
            another seed, another run) so the execution noise can be measured; ``None`` as above.
        known: bool ``(n_groups, G)``, rollouts whose solution the execution memory already knows
            when the plan was made (never executed, never sent to the world model); ``None`` when the
            plan was made without solution keys (the pipeline looks them up when it scores).
    """

    step: int
    group_keys: tuple[str, ...]
    task_keys: tuple[str, ...] | None
    anchor: npt.NDArray[Any]
    fraction: float
    execute: npt.NDArray[Any] | None = None
    repeat: npt.NDArray[Any] | None = None
    known: npt.NDArray[Any] | None = None

    @property
    def anchor_indices(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.anchor)]

    def execute_mask(self, group_size: int) -> npt.NDArray[Any]:
        """``(n_groups, group_size)`` bool: the rollouts to execute (the anchor rows when ``execute`` is unset)."""
        if self.execute is not None:
            if self.execute.shape[1] != group_size:
                raise ValueError(
                    f"the plan was made for groups of {self.execute.shape[1]} rollouts, not {group_size}"
                )
            return self.execute
        return np.repeat(self.anchor[:, None], group_size, axis=1)

    def repeat_mask(self, group_size: int) -> npt.NDArray[Any]:
        """``(n_groups, group_size)`` bool: the rollouts to execute a second time (none when ``repeat`` is unset)."""
        if self.repeat is not None:
            if self.repeat.shape[1] != group_size:
                raise ValueError(
                    f"the plan was made for groups of {self.repeat.shape[1]} rollouts, not {group_size}"
                )
            return self.repeat
        return np.zeros((len(self.anchor), group_size), dtype=bool)


def task_keys_of(task_keys: Sequence[Any] | None, n: int) -> tuple[str, ...] | None:
    """Task keys as strings; all given or none (``None`` for some groups is refused, never ``"None"``)."""
    if task_keys is None:
        return None
    tasks = list(task_keys)
    if len(tasks) != n:
        raise ValueError(f"got {len(tasks)} task keys for {n} groups: one per group")
    missing = [i for i, t in enumerate(tasks) if t is None]
    if len(missing) == n:
        return None
    if missing:
        raise ValueError(
            f"task keys are None for groups {missing} but named for others: give every group a task, "
            "or none (a missing task is not a task called 'None')"
        )
    return tuple(str(t) for t in tasks)


def solution_key_matrix(keys: Any, shape: tuple[int, int]) -> npt.NDArray[Any] | None:
    """Per-rollout solution keys as an object array of ``str | None``, shape ``shape``."""
    if keys is None:
        return None
    rows = list(keys)
    if len(rows) != shape[0] or any(isinstance(r, (str, bytes)) or len(r) > shape[1] for r in rows):
        raise ValueError(f"solution_keys must be {shape[0]} rows of at most {shape[1]} keys (str or None)")
    out = np.full(shape, None, dtype=object)
    for i, row in enumerate(rows):
        for j, key in enumerate(row):
            out[i, j] = None if key is None else str(key)
    return out


def task_matrix(tasks: Sequence[str] | None, shape: tuple[int, int]) -> npt.NDArray[Any]:
    """The task of every rollout, ``(n_groups, G)`` object (``""`` for one task)."""
    return np.array([[t] * shape[1] for t in (tasks or ("",) * shape[0])], dtype=object).reshape(shape)


def first_unknown(
    execute: npt.NDArray[Any], known: npt.NDArray[Any], keys: npt.NDArray[Any]
) -> npt.NDArray[Any]:
    """``execute`` without known solutions, and each unknown solution executed once (its first cell).

    A solution's other rollouts get its real score when it lands (the corrector shares it).
    """
    out = execute & ~known
    seen: set[str] = set()
    for r, c in zip(*np.nonzero(out), strict=True):
        key = keys[r, c]
        if key is None:
            continue
        if key in seen:
            out[r, c] = False
        seen.add(key)
    return out


def _scores(name: str, scores: Any, shape: tuple[int, int]) -> npt.NDArray[Any]:
    matrix: npt.NDArray[Any] = as_reward_matrix(scores, name)
    if matrix.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (groups, rollouts); got {matrix.shape}")
    return matrix


class PlanStream:
    """One step's plan, made group by group (:meth:`Corrector.plan_stream`).

    The anchor groups and what the execution memory knows are decided from keys alone at once
    (:attr:`anchor`, :attr:`known`, :meth:`anchor_rows`): anchor groups can be executed before any
    world-model score. Each other group's single executions are chosen by :meth:`add` as soon as
    that group's world-model scores are in, in group order (a solution chosen by an earlier group
    is not chosen again). :meth:`finish` gives the :class:`Plan`.
    """

    def __init__(
        self,
        corrector: Corrector,
        group_keys: Sequence[str],
        task_keys: Sequence[str | None] | None,
        group_size: int,
        solution_keys: Any,
        in_flight: int,
    ) -> None:
        self.corrector = corrector
        self.keys = tuple(str(k) for k in group_keys)
        n = len(self.keys)
        if n == 0:
            raise ValueError("plan_stream() needs at least one group")
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ValueError(f"group_size must be an integer >= 1; got {group_size!r}")
        self.shape = (n, int(group_size))
        self.tasks = task_keys_of(task_keys, n)
        self.step = corrector.step_count
        sched = corrector.scheduler
        budget = sched.count(self.step, n, in_flight, corrector.fraction)
        whole = sched.split(self.step, budget, n)
        self.anchor: npt.NDArray[Any] = sched.select(
            self.step, self.keys, self.tasks, None, in_flight, corrector.fraction, count=whole
        )
        self.solutions = solution_key_matrix(solution_keys, self.shape)
        self.lookup = corrector.known(self.solutions, self.shape)
        memory_on = self.solutions is not None and corrector.memory is not None
        self.known = self.lookup.known if memory_on else None
        self.execute = np.repeat(self.anchor[:, None], self.shape[1], axis=1)
        if self.known is not None and self.solutions is not None:  # known is only set where solutions are
            self.execute = first_unknown(self.execute, self.known, self.solutions)
        self.per_group = (
            corrector.fraction * self.shape[1] if corrector.config.scheduler.rollout_share >= 1.0 else None
        )
        self.covered: set[str] = set()
        if self.solutions is not None:
            self.covered = {k for k in self.solutions[self.anchor].reshape(-1).tolist() if k is not None}
        self.wm = np.full(self.shape, np.nan)
        self.added = np.zeros(n, dtype=bool)

    def anchor_rows(self) -> npt.NDArray[Any]:
        """``(n_groups, G)`` bool: the anchor groups' executions (known before any world-model score)."""
        return cast("npt.NDArray[Any]", self.execute & self.anchor[:, None])

    def add(self, row: int, wm_row: npt.NDArray[Any] | Sequence[float | None]) -> npt.NDArray[Any]:
        """Group ``row``'s world-model scores are in: its single executions, ``(G,)`` bool (none for an
        anchor group, whose executions :meth:`anchor_rows` gave)."""
        if self.added[row]:
            raise ValueError(f"group {row} was added twice")
        scores = _scores("wm_scores", [list(wm_row)], (1, self.shape[1]))[0]
        self.added[row] = True
        self.wm[row] = scores
        if self.anchor[row] or self.per_group is None:
            return np.zeros(self.shape[1], dtype=bool)
        task = "" if self.tasks is None else self.tasks[row]
        cal = self.corrector.debiaser.calibrate(
            scores[None, :], np.full((1, self.shape[1]), task, dtype=object)
        )[0]
        chosen: npt.NDArray[Any] = self.corrector.scheduler.select_group(
            self.step,
            self.keys[row],
            scores,
            self.per_group,
            None if self.solutions is None else self.solutions[row],
            self.lookup.known[row],
            self.lookup.mean[row],
            cal,
            self.covered,
        )
        self.execute[row] |= chosen
        return chosen

    def finish(self) -> Plan:
        """The step's plan (every group added)."""
        missing = np.flatnonzero(~self.added & ~self.anchor)
        if missing.size and self.per_group is not None:
            raise ValueError(
                f"groups {missing.tolist()[:5]} were never added: add every group's scores first"
            )
        repeat = self.corrector.scheduler.select_repeats(self.step, self.keys, self.execute)
        return Plan(
            step=self.step,
            group_keys=self.keys,
            task_keys=self.tasks,
            anchor=self.anchor,
            fraction=self.corrector.fraction,
            execute=self.execute.copy(),
            repeat=repeat,
            known=self.known,
        )
