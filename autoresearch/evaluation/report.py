"""The evaluation report: per-task valid rate and avg@k position score, category means, overall mean.

Per task, ``k`` rollouts are each graded by real execution. For rollout ``i`` let ``pos_i`` be its
leaderboard position score in [0, 1] when its submission is valid, and 0 otherwise. Then

* ``valid_rate = (# valid) / n`` and
* ``avg@k = (1/n) Σ_i pos_i`` (= valid rate × mean position of the valid rollouts, the official
  evaluation's ``valid_rate × mean_best_pos_valid`` for single-turn rollouts),

where ``n`` counts the *graded* rollouts: a rollout whose grade is unknown (a harness failure) is
excluded from both and reported separately (unknown is not zero).

Category score = mean of ``avg@k`` over the category's tasks. The **overall score is the mean over
categories** (each category weighs the same however many tasks it has), as in the paper's table;
the mean over tasks (what the official scripts compute) is reported next to it, labelled.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["EvalReport", "RolloutGrade", "TaskReport", "aggregate", "task_report"]


@dataclass(frozen=True)
class RolloutGrade:
    """One evaluated rollout.

    Attributes:
        status: the grade's status (``valid``, ``runtime_error``, ..., ``malformed``, ``harness_error``).
        position: the position score in [0, 1] (valid rollouts only).
        reward: the ladder's reward (``None`` = unknown).
    """

    status: str
    position: float | None = None
    reward: float | None = None

    def __post_init__(self) -> None:
        if self.status == "valid" and (self.position is None or not 0 <= self.position <= 1):
            raise ValueError(f"a valid rollout needs a position in [0, 1]; got {self.position!r}")

    @property
    def unknown(self) -> bool:
        return self.status == "harness_error"


@dataclass
class TaskReport:
    """One task's scores (see the module docstring).

    Attributes:
        task_id, category: the task.
        samples: rollouts drawn (k).
        graded: rollouts with a known grade (``samples`` minus harness failures).
        valid_rate: share of graded rollouts with a valid submission (``None`` if none graded).
        avg_position: ``avg@k``: mean position score over graded rollouts, 0 for invalid ones.
        mean_valid_position: mean position of the valid rollouts (``None`` if none).
        mean_reward: mean ladder reward over graded rollouts.
        statuses: status -> count.
    """

    task_id: str
    category: str
    samples: int
    graded: int
    valid_rate: float | None
    avg_position: float | None
    mean_valid_position: float | None
    mean_reward: float | None
    statuses: dict[str, int] = field(default_factory=dict)


def task_report(task_id: str, category: str, grades: Sequence[RolloutGrade]) -> TaskReport:
    """Score one task from its rollouts' grades."""
    if not grades:
        raise ValueError(f"task {task_id!r} has no rollouts to score")
    known = [g for g in grades if not g.unknown]
    valid = [g for g in known if g.status == "valid"]
    rewards = [g.reward for g in known if g.reward is not None]
    n = len(known)
    return TaskReport(
        task_id=task_id,
        category=category,
        samples=len(grades),
        graded=n,
        valid_rate=len(valid) / n if n else None,
        avg_position=math.fsum(g.position for g in valid) / n if n else None,
        mean_valid_position=math.fsum(g.position for g in valid) / len(valid) if valid else None,
        mean_reward=math.fsum(rewards) / len(rewards) if rewards else None,
        statuses=dict(Counter(g.status for g in grades)),
    )


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


@dataclass
class EvalReport:
    """All tasks, their category means and the overall means.

    Attributes:
        model: the evaluated policy.
        split: the evaluated task set's name.
        samples: k.
        tasks: per-task reports.
        categories: category -> mean avg@k over its tasks (tasks with no graded rollout are left out).
        overall: mean over categories of the category means (the headline number).
        overall_task_mean: mean avg@k over tasks (for comparison with scripts that average tasks).
        train_tasks: the tasks the policy was trained on (checked disjoint from ``tasks``).
        settings: generation and sandbox settings.
    """

    model: str
    split: str
    samples: int
    tasks: list[TaskReport]
    categories: dict[str, float]
    overall: float | None
    overall_task_mean: float | None
    train_tasks: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["averages"] = (
            "avg@k per task = mean position score over graded rollouts (0 when not valid); category = mean "
            "over its tasks; overall = mean over categories (overall_task_mean = mean over tasks)"
        )
        return out

    def format(self) -> str:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:5.1f}"

        lines = [
            f"model: {self.model}   tasks: {self.split} ({len(self.tasks)})   samples per task: k={self.samples}",
            f"{'task':<28} {'category':<11} {'valid %':>7} {'avg@k %':>8} {'graded':>7}  statuses",
        ]
        for t in self.tasks:
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(t.statuses.items()))
            lines.append(
                f"{t.task_id:<28} {t.category:<11} {pct(t.valid_rate):>7} {pct(t.avg_position):>8} "
                f"{t.graded:>3}/{t.samples:<3}  {statuses}"
            )
        lines.append(
            "category means (avg@k %): " + ", ".join(f"{c} {pct(v)}" for c, v in self.categories.items())
        )
        lines.append(f"overall (mean over categories): {pct(self.overall)} %")
        lines.append(f"mean over tasks (for reference): {pct(self.overall_task_mean)} %")
        return "\n".join(lines)


def aggregate(
    tasks: Sequence[TaskReport],
    *,
    model: str,
    split: str,
    samples: int,
    train_tasks: Sequence[str] = (),
    settings: dict[str, Any] | None = None,
) -> EvalReport:
    """Category means and the overall means of per-task reports."""
    by_category: dict[str, list[float]] = {}
    for t in tasks:
        if t.avg_position is not None:
            by_category.setdefault(t.category, []).append(t.avg_position)
    categories = {c: math.fsum(v) / len(v) for c, v in sorted(by_category.items())}
    return EvalReport(
        model=model,
        split=split,
        samples=samples,
        tasks=list(tasks),
        categories=categories,
        overall=_mean(list(categories.values())),
        overall_task_mean=_mean([t.avg_position for t in tasks if t.avg_position is not None]),
        train_tasks=list(train_tasks),
        settings=dict(settings or {}),
    )
