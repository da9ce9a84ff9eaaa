"""The anchor reward source: real execution of AutoResearch solutions.

:class:`ExecutionRewardSource` implements the core :class:`~wmrl.core.sources.RewardSource`
contract with role ``anchor``. Its items are :class:`~wmrl.autoresearch.tasks.model.Solution`
(``task_id`` + ``code``); ``(task, code)`` pairs and ``{"task_id", "code"}`` mappings are accepted
too. Each item is compiled, run in the sandbox and graded; ``grade`` returns one
:class:`~wmrl.core.sources.Grade` per item (value = the ladder's reward, status, and the full
:class:`~wmrl.autoresearch.grading.grader.GradeResult` as ``info``), ``score`` the rewards alone.
A harness failure (including a task that cannot be loaded) is ``None`` with the reason in
``info["reason"]``, never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from wmrl.autoresearch.grading.grader import ExecutionGrader, GradeResult
from wmrl.autoresearch.tasks.model import Solution, Task, TaskError
from wmrl.core.rollouts import RolloutNeeds
from wmrl.core.sources import Grade, Role

__all__ = ["ExecutionRewardSource", "as_solution"]


def as_solution(item: Any) -> tuple[str | Task, str]:
    """``(task or task id, code)`` from a Solution, a ``(task, code)`` pair or a mapping.

    Raises:
        TypeError: the item has none of these shapes (a caller bug, reported before anything runs).
    """
    if isinstance(item, Solution):
        return item.task_id, item.code
    if isinstance(item, Mapping) and "code" in item and ("task_id" in item or "task" in item):
        return item.get("task", item.get("task_id")), item["code"]
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        return item[0], item[1]
    raise TypeError(
        "an AutoResearch item must be a Solution(task_id, code), a (task, code) pair or a mapping with "
        f"'task_id' and 'code'; got {type(item).__name__}"
    )


class ExecutionRewardSource:
    """Anchor reward source grading solutions by running them.

    Args:
        grader: the execution grader (default: ``ExecutionGrader()`` on the best available sandbox).
        name: the source's name in logs.
        max_workers: executions run concurrently (threads; each execution is its own process tree).
        task_loader: ``task id -> Task`` (default :func:`wmrl.autoresearch.tasks.load_task`).
    """

    role = Role.ANCHOR
    #: reads the script; every grade carries the execution feedback the agent sees next (K-turn episodes)
    needs = RolloutNeeds(text=True, feedback=True)

    def __init__(
        self,
        grader: ExecutionGrader | None = None,
        name: str = "autoresearch-execution",
        max_workers: int = 1,
        task_loader: Callable[[str], Task] | None = None,
    ) -> None:
        if not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be an int >= 1; got {max_workers!r}")
        if not isinstance(name, str) or not name:
            raise ValueError("a reward source needs a non-empty string name")
        from wmrl.autoresearch.tasks.load import load_task

        self.grader = grader or ExecutionGrader()
        self.name = name
        self.max_workers = max_workers
        self._load = task_loader or load_task
        self._tasks: dict[str, Task] = {}
        #: ``(solutions, results) -> None`` called after every batch (``(task ref, code)`` pairs and
        #: their results), e.g. to keep the anchor pairs a run collects; None: nothing is recorded.
        self.record: Callable[[list[tuple[str | Task, str]], list[GradeResult]], None] | None = None

    def _task(self, ref: str | Task) -> Task:
        if isinstance(ref, Task):
            return ref
        if ref not in self._tasks:
            self._tasks[ref] = self._load(ref)
        return self._tasks[ref]

    def _grade_one(self, item: tuple[str | Task, str]) -> GradeResult:
        ref, code = item
        try:
            task = self._task(ref)
        except (TaskError, OSError, ValueError) as err:
            return GradeResult(
                task_id=str(ref), status="harness_error", reward=None, reason=f"cannot load task: {err}"
            )
        return self.grader.grade(task, code)

    def grade_results(self, items: Sequence[Any]) -> list[GradeResult]:
        """Full :class:`GradeResult` per item, in order."""
        parsed = [as_solution(item) for item in items]
        if self.max_workers == 1 or len(parsed) <= 1:
            results = [self._grade_one(p) for p in parsed]
        else:
            with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                results = list(pool.map(self._grade_one, parsed))
        if self.record is not None:
            self.record(parsed, results)
        return results

    def grade(self, items: Sequence[Any]) -> list[Grade]:
        """One :class:`~wmrl.core.sources.Grade` per item (value None for a harness error), with the
        execution's :class:`~wmrl.autoresearch.agent.feedback.ExecutionFeedback` as ``feedback``."""
        from wmrl.autoresearch.agent.feedback import ExecutionFeedback

        return [
            dataclasses.replace(r.to_grade(), feedback=ExecutionFeedback.from_result(r))
            for r in self.grade_results(items)
        ]

    def score(self, items: Sequence[Any]) -> list[float | None]:
        """The rewards alone."""
        return [r.reward for r in self.grade_results(items)]
