"""The corrector: one object per run that owns the scheduler, the memory, the debiaser and the fusion.

It is the method's mathematics, with no sources in it: :meth:`Corrector.plan` says which rollouts
to execute for real (:class:`~wmrl.core.plan.Plan`), the caller scores, :meth:`Corrector.correct`
does the rest. Calling the two reward sources, booking their costs and checkpointing belong to
:class:`wmrl.core.pipeline.RewardPipeline`, which every trainer and engine drives.

``correct`` is the paper's steps, one method each (``docs/method.md``):

1. **real outcomes** — repeated executions pooled, the execution memory's outcomes for solutions it
   knew, a solution executed this step serving its other rollouts;
2. **pairs** — the executed rollouts the world model scored too, calibrated with the map fitted
   *before* them (prequential);
3. **measure** — the fusion's and the gain's evidence on those pairs;
4. **debias** — add the pairs and refit the isotonic map once;
5. **advantages** — calibrated world-model rewards beside the real ones, group advantages, the
   fusion's weights;
6. **remember** — the memory records this step's executions.

Validation lives in :class:`~wmrl.core.step_inputs.StepInputs`; every metric name is listed in
:data:`~wmrl.core.correction.METRICS` and documented in ``docs/architecture.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from wmrl.core.advantages import AdvantageConfig, GroupAdvantages, group_advantages
from wmrl.core.config import from_dict, require, to_dict
from wmrl.core.correction import METRICS, Correction
from wmrl.core.debias import DebiasConfig, OnlineDebiaser
from wmrl.core.execnoise import ExecutionNoise
from wmrl.core.fusion import Fusion, FusionConfig, FusionInputs
from wmrl.core.fusion_rules import WeightContext
from wmrl.core.gain import GainInputs, within_sums
from wmrl.core.late import AsynchronyConfig, late_advantages
from wmrl.core.memory import ExecutionMemory, MemoryConfig, MemoryLookup
from wmrl.core.modes import MODE_PRESETS, Mode, apply_changes, resolve_memory
from wmrl.core.plan import Plan, PlanStream, first_unknown, solution_key_matrix, task_keys_of, task_matrix
from wmrl.core.rollouts import Group
from wmrl.core.scheduler import AnchorScheduler, SchedulerConfig
from wmrl.core.sources import NoiseModel
from wmrl.core.step_inputs import Scores, StepInputs, score_matrix

__all__ = [
    "METRICS",
    "PRESETS",
    "BudgetConfig",
    "Correction",
    "Corrector",
    "CorrectorConfig",
    "Group",
    "Plan",
    "PlanStream",
]

# 2: the fusion measures on the advantages (new sums, solution-key tables) and the execution-noise state.
# 3: the execution memory and the gain estimator's sums.
STATE_VERSION = 3


@dataclass(frozen=True)
class BudgetConfig:
    """Optional adaptive anchor budget.

    When ``adaptive``, the anchor fraction follows the measured disagreement: after the fusion's
    warm-up it is ``clip(f0 · (1 + ρ_t) / (1 + ρ_0), f0, max_fraction)`` with ``ρ_0`` the
    disagreement at warm-up, so real execution grows when the world model drifts away from it.
    """

    adaptive: bool = False
    max_fraction: float = 0.5

    def __post_init__(self) -> None:
        require(
            0.0 < self.max_fraction <= 1.0, f"budget.max_fraction must be in (0, 1]; got {self.max_fraction}"
        )


@dataclass(frozen=True)
class CorrectorConfig:
    """Everything the corrector does, in one validated, serialisable object."""

    seed: int = 0
    # The default, decided by measurement at equal cost (docs/method.md §6, docs/benchmarks/method.md): the
    # execution budget on single rollouts, a quota of half of each group, each group's top-ranked
    # solutions not yet known; no whole anchor groups; every outcome remembered; every rollout
    # weighted 1 after the isotonic calibration (the gain is measured and reported all the same; as
    # weights it trailed weights of 1 on the held-out seeds: it measures on the rollouts the
    # selection chose, where the world model errs most, and under-weights it).
    scheduler: SchedulerConfig = field(
        default_factory=lambda: SchedulerConfig(fraction=0.5, floor=0, rollout_share=1.0)
    )
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    fusion: FusionConfig = field(default_factory=lambda: FusionConfig(mode="none"))
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    # real executions off the critical path (wmrl.core.late); 0 lag: synchronous
    asynchrony: AsynchronyConfig = field(default_factory=AsynchronyConfig)

    @property
    def memory_on(self) -> bool:
        """Whether the execution memory is used (``memory.enabled`` unset: on, the ``wmrl`` default)."""
        return self.memory.enabled is not False

    def __post_init__(self) -> None:
        require(isinstance(self.seed, int), f"seed must be an integer; got {self.seed!r}")
        require(
            self.budget.max_fraction >= self.scheduler.fraction or not self.budget.adaptive,
            "budget.max_fraction must be >= scheduler.fraction",
        )

    @classmethod
    def preset(cls, name: str, base: CorrectorConfig | None = None, **changes: Any) -> CorrectorConfig:
        """A named configuration (see :data:`PRESETS`) applied on top of ``base`` with ``changes``.

        The preset wins over ``base`` for the parts it sets (``real`` always anchors every group).
        """
        if name not in PRESETS:
            raise ValueError(f"unknown corrector preset {name!r}; known: {sorted(PRESETS)}")
        return PRESETS[name](replace(base or cls(), **changes))


def _with(config: CorrectorConfig, **parts: Any) -> CorrectorConfig:
    updated = {}
    for part, values in parts.items():
        updated[part] = replace(getattr(config, part), **values)
    return replace(config, **updated)


_GROUPS = {"fraction": 0.1, "floor": 1, "rollout_share": 0.0}


def _groups(c: CorrectorConfig) -> CorrectorConfig:
    """The design before issue 32 (whole anchor groups at 10%, the mse fusion, no memory): the base of
    the presets kept for comparison with it."""
    return _with(c, scheduler=_GROUPS, fusion={"mode": "mse"}, memory={"enabled": False})


PRESETS: dict[str, Callable[[CorrectorConfig], CorrectorConfig]] = {
    "wmrl": lambda c: resolve_memory(Mode.WMRL, c),
    # The default before issue 32: whole anchor groups at 10%, the mse fusion with its horizon, no memory.
    "wmrl_groups": _groups,
    # The default's parts, each taken away (docs/benchmarks/method.md)
    "wmrl_no_memory": lambda c: _with(c, memory={"enabled": False}),
    "wmrl_flat": lambda c: _with(c, fusion={"mode": "none"}),  # the default's fusion, by name
    # the default with the gain fusion: each rollout weighted by the world model's measured gain
    "wmrl_gain": lambda c: _with(c, fusion={"mode": "gain"}),
    # The default before issue 11: errors in reward units, execution noise ignored, horizon H = 8.
    "wmrl_previous": lambda c: _with(
        _groups(c), fusion={"mode": "mse", "scale": "reward", "bias_horizon": 8.0}
    ),
    "wmrl_measured": lambda c: _with(_groups(c), fusion={"mode": "mse", "persistence": "measured"}),
    # The whole execution budget on single rollouts (each group's top-scored solution), no anchor
    # groups: the arm that won on the benchmark's tuning seeds (docs/benchmarks/method.md).
    "wmrl_rollout": lambda c: _with(_groups(c), scheduler={"rollout_share": 1.0, "floor": 0}),
    "wmrl_repeats": lambda c: _with(_groups(c), scheduler={"repeat_share": 0.25}),
    "wmrl_inverse_variance": lambda c: _with(_groups(c), fusion={"mode": "inverse_variance"}),
    "wmrl_mse": lambda c: _with(_groups(c), fusion={"mode": "mse"}),
    "wmrl_adaptive_budget": lambda c: _with(_groups(c), budget={"adaptive": True}),
    "wmrl_active": lambda c: _with(_groups(c), scheduler={"active_share": 0.5}),
    "wmrl_paper_weight": lambda c: _with(_groups(c), fusion={"mode": "paper"}),
    "debias_only": lambda c: _with(_groups(c), fusion={"mode": "none"}),
    "fusion_only": lambda c: _with(_groups(c), debias={"enabled": False}),
    "uncorrected_mix": lambda c: _with(_groups(c), debias={"enabled": False}, fusion={"mode": "none"}),
    # the training modes: one definition, in wmrl.core.modes
    "world_model": lambda c: resolve_memory(
        Mode.WORLD_MODEL, apply_changes(c, MODE_PRESETS[Mode.WORLD_MODEL])
    ),
    "real": lambda c: resolve_memory(Mode.REAL, apply_changes(c, MODE_PRESETS[Mode.REAL])),
    # Real-execution GRPO that executes only solutions it has not executed before (a result cache).
    "real_cache": lambda c: apply_changes(c, {**MODE_PRESETS[Mode.REAL], "memory.enabled": True}),
    # The paper's configuration: whole anchor groups at 10%, isotonic debiasing, its fusion heuristic.
    "paper": lambda c: _with(
        c,
        scheduler={"fraction": 0.1, "floor": 1, "rollout_share": 0.0},
        debias={"enabled": True},
        fusion={"mode": "paper"},
        memory={"enabled": False},
    ),
}


def _share_executed(
    real: npt.NDArray[Any],
    used: npt.NDArray[Any],
    anchor: npt.NDArray[Any],
    keys: npt.NDArray[Any],
    anchor_rows_too: bool = False,
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Give rollouts the real score of their solution when it was executed this step: rollouts of
    world-model groups, and with ``anchor_rows_too`` the anchor groups' rollouts not executed (a
    solution is executed once per step when the execution memory is on)."""
    sums: dict[str, list[float]] = {}
    for r, c in zip(*np.nonzero(used), strict=True):
        key = keys[r, c]
        if key is not None:
            acc = sums.setdefault(key, [0.0, 0.0])
            acc[0] += real[r, c]
            acc[1] += 1.0
    if not sums:
        return real, used
    real, used = real.copy(), used.copy()
    open_cells = ~used if anchor_rows_too else ~used & ~anchor[:, None]
    for r, c in zip(*np.nonzero(open_cells), strict=True):
        found = sums.get(keys[r, c])
        if found is not None:
            real[r, c] = found[0] / found[1]
            used[r, c] = True
    return real, used


def _calls_and_means(
    values: npt.NDArray[Any], scored: npt.NDArray[Any], keys: npt.NDArray[Any] | None
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Per rollout, the number of this step's world-model calls on its solution and their mean.

    ``values``: ``(n_groups, G)`` calibrated scores; ``scored``: where a call returned a score. A
    rollout without a key is its own solution. Returns ``(calls, means)``, NaN where not scored.
    """
    calls = np.where(scored, 1.0, np.nan)
    means = np.where(scored, values, np.nan)
    if keys is None:
        return calls, means
    sums: dict[str, list[float]] = {}
    for r, c in zip(*np.nonzero(scored), strict=True):
        key = keys[r, c]
        if key is not None:
            acc = sums.setdefault(key, [0.0, 0.0])
            acc[0] += float(values[r, c])
            acc[1] += 1.0
    for r, c in zip(*np.nonzero(scored), strict=True):
        found = sums.get(keys[r, c]) if keys[r, c] is not None else None
        if found is not None:
            calls[r, c] = found[1]
            means[r, c] = found[0] / found[1]
    return calls, means


@dataclass
class _RealOutcomes:
    """What real execution and the memory say about a step's rollouts (``(n_groups, G)``, NaN = none).

    Attributes:
        executed_mean: the mean of each rollout's executions this step.
        executions: how many executions each rollout had this step.
        value: the real reward each rollout is graded with: its executions, else another rollout of
            its solution executed this step, else the memory's outcome.
        used: bool, rollouts whose reward is real (``value`` known).
        from_memory: bool, rollouts graded from the memory (not executed this step).
        lookup: the memory's answer before this step.
        repeats: the repeat statistics (``repeats``, ``differs``).
    """

    executed_mean: npt.NDArray[Any]
    executions: npt.NDArray[Any]
    value: npt.NDArray[Any]
    used: npt.NDArray[Any]
    from_memory: npt.NDArray[Any]
    lookup: MemoryLookup
    repeats: dict[str, float | None]


@dataclass
class _Pairs:
    """The step's (world model, real) pairs: executed rollouts the world model scored, flat ``(M,)``.

    Attributes:
        rows / cols: where each pair is. calibrated: its world-model score through the map fitted
        before this step. exec_var: its execution-noise variance. route: where that came from.
    """

    rows: npt.NDArray[Any]
    cols: npt.NDArray[Any]
    calibrated: npt.NDArray[Any]
    exec_var: npt.NDArray[Any]
    route: int


class Corrector:
    """Owns the scheduler, debiaser and fusion of one run. See the module docstring."""

    def __init__(self, config: CorrectorConfig | None = None) -> None:
        self.config = config or CorrectorConfig()
        self.scheduler = AnchorScheduler(self.config.scheduler, seed=self.config.seed)
        self.debiaser = OnlineDebiaser(self.config.debias)
        self.fusion = Fusion(self.config.fusion, self.config.advantages)
        self.exec_noise = ExecutionNoise(self.config.fusion.half_life_steps, self.config.fusion.min_repeats)
        mem = self.config.memory
        self.memory = ExecutionMemory(mem.max_keys, mem.store) if self.config.memory_on else None
        self.step_count = 0
        self.executions_total = 0
        self.rollouts_total = 0
        self.budget_reference: float | None = None
        self.fraction = self.config.scheduler.fraction

    # -- the execution memory -------------------------------------------------------------------
    def known(self, solution_keys: Any, shape: tuple[int, int]) -> MemoryLookup:
        """What the execution memory knows about a ``(n_groups, G)`` matrix of solution keys (nothing
        when the memory is off or no keys are given). Does not count as this step's lookup."""
        keys = solution_key_matrix(solution_keys, shape)
        if self.memory is None or keys is None:
            return MemoryLookup.nothing(shape)
        return self.memory.lookup(keys, shape, count=False)

    def plan_stream(
        self,
        group_keys: Sequence[str],
        task_keys: Sequence[str | None] | None,
        group_size: int,
        solution_keys: Sequence[Sequence[str | None]] | npt.NDArray[Any] | None = None,
        in_flight: int = 0,
    ) -> PlanStream:
        """A plan made group by group as the world model's scores come in (see :class:`PlanStream`).

        The executions it chooses are exactly :meth:`plan`'s given the same scores. Needs a plan that
        can be made one group at a time: whole groups and per-group quotas (``rollout_share`` 0 or 1),
        no active share.
        """
        sched = self.config.scheduler
        if sched.active_share > 0 or 0 < sched.rollout_share < 1:
            raise ValueError(
                "a streamed plan chooses each group's executions from that group's scores alone: it needs "
                "scheduler.active_share = 0 and scheduler.rollout_share 0 or 1"
            )
        return PlanStream(self, group_keys, task_keys, group_size, solution_keys, in_flight)

    # -- the split API -----------------------------------------------------------------------
    def plan(
        self,
        group_keys: Sequence[str],
        task_keys: Sequence[str | None] | None = None,
        wm_scores: npt.NDArray[Any] | Sequence[Sequence[float | None]] | None = None,
        in_flight: int = 0,
        group_size: int | None = None,
        solution_keys: Sequence[Sequence[str | None]] | npt.NDArray[Any] | None = None,
        in_flight_keys: frozenset[str] = frozenset(),
    ) -> Plan:
        """Choose this step's executions.

        Args:
            group_keys: one unique key per group (at least one group).
            task_keys: one task per group, or ``None`` (all groups one task).
            wm_scores: ``(n_groups, G)`` world-model scores; needed by the active scheduler and by
                per-rollout anchors (``scheduler.rollout_share > 0``), which read them (never real outcomes).
            in_flight: anchor groups still executing from earlier steps (for the concurrency cap).
            group_size: ``G``, when ``wm_scores`` is not given; with it (or ``wm_scores``) the plan
                carries ``execute`` and ``repeat`` masks of shape ``(n_groups, G)``.
            solution_keys: optional ``(n_groups, G)`` solution key per rollout (as in :meth:`correct`);
                per-rollout anchors then execute each solution once per step.
            in_flight_keys: solutions whose executions from earlier steps have not landed yet
                (asynchronous anchors): single rollouts do not execute them again.
        """
        keys = tuple(str(k) for k in group_keys)
        n = len(keys)
        if n == 0:
            raise ValueError("plan() needs at least one group")
        tasks = task_keys_of(task_keys, n)
        sched = self.config.scheduler
        wm = None
        if wm_scores is not None:
            wm = score_matrix("wm_scores", wm_scores, None)
            if wm.shape[0] != n:
                raise ValueError(f"wm_scores has {wm.shape[0]} groups but {n} keys were given")
        if group_size is not None:
            if (
                isinstance(group_size, bool)
                or not isinstance(group_size, (int, np.integer))
                or group_size < 1
            ):
                raise ValueError(f"group_size must be an integer >= 1; got {group_size!r}")
            if wm is not None and wm.shape[1] != group_size:
                raise ValueError(
                    f"group_size={group_size} but wm_scores has {wm.shape[1]} rollouts per group"
                )
        width = wm.shape[1] if wm is not None else (None if group_size is None else int(group_size))
        for name, value in (("active_share", sched.active_share), ("rollout_share", sched.rollout_share)):
            if value > 0 and wm is None:
                raise ValueError(f"scheduler.{name} > 0 reads world-model scores: pass wm_scores to plan()")
        if sched.repeat_share > 0 and width is None:
            raise ValueError(
                "scheduler.repeat_share > 0 chooses single rollouts: pass wm_scores or group_size"
            )
        uncertainty = None
        if sched.active_share > 0:
            assert wm is not None  # active_share > 0 without wm_scores was rejected above
            per_item = self.debiaser.uncertainty(wm)
            scored = ~np.isnan(wm)
            uncertainty = np.where(
                scored.any(axis=1), (per_item * scored).sum(axis=1) / np.maximum(scored.sum(axis=1), 1), 0.0
            )
        step = self.step_count
        budget = self.scheduler.count(step, n, in_flight, self.fraction)
        whole = self.scheduler.split(step, budget, n)
        mask = self.scheduler.select(step, keys, tasks, uncertainty, in_flight, self.fraction, count=whole)
        execute = repeat = known = None
        if width is not None:
            shape = (n, width)
            solutions = solution_key_matrix(solution_keys, shape)
            lookup = self.known(solutions, shape)
            known = lookup.known if solutions is not None and self.memory is not None else None
            execute = np.repeat(mask[:, None], width, axis=1)
            if whole < budget or sched.rollout_share >= 1.0:
                # Both need rollout_share > 0 (split() keeps the whole budget otherwise), which was
                # rejected above without wm_scores.
                assert wm is not None
                # The same number of executions as the whole groups they replace; ranked by what is
                # known (the memory's outcome) before the world model's calibrated score.
                cal = self.debiaser.calibrate(wm, task_matrix(tasks, shape))
                # The whole budget on single rollouts: a quota per group, so each group's choice
                # depends on its own scores only (its executions can start as soon as they are in).
                per_group = self.fraction * width if sched.rollout_share >= 1.0 else None
                execute |= self.scheduler.select_rollouts(
                    step,
                    keys,
                    wm,
                    mask,
                    (budget - whole) * width,
                    solutions,
                    lookup.known,
                    lookup.mean,
                    cal,
                    per_group=per_group,
                    in_flight=in_flight_keys,
                )
            if known is not None and solutions is not None:  # known is only set where solutions are
                execute = first_unknown(execute, known, solutions)
            if in_flight_keys and solutions is not None:
                running = np.vectorize(lambda k: k in in_flight_keys, otypes=[bool])(solutions)
                execute &= ~(running & ~mask[:, None])  # whole anchor groups execute every rollout
            repeat = self.scheduler.select_repeats(step, keys, execute)
        return Plan(
            step=step,
            group_keys=keys,
            task_keys=tasks,
            anchor=mask,
            fraction=self.fraction,
            execute=execute,
            repeat=repeat,
            known=known,
        )

    def correct(
        self,
        plan: Plan,
        wm_scores: Scores,
        anchor_scores: Scores,
        wm_variance: Scores | None = None,
        *,
        anchor_repeats: Scores | None = None,
        anchor_noise: NoiseModel | npt.NDArray[Any] | None = None,
        solution_keys: Sequence[Sequence[str | None]] | npt.NDArray[Any] | None = None,
    ) -> Correction:
        """Calibrate, fuse and form advantages for the step ``plan`` was made for.

        Args:
            plan: this step's plan (from :meth:`plan`; the corrector refuses a stale one).
            wm_scores: ``(n_groups, G)`` world-model scores of every group, NaN/None = unknown.
            anchor_scores: ``(n_groups, G)`` real scores; only the plan's executed rollouts
                (``plan.execute_mask(G)``) may hold values.
            wm_variance: optional ``(n_groups, G)`` per-call noise variance of each world-model score
                (score units², >= 0; NaN = not reported).
            anchor_repeats: optional ``(n_groups, G)`` real scores of the second executions
                (``plan.repeat_mask(G)``), NaN where not repeated or unknown. A repeated rollout's
                reward is the mean of its known executions; the pairs measure the execution noise.
            anchor_noise: the anchor source's declared execution noise: a
                :class:`~wmrl.core.sources.NoiseModel` (``declared_noise(source)``) or a per-rollout
                ``(n_groups, G)`` variance array (score units²). Measured repeats take precedence;
                with neither, execution is assumed deterministic (``wmrl/exec_noise_route`` = 0).
            solution_keys: optional ``(n_groups, G)`` key of each rollout's solution (a hash of the
                code, of the action sequence; ``None`` = unknown). Equal keys mean "the same
                solution": the execution memory keeps outcomes by them and the fusion measures from
                them how far the world model's error on a solution persists.
        """
        step = StepInputs.check(
            self.step_count,
            plan,
            wm_scores,
            anchor_scores,
            wm_variance,
            anchor_repeats,
            anchor_noise,
            solution_keys,
        )
        # The paper's steps, with the map fitted *before* this step's pairs used to measure them:
        real = self._real_outcomes(step)  # what execution and the memory say
        pairs = self._pairs(step, real)  # rollouts graded by both, the world model calibrated prequentially
        self._measure(step, real, pairs)  # the fusion's and the gain's evidence
        diagnostics = self._debias(step, real, pairs)  # add the pairs, refit the isotonic map once
        rewards, calibrated, ga, weights, advantages = self._advantages(step, real)  # calibrate, fuse
        recorded = self._remember(step)  # the memory learns this step's executions
        self.scheduler.commit(step.anchor, plan.task_keys)
        self.step_count += 1
        self._update_budget()
        metrics = self._step_metrics(step, real, pairs, ga, weights, diagnostics, recorded)
        known = ~np.isnan(rewards)
        return Correction(
            rewards=rewards,
            advantages=advantages,
            weights=weights,
            anchor=step.anchor.copy(),
            metrics=metrics,
            calibrated=calibrated,
            executed=real.used & known,
            from_memory=real.from_memory & known,
        )

    # -- asynchronous anchors ---------------------------------------------------------------------
    def land(
        self,
        plan: Plan,
        wm_scores: Scores,
        anchor_scores: Scores,
        applied_rewards: npt.NDArray[Any],
        applied_advantages: npt.NDArray[Any],
        wm_variance: Scores | None = None,
        *,
        anchor_repeats: Scores | None = None,
        anchor_noise: NoiseModel | npt.NDArray[Any] | None = None,
        solution_keys: Sequence[Sequence[str | None]] | npt.NDArray[Any] | None = None,
        gradient: bool = True,
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any], dict[str, float | None]]:
        """An earlier step's executions have landed (asynchronous anchors, :mod:`wmrl.core.late`).

        Their pairs feed the calibration, the fusion's and the gain's measurements and the memory, as a
        synchronous step's would have (the map refitted now, at this step). ``plan``, the scores and
        ``solution_keys`` are that step's, as :meth:`correct` took them then, with ``anchor_scores`` the
        landed real scores; ``applied_rewards`` / ``applied_advantages`` what :meth:`correct` returned
        for it (its ``rewards`` and ``advantages``).

        Returns ``(rewards, advantages, metrics)``: ``(n_groups, G)`` rewards with the landed scores in
        and the advantages to apply in this step's update (:func:`~wmrl.core.late.late_advantages`,
        ``asynchrony.late_update``; NaN = nothing to apply; all NaN with ``gradient=False``, an
        overdue landing used for calibration only).
        """
        step = StepInputs.check(
            plan.step,
            plan,
            wm_scores,
            anchor_scores,
            wm_variance,
            anchor_repeats,
            anchor_noise,
            solution_keys,
        )
        real = self._real_outcomes(step, count=False)
        pairs = self._pairs(step, real)
        self._measure(step, real, pairs)
        self._debias(step, real, pairs)
        recorded = self._remember(step)
        executions = step.executions
        self._count_executions(executions, 0)
        # only groups with an execution that landed change; within them every real outcome now known
        landed_rows = (step.execute & ~np.isnan(real.executed_mean)).any(axis=1)
        landed = np.where(landed_rows[:, None] & real.used, real.value, np.nan)
        anchor = step.anchor

        def cell_weights(rewards: npt.NDArray[Any], contributes: npt.NDArray[Any]) -> npt.NDArray[Any]:
            known = ~np.isnan(rewards)
            is_real = (anchor[:, None] | real.used) & known
            calls = np.where(is_real | ~known, np.nan, 1.0)
            return self.fusion.rollout_weights(WeightContext(anchor, contributes, is_real, known, calls))

        rewards, advantages = late_advantages(
            applied_rewards,
            applied_advantages,
            landed,
            cell_weights,
            self.config.advantages,
            self.config.asynchrony.late_update,
        )
        if not gradient:
            advantages = np.full_like(advantages, np.nan)
        metrics: dict[str, float | None] = {
            "async/landed_executions": float(executions),
            "async/landed_pairs": float(pairs.rows.size),
            "async/landed_groups": float(np.count_nonzero(landed_rows)),
            "async/late_rollouts": float(np.count_nonzero(~np.isnan(advantages))),
            "async/recorded": float(recorded),
        }
        return rewards, advantages, metrics

    # -- the steps of correct() -------------------------------------------------------------------
    def _real_outcomes(self, step: StepInputs, count: bool = True) -> _RealOutcomes:
        """Repeated executions pooled (and their noise measured), the memory's outcomes for solutions
        it knew before this step, and a solution executed this step serving its other rollouts."""
        repeats = self.exec_noise.observe(step.real, step.second)
        executions = (~np.isnan(step.real)).astype(np.int64)
        mean = step.real
        if step.second is not None:
            executions += ~np.isnan(step.second)
            with np.errstate(invalid="ignore"):
                mean = np.where(
                    executions > 0, np.nansum(np.stack([step.real, step.second]), axis=0) / executions, np.nan
                )
        lookup = (
            self.memory.lookup(step.keys, step.shape, count=count)
            if self.memory is not None
            else MemoryLookup.nothing(step.shape)
        )
        from_memory = lookup.known & np.isnan(mean)
        executed = step.execute & ~np.isnan(mean)
        shared, used = mean, executed
        anchor = step.anchor
        if step.keys is not None and (self.memory is not None or (step.execute & ~anchor[:, None]).any()):
            # A solution executed this step needs no second opinion: its real score (the mean of its
            # executions) serves every other rollout of it.
            shared, used = _share_executed(
                mean, executed, anchor, step.keys, anchor_rows_too=self.memory is not None
            )
        return _RealOutcomes(
            executed_mean=mean,
            executions=executions,
            value=np.where(from_memory, lookup.mean, shared),
            used=used | from_memory,
            from_memory=from_memory,
            lookup=lookup,
            repeats=repeats,
        )

    def _pairs(self, step: StepInputs, real: _RealOutcomes) -> _Pairs:
        """The executed rollouts the world model scored too, with the map fitted before them."""
        rows, cols = np.nonzero(step.execute & ~np.isnan(step.wm) & ~np.isnan(real.executed_mean))
        calibrated = self.debiaser.calibrate(step.wm[rows, cols], step.tasks[rows, cols])
        exec_var, route = self.exec_noise.variances(
            step.declared, calibrated, real.executions[rows, cols], (rows, cols)
        )
        return _Pairs(rows=rows, cols=cols, calibrated=calibrated, exec_var=exec_var, route=route)

    def _measure(self, step: StepInputs, real: _RealOutcomes, pairs: _Pairs) -> None:
        """Feed the fusion (whole anchor groups) and the gain (every pair) with this step's evidence."""
        rows, cols = pairs.rows, pairs.cols
        in_anchor = step.anchor[rows]
        wm_var = None
        if step.wm_variance is not None:
            slope = self._map_slope(step.wm[rows, cols], step.tasks[rows, cols])
            wm_var = (step.wm_variance[rows, cols] * slope**2)[in_anchor]
        self.fusion.observe(
            FusionInputs(
                real=real.value[rows, cols][in_anchor],
                calibrated=pairs.calibrated[in_anchor],
                group=rows[in_anchor],
                exec_var=pairs.exec_var[in_anchor],
                wm_var=wm_var,
                keys=None if step.keys is None else step.keys[rows, cols][in_anchor],
                n_groups=step.shape[0],
            )
        )
        if self.debiaser.calibrated and self.config.fusion.mode != "paper":
            # measured (and reported) whatever the fusion: what the world model shares with the truth
            self.fusion.observe_gain(self._gain_inputs(step, real, pairs))

    def _debias(self, step: StepInputs, real: _RealOutcomes, pairs: _Pairs) -> dict[str, float | None]:
        """Add the step's pairs to the isotonic window and refit once; the prequential diagnostics."""
        rows, cols = pairs.rows, pairs.cols
        diagnostics: dict[str, float | None] = self.debiaser.observe(
            self.step_count, step.wm[rows, cols], real.value[rows, cols], rows, step.tasks[rows, cols]
        )
        self.debiaser.refit(self.step_count)
        return diagnostics

    def _advantages(
        self, step: StepInputs, real: _RealOutcomes
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any], GroupAdvantages, npt.NDArray[Any], npt.NDArray[Any]]:
        """Rewards (real where executed or known, calibrated world model elsewhere; an unknown real
        score in an anchor group stays unknown), group advantages, and the fusion's weights on them.

        Returns ``(rewards, calibrated, group advantages, group weights, weighted advantages)``.
        """
        anchor = step.anchor
        calibrated = self.debiaser.calibrate(step.wm, step.tasks)
        wm_reward, wm_calls = calibrated, None
        if self.config.fusion.mode == "gain":
            # the mean of this step's calls on the same solution (fresh noise averages away)
            wm_calls, wm_reward = _calls_and_means(calibrated, ~np.isnan(calibrated), step.keys)
        rewards = np.where(anchor[:, None] | real.used, real.value, wm_reward)
        ga = group_advantages(rewards, None, self.config.advantages)
        known = ~np.isnan(rewards)
        is_real = (anchor[:, None] | real.used) & known
        calls = np.where(is_real | ~known, np.nan, 1.0 if wm_calls is None else wm_calls)
        cell = self.fusion.rollout_weights(WeightContext(anchor, ga.contributes, is_real, known, calls))
        # a group's weight: the mean of its rollouts' (exactly the value a group rule gave them all)
        live = known & ga.contributes[:, None]
        high = np.where(live, cell, -np.inf).max(axis=1)
        low = np.where(live, cell, np.inf).min(axis=1)
        mean = cell.sum(axis=1) / np.maximum(live.sum(axis=1), 1)
        weights = np.where(ga.contributes, np.where(high == low, high, mean), 0.0)
        return rewards, calibrated, ga, weights, ga.advantages * cell

    def _remember(self, step: StepInputs) -> int:
        """Record every outcome executed this step in the memory (after it served as this step's lookup)."""
        if self.memory is None or step.keys is None:
            return 0
        recorded = 0
        for scores in (step.real, step.second):
            if scores is not None:
                done = ~np.isnan(scores) & (step.keys != None)  # noqa: E711 (object array)
                recorded += self.memory.record(step.keys[done].tolist(), scores[done].tolist())
        return recorded

    def _step_metrics(
        self,
        step: StepInputs,
        real: _RealOutcomes,
        pairs: _Pairs,
        ga: GroupAdvantages,
        weights: npt.NDArray[Any],
        diagnostics: dict[str, float | None],
        recorded: int,
    ) -> dict[str, float | None]:
        anchor, execute = step.anchor, step.execute
        executions_now = step.executions
        rollouts_now = int(np.count_nonzero(~np.isnan(step.wm) | ~np.isnan(step.real) | real.from_memory))
        metrics = self._metrics(step.plan, step.wm, step.real, anchor, ga, weights, diagnostics)
        metrics.update(
            {
                "wmrl/exec_noise_var": float(pairs.exec_var.mean()) if pairs.exec_var.size else None,
                "wmrl/exec_noise_route": float(pairs.route),
                "wmrl/exec_noise_measured": self.exec_noise.measured_var,
                "wmrl/exec_repeats": real.repeats["repeats"],
                "wmrl/exec_repeat_differs": real.repeats["differs"],
                # what was executed: the plan's executions less the solutions the memory already knew
                # (a plan made before the keys existed lists them; the pipeline does not execute them)
                "wmrl/executions": float((execute & ~real.lookup.known).sum() + step.repeat.sum()),
                "wmrl/execution_share_realised": self._count_executions(executions_now, rollouts_now),
                "wmrl/rollout_anchors": float((execute & ~anchor[:, None]).sum()),
                "wmrl/weight_zero_groups": float(np.count_nonzero(ga.contributes & (weights == 0))),
            }
        )
        metrics.update(self._gain_metrics())
        if self.memory is not None:
            keys = step.keys
            with_key = 0 if keys is None else int(np.count_nonzero(keys != None))  # noqa: E711
            from_memory = real.from_memory
            metrics.update(
                {
                    "memory/hits": float(from_memory.sum()),
                    "memory/misses": float(with_key - int(real.lookup.known.sum())),
                    "memory/size": float(len(self.memory)),
                    "memory/recorded": float(recorded),
                    "memory/known_share": float(from_memory.mean()) if from_memory.size else None,
                }
            )
        return metrics

    def _count_executions(self, executions: int, rollouts: int) -> float | None:
        self.executions_total += executions
        self.rollouts_total += rollouts
        return self.executions_total / self.rollouts_total if self.rollouts_total else None

    def _gain_inputs(self, step: StepInputs, real: _RealOutcomes, pairs: _Pairs) -> GainInputs:
        """This step's evidence for the random-effects model of the world model's error (``core/gain.py``),
        all on the map fitted before this step's pairs (prequential)."""
        before = self.debiaser.calibrate(step.wm, step.tasks)
        scored = ~np.isnan(before)
        group = np.broadcast_to(np.arange(step.shape[0])[:, None], step.shape)
        spread_ss, spread_dof = within_sums(before[scored], group[scored])
        dup_ss = dup_dof = 0.0
        if step.keys is not None:
            keyed = scored & (step.keys != None)  # noqa: E711 (object array)
            if keyed.any():
                dup_ss, dup_dof = within_sums(before[keyed], step.keys[keyed].astype(str))
        return GainInputs(
            real=real.value[pairs.rows, pairs.cols],
            calibrated=pairs.calibrated,
            group=pairs.rows,
            exec_var=pairs.exec_var,
            spread_ss=spread_ss,
            spread_dof=spread_dof,
            dup_ss=dup_ss,
            dup_dof=dup_dof,
        )

    def _gain_metrics(self) -> dict[str, float | None]:
        fusion, gain = self.fusion, self.fusion.gain
        out: dict[str, float | None] = {"wmrl/fusion_bound": float(fusion.bound_binds)}
        bound = fusion.bound_binds  # reading the gain below may set it; it belongs to the weights
        out.update(
            {
                "wmrl/wm_gain": fusion.wm_gain,
                "wmrl/gain_route": float(fusion.gain_route),
                "wmrl/wm_spread_var": gain.spread_var,
                "wmrl/wm_slope": gain.slope,
                "wmrl/wm_residual_var": gain.residual_var,
                "wmrl/wm_fresh_var": gain.per_call_var,
                "wmrl/wm_persistent_var": gain.persistent_var,
                "wmrl/wm_icc": gain.icc,
            }
        )
        fusion.bound_binds = bound
        return out

    def _map_slope(self, x: npt.NDArray[Any], keys: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Local slope of the current map at ``x`` (maps per-call noise onto the calibrated scale).

        A central difference over 5% of the map's range (relative, so units do not matter); a map
        with a single knot is constant, slope 0.
        """
        if not self.debiaser.calibrated:
            return np.ones_like(x)
        pooled = self.debiaser.pooled
        assert pooled is not None  # calibrated: a pooled map is fitted
        span = float(np.ptp(pooled.x_knots))
        if span <= 0:
            return np.zeros_like(x)
        h = 0.05 * span
        slope = (self.debiaser.calibrate(x + h, keys) - self.debiaser.calibrate(x - h, keys)) / (2 * h)
        return cast("npt.NDArray[Any]", slope)

    def _update_budget(self) -> None:
        cfg = self.config.budget
        # The budget follows the reward-scale disagreement E/S, the signal it was designed on: the
        # advantage-scale E/q rises on its own as groups turn flat late in a run (q falls), which
        # would push the budget to its cap without the world model getting any worse.
        rho = self.fusion.reward_disagreement
        if not cfg.adaptive or rho is None or self.fusion.groups_measured < self.config.fusion.min_groups:
            return
        if self.budget_reference is None:
            self.budget_reference = rho
        f0 = self.config.scheduler.fraction
        self.fraction = float(min(max(f0 * (1 + rho) / (1 + self.budget_reference), f0), cfg.max_fraction))

    def _metrics(
        self,
        plan: Plan,
        wm: npt.NDArray[Any],
        real: npt.NDArray[Any],
        anchor: npt.NDArray[Any],
        ga: GroupAdvantages,
        weights: npt.NDArray[Any],
        diag: dict[str, float | None],
    ) -> dict[str, float | None]:
        n = len(anchor)
        contributes = ga.contributes
        total_w = float(weights[contributes].sum())

        def stream_mean(mask: npt.NDArray[Any]) -> float | None:
            sel = mask & contributes
            return float(weights[sel].mean()) if sel.any() else None

        real_cells = real[anchor]
        fusion = self.fusion
        return {
            "wmrl/step": float(self.step_count),
            "wmrl/groups": float(n),
            "wmrl/anchor_groups": float(anchor.sum()),
            "wmrl/anchor_fraction": float(anchor.mean()) if n else None,
            "wmrl/anchor_fraction_realised": self.scheduler.realised_fraction,
            "wmrl/anchor_fraction_target": plan.fraction,
            "wmrl/unknown_world_model": float(np.isnan(wm).mean()) if wm.size else None,
            "wmrl/unknown_anchor": float(np.isnan(real_cells).mean()) if real_cells.size else None,
            "wmrl/calibrated": float(self.debiaser.calibrated),
            "wmrl/calibration_pairs": float(self.debiaser.n_pairs),
            "wmrl/calibration_fits": float(self.debiaser.fits),
            "wmrl/pairs_new": diag.get("pairs_new"),
            "wmrl/bias_reduction": diag.get("bias_reduction"),
            "wmrl/prequential_mse_raw": diag.get("prequential_mse_raw"),
            "wmrl/prequential_mse_calibrated": diag.get("prequential_mse_calibrated"),
            "wmrl/disagreement": fusion.disagreement,
            "wmrl/signal_var": fusion.signal_var,
            "wmrl/error_var": fusion.error_var,
            "wmrl/noise_var": fusion.noise_var,
            "wmrl/anchor_error_var": fusion.anchor_error_var,
            "wmrl/exec_reliability": fusion.reliability,
            "wmrl/persistence": fusion.persistence,
            "wmrl/design_effect": fusion.design_effect,
            "wmrl/variance_ratio": fusion.ratio,
            "wmrl/weight_anchor": stream_mean(anchor),
            "wmrl/weight_world_model": stream_mean(~anchor),
            "wmrl/anchor_share": float(weights[anchor & contributes].sum()) / total_w
            if total_w > 0
            else None,
            "wmrl/effective_lr_scale": float(weights[contributes].mean()) if contributes.any() else None,
            "wmrl/groups_skipped": float((~contributes).sum()),
            "wmrl/groups_degenerate": float(ga.degenerate.sum()),
        }

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically (plain Python and numpy values)."""
        return {
            "version": STATE_VERSION,
            "config": to_dict(self.config),
            "step": self.step_count,
            "executions_total": self.executions_total,
            "rollouts_total": self.rollouts_total,
            "fraction": self.fraction,
            "budget_reference": self.budget_reference,
            "scheduler": self.scheduler.state_dict(),
            "debiaser": self.debiaser.state_dict(),
            "fusion": self.fusion.state_dict(),
            "exec_noise": self.exec_noise.state_dict(),
            "memory": None if self.memory is None else self.memory.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"corrector state version {state.get('version')} is not {STATE_VERSION}")
        saved = from_dict(CorrectorConfig, state["config"])
        if saved != self.config:
            raise ValueError(
                "the saved corrector was configured differently from this one; build the corrector "
                "with the saved config (Corrector.from_state) to resume"
            )
        self.step_count = int(state["step"])
        self.executions_total = int(state["executions_total"])
        self.rollouts_total = int(state["rollouts_total"])
        self.fraction = float(state["fraction"])
        ref = state["budget_reference"]
        self.budget_reference = None if ref is None else float(ref)
        self.scheduler.load_state_dict(state["scheduler"])
        self.debiaser.load_state_dict(state["debiaser"])
        self.fusion.load_state_dict(state["fusion"])
        self.exec_noise.load_state_dict(state["exec_noise"])
        if self.memory is not None:
            self.memory.load_state_dict(state["memory"])

    def save(self, path: str | Path) -> Path:
        """Write the state as JSON (exact: floats round-trip through ``repr``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(_jsonable(self.state_dict())))
        tmp.replace(path)  # atomic: a crash mid-write never leaves a truncated state behind
        return path

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Corrector:
        corrector = cls(from_dict(CorrectorConfig, state["config"]))
        corrector.load_state_dict(state)
        return corrector

    @classmethod
    def load(cls, path: str | Path) -> Corrector:
        return cls.from_state(_from_jsonable(json.loads(Path(path).read_text())))


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.array(value["__ndarray__"], dtype=value["dtype"])
        return {k: _from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_jsonable(v) for v in value]
    return value
