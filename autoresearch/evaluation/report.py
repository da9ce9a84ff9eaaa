"""The evaluation report: per-task valid rate, avg@k position, medals; category means; overall ± SEM over seeds.

Per task and seed, ``k`` trajectories are each graded by real execution (a trajectory is K turns
with execution feedback; its grade is its best turn, as in training). For trajectory ``i`` let
``pos_i`` be its best leaderboard position score in [0, 1] when some turn produced a valid
submission, and 0 otherwise. Then

* ``valid_rate = (# valid) / n`` and
* ``avg@k = (1/n) Σ_i pos_i`` (= valid rate × mean best position of the valid trajectories, the
  official evaluation's ``valid_rate × mean_best_pos_valid``),
* ``medal_rate``: share of trajectories whose best turn earned a gold, silver or bronze medal
  (MLE-bench's thresholds on the task's leaderboard); ``above_median_rate``: that or above median,

where ``n`` counts the *graded* trajectories: one whose grade is unknown (a harness failure) is
excluded from every denominator and reported separately (unknown is not zero).

Category score = mean of ``avg@k`` over the category's tasks. The **overall score is the mean over
categories** (each category weighs the same however many tasks it has), as in the paper's table;
the mean over tasks (what the official scripts compute) is reported next to it, labelled.

With several seeds (MLE-bench asks for at least 3), every number above is computed per seed; the
report gives the mean over seeds and the standard error of that mean (``sem`` = sample standard
deviation over seeds / √seeds; ``None`` with one seed: unknown, not zero).

A seed in which some task has no graded trajectory at all (every one a harness failure) does not
know that task's score, so its overall, task mean, valid rate and medal rate are unknown (``None``),
and so is the mean of each category that task belongs to: averaging the remaining tasks would make
that seed's number one over another task set, and the mean over seeds would mix the two. The seed
names those tasks (``SeedSummary.ungraded_tasks``); the means over seeds cover the complete seeds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

__all__ = [
    "MEDALS",
    "EvalReport",
    "RolloutGrade",
    "SeedSummary",
    "TaskReport",
    "aggregate",
    "sem",
    "task_report",
]

#: Medal outcomes, best first (``none``: graded, below median).
MEDALS = ("gold", "silver", "bronze", "above_median", "none")


@dataclass(frozen=True)
class RolloutGrade:
    """One evaluated trajectory (its best turn).

    Attributes:
        status: the grade's status (``valid``, ``runtime_error``, ..., ``malformed``, ``harness_error``).
        position: the position score in [0, 1] (valid trajectories only).
        reward: the ladder's reward (``None`` = unknown).
        medal: one of :data:`MEDALS`, or ``None`` when not valid or the task has no medal thresholds.
        turns: turns taken.
    """

    status: str
    position: float | None = None
    reward: float | None = None
    medal: str | None = None
    turns: int = 1

    def __post_init__(self) -> None:
        if self.status == "valid" and (self.position is None or not 0 <= self.position <= 1):
            raise ValueError(f"a valid rollout needs a position in [0, 1]; got {self.position!r}")
        if self.medal is not None and self.medal not in MEDALS:
            raise ValueError(f"medal must be one of {MEDALS} or None; got {self.medal!r}")

    @property
    def unknown(self) -> bool:
        return self.status == "harness_error"


@dataclass
class TaskReport:
    """One task's scores for one seed, or (in :attr:`EvalReport.tasks`) their mean over seeds.

    Attributes:
        task_id, category: the task.
        samples: trajectories drawn (k, per seed).
        graded: trajectories with a known grade (summed over seeds in the pooled row).
        valid_rate: share of graded trajectories with a valid submission (``None`` if none graded).
        avg_position: ``avg@k``: mean best position over graded trajectories, 0 for invalid ones.
        mean_valid_position: mean position of the valid trajectories (``None`` if none).
        mean_reward: mean ladder reward over graded trajectories.
        medal_rate: share of graded trajectories with a gold/silver/bronze medal (``None``: no thresholds).
        above_median_rate: share with a medal or above the leaderboard's median (``None``: no thresholds).
        statuses: status -> count (summed over seeds in the pooled row).
        seed: the seed (``None`` in the pooled row).
        avg_position_sem: standard error over seeds of ``avg_position`` (pooled row; ``None`` with one seed).
    """

    task_id: str
    category: str
    samples: int
    graded: int
    valid_rate: float | None
    avg_position: float | None
    mean_valid_position: float | None
    mean_reward: float | None
    medal_rate: float | None = None
    above_median_rate: float | None = None
    statuses: dict[str, int] = field(default_factory=dict)
    seed: int | None = None
    avg_position_sem: float | None = None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if known else None


def sem(values: Sequence[float | None]) -> float | None:
    """Standard error of the mean of the known ``values`` (sample std / √n); ``None`` for fewer than 2."""
    known = [float(v) for v in values if v is not None]
    if len(known) < 2:
        return None
    mean = math.fsum(known) / len(known)
    var = math.fsum((v - mean) ** 2 for v in known) / (len(known) - 1)
    return math.sqrt(var / len(known))


def task_report(
    task_id: str,
    category: str,
    grades: Sequence[RolloutGrade],
    seed: int | None = None,
    has_medals: bool | None = None,
) -> TaskReport:
    """Score one task (one seed) from its trajectories' grades.

    ``has_medals``: whether the task awards medals (it has a leaderboard, ``Task.leaderboards``).
    ``None``: inferred from the valid grades, which cannot tell when none is valid; then the medal
    share is unknown (``None``), not 0."""
    if not grades:
        raise ValueError(f"task {task_id!r} has no rollouts to score")
    known = [g for g in grades if not g.unknown]
    valid = [g for g in known if g.status == "valid"]
    rewards = [g.reward for g in known if g.reward is not None]
    n = len(known)
    # A medal needs a valid submission; a valid one without a medal value means the task has no
    # thresholds, and then the share is unknown rather than 0. Without valid grades and without
    # ``has_medals`` nothing says whether the task has thresholds: unknown too.
    if has_medals is None:
        thresholds_known = bool(valid) and all(g.medal is not None for g in valid)
    else:
        thresholds_known = has_medals
    # RolloutGrade.__post_init__: a valid grade has a position
    valid_positions = [cast(float, g.position) for g in valid]
    medal = sum(1 for g in valid if g.medal in ("gold", "silver", "bronze"))
    above = sum(1 for g in valid if g.medal not in (None, "none"))
    return TaskReport(
        task_id=task_id,
        category=category,
        samples=len(grades),
        graded=n,
        valid_rate=len(valid) / n if n else None,
        avg_position=math.fsum(valid_positions) / n if n else None,
        mean_valid_position=math.fsum(valid_positions) / len(valid) if valid else None,
        mean_reward=math.fsum(rewards) / len(rewards) if rewards else None,
        medal_rate=medal / n if n and thresholds_known else None,
        above_median_rate=above / n if n and thresholds_known else None,
        statuses=dict(Counter(g.status for g in grades)),
        seed=seed,
    )


@dataclass
class SeedSummary:
    """The headline numbers of one seed.

    Attributes:
        seed: the seed.
        overall: mean over categories of the category means of avg@k.
        overall_task_mean: mean avg@k over tasks.
        categories: category -> mean avg@k.
        valid_rate: mean valid rate over tasks.
        medal_rate: mean medal rate over the tasks that award medals (``None``: none does).
        ungraded_tasks: tasks without one graded trajectory in this seed. When there are any, the
            seed's overall, task mean, valid and medal rates are ``None`` (unknown), and
            ``categories`` leaves out the categories of those tasks.
    """

    seed: int | None
    overall: float | None
    overall_task_mean: float | None
    categories: dict[str, float]
    valid_rate: float | None
    medal_rate: float | None
    ungraded_tasks: list[str] = field(default_factory=list)


def _summarise(seed: int | None, tasks: Sequence[TaskReport]) -> SeedSummary:
    ungraded = [t.task_id for t in tasks if t.graded == 0]
    unknown_categories = {t.category for t in tasks if t.graded == 0}
    by_category: dict[str, list[float]] = {}
    for t in tasks:
        if t.avg_position is not None and t.category not in unknown_categories:
            by_category.setdefault(t.category, []).append(t.avg_position)
    categories = {c: math.fsum(v) / len(v) for c, v in sorted(by_category.items())}
    if ungraded:  # a mean over the other tasks would be a number of another task set
        return SeedSummary(seed, None, None, categories, None, None, ungraded)
    return SeedSummary(
        seed=seed,
        overall=_mean(list(categories.values())),
        overall_task_mean=_mean([t.avg_position for t in tasks]),
        categories=categories,
        valid_rate=_mean([t.valid_rate for t in tasks]),
        medal_rate=_mean([t.medal_rate for t in tasks]),
    )


def _pool(rows: Sequence[TaskReport]) -> TaskReport:
    """One task's rows over seeds -> the mean row (counts summed, SEM of avg@k over seeds)."""
    first = rows[0]
    statuses: Counter[str] = Counter()
    for r in rows:
        statuses.update(r.statuses)
    return TaskReport(
        task_id=first.task_id,
        category=first.category,
        samples=first.samples,
        graded=sum(r.graded for r in rows),
        valid_rate=_mean([r.valid_rate for r in rows]),
        avg_position=_mean([r.avg_position for r in rows]),
        mean_valid_position=_mean([r.mean_valid_position for r in rows]),
        mean_reward=_mean([r.mean_reward for r in rows]),
        medal_rate=_mean([r.medal_rate for r in rows]),
        above_median_rate=_mean([r.above_median_rate for r in rows]),
        statuses=dict(statuses),
        seed=None,
        avg_position_sem=sem([r.avg_position for r in rows]),
    )


@dataclass
class EvalReport:
    """All tasks (mean over seeds), their category means and the overall means, ± SEM over seeds.

    Attributes:
        model: the evaluated policy.
        split: the evaluated task set's name.
        samples: k (trajectories per task and seed).
        tasks: per-task rows, mean over seeds.
        categories: category -> mean over seeds of the category mean of avg@k.
        overall: mean over seeds of the mean over categories (the headline number).
        overall_task_mean: mean over seeds of the mean avg@k over tasks.
        train_tasks: the tasks the policy was trained on (checked disjoint from ``tasks`` unless ``in_sample``).
        settings: generation and sandbox settings.
        seeds: the seeds.
        turns: K (execution turns with feedback per trajectory).
        in_sample: the evaluated tasks are training tasks (labelled; not a held-out result).
        overall_sem / overall_task_mean_sem / categories_sem: standard errors over seeds.
        valid_rate / valid_rate_sem: mean over tasks of the valid rate, mean and SEM over seeds.
        medal_rate / medal_rate_sem: the same for the medal rate.
        per_seed: each seed's headline numbers.
        per_seed_tasks: each seed's per-task rows (what every mean above is computed from).
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
    seeds: list[int | None] = field(default_factory=list)
    turns: int = 1
    in_sample: bool = False
    overall_sem: float | None = None
    overall_task_mean_sem: float | None = None
    categories_sem: dict[str, float | None] = field(default_factory=dict)
    valid_rate: float | None = None
    valid_rate_sem: float | None = None
    medal_rate: float | None = None
    medal_rate_sem: float | None = None
    per_seed: list[SeedSummary] = field(default_factory=list)
    per_seed_tasks: list[TaskReport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["averages"] = (
            "avg@k per task = mean best position over graded trajectories (0 when not valid); category = mean "
            "over its tasks; overall = mean over categories (overall_task_mean = mean over tasks); every number "
            "is computed per seed, then averaged over seeds (sem = standard error over seeds)"
        )
        return out

    def format(self) -> str:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:5.1f}"

        def pm(x: float | None, e: float | None) -> str:
            return pct(x) if e is None else f"{pct(x)} ± {100 * e:.1f}"

        label = " (IN-SAMPLE: training tasks)" if self.in_sample else ""
        lines = [
            f"model: {self.model}   tasks: {self.split} ({len(self.tasks)}){label}   k={self.samples} per task, "
            f"K={self.turns} turn{'s' if self.turns > 1 else ''}, seeds {self.seeds}",
            f"{'task':<28} {'category':<11} {'valid %':>7} {'avg@k %':>13} {'medal %':>7} {'graded':>7}  statuses",
        ]
        for t in self.tasks:
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(t.statuses.items()))
            lines.append(
                f"{t.task_id:<28} {t.category:<11} {pct(t.valid_rate):>7} {pm(t.avg_position, t.avg_position_sem):>13} "
                f"{pct(t.medal_rate):>7} {t.graded:>3}/{t.samples * max(len(self.seeds), 1):<3}  {statuses}"
            )
        lines.append(
            "category means (avg@k %): "
            + ", ".join(f"{c} {pm(v, self.categories_sem.get(c))}" for c, v in self.categories.items())
        )
        lines.append(f"overall (mean over categories): {pm(self.overall, self.overall_sem)} %")
        lines.append(
            f"mean over tasks (for reference): {pm(self.overall_task_mean, self.overall_task_mean_sem)} %"
        )
        lines.append(
            f"valid rate: {pm(self.valid_rate, self.valid_rate_sem)} %   medal rate: {pm(self.medal_rate, self.medal_rate_sem)} %"
        )
        for s in self.per_seed:
            if s.ungraded_tasks:
                lines.append(
                    f"seed {s.seed}: no graded trajectory on {', '.join(s.ungraded_tasks)} (harness failures): "
                    "its overall, valid and medal rates are unknown and left out of the means over seeds"
                )
        return "\n".join(lines)


def aggregate(
    tasks: Sequence[TaskReport],
    *,
    model: str,
    split: str,
    samples: int,
    train_tasks: Sequence[str] = (),
    settings: dict[str, Any] | None = None,
    turns: int = 1,
    in_sample: bool = False,
) -> EvalReport:
    """The report of per-task, per-seed rows (``TaskReport.seed``; all ``None`` for one unnamed seed)."""
    seeds = list(dict.fromkeys(t.seed for t in tasks))
    per_seed = [_summarise(s, [t for t in tasks if t.seed == s]) for s in seeds]
    order = list(dict.fromkeys(t.task_id for t in tasks))
    pooled = [_pool([t for t in tasks if t.task_id == task_id]) for task_id in order]
    categories_all = sorted({c for s in per_seed for c in s.categories})
    categories = {c: _mean([s.categories.get(c) for s in per_seed]) for c in categories_all}
    return EvalReport(
        model=model,
        split=split,
        samples=samples,
        tasks=pooled,
        categories={c: v for c, v in categories.items() if v is not None},
        overall=_mean([s.overall for s in per_seed]),
        overall_task_mean=_mean([s.overall_task_mean for s in per_seed]),
        train_tasks=list(train_tasks),
        settings=dict(settings or {}),
        seeds=seeds,
        turns=turns,
        in_sample=in_sample,
        overall_sem=sem([s.overall for s in per_seed]),
        overall_task_mean_sem=sem([s.overall_task_mean for s in per_seed]),
        categories_sem={c: sem([s.categories.get(c) for s in per_seed]) for c in categories_all},
        valid_rate=_mean([s.valid_rate for s in per_seed]),
        valid_rate_sem=sem([s.valid_rate for s in per_seed]),
        medal_rate=_mean([s.medal_rate for s in per_seed]),
        medal_rate_sem=sem([s.medal_rate for s in per_seed]),
        per_seed=per_seed,
        per_seed_tasks=list(tasks),
    )
