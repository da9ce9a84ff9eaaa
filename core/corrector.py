"""The corrector: one object per run that owns the anchor scheduler, the debiaser and the fusion.

It is the method's mathematics, with no sources in it: ``plan(...)`` says which groups to execute
for real, the caller scores, ``correct(...)`` does the rest. Calling the two reward sources,
booking their costs and checkpointing belong to :class:`wmrl.core.pipeline.RewardPipeline`, which
every trainer and engine drives.
``plan`` says which rollouts to execute for real (``Plan.execute``: whole anchor groups, plus single
rollouts when ``scheduler.rollout_share > 0``) and which to execute a second time (``Plan.repeat``,
when ``scheduler.repeat_share > 0``).

One step, in order: choose anchors (outcome-blind) → score → pool the repeated executions (noise) →
measure the world model's error on the anchor groups' advantages with the map fitted *before* them
(prequential), net of the execution noise → update the fusion estimates → add the pairs and refit
the map (once per step) → calibrate the world-model scores → advantages per group → multiply by the
fusion weights. Every metric name the corrector emits is listed in
:data:`METRICS` and documented in ``docs/architecture.md``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.core.advantages import AdvantageConfig, as_reward_matrix, group_advantages
from wmrl.core.config import from_dict, require, to_dict
from wmrl.core.debias import DebiasConfig, OnlineDebiaser
from wmrl.core.execnoise import ExecutionNoise
from wmrl.core.fusion import Fusion, FusionConfig, FusionInputs
from wmrl.core.gain import GainInputs, within_sums
from wmrl.core.memory import ExecutionMemory, MemoryConfig, MemoryLookup
from wmrl.core.modes import MODE_PRESETS, Mode, apply_changes, resolve_memory
from wmrl.core.rollouts import Group
from wmrl.core.scheduler import AnchorScheduler, SchedulerConfig
from wmrl.core.sources import NoiseModel

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

METRICS: dict[str, str] = {
    "wmrl/step": "corrector steps completed (this step's index + 1)",
    "wmrl/groups": "groups in this step",
    "wmrl/anchor_groups": "groups graded by real execution this step",
    "wmrl/anchor_fraction": "anchor groups / groups, this step",
    "wmrl/anchor_fraction_realised": "anchor groups / groups over the whole run",
    "wmrl/anchor_fraction_target": "the fraction the scheduler aimed at this step (adaptive budget moves it)",
    "wmrl/unknown_world_model": "share of world-model scores that are unknown (None), this step",
    "wmrl/unknown_anchor": "share of anchor-group real scores that are unknown, this step",
    "wmrl/calibrated": "1 when a fitted isotonic map (not the identity) is in use",
    "wmrl/calibration_pairs": "(world model, real) pairs in the calibration window",
    "wmrl/calibration_fits": "isotonic refits so far",
    "wmrl/pairs_new": "pairs added this step",
    "wmrl/bias_reduction": "1 - within-group SS(calibrated error) / SS(raw error) on this step's new pairs, prequential",
    "wmrl/prequential_mse_raw": "mean squared error of raw world-model scores on this step's new pairs",
    "wmrl/prequential_mse_calibrated": "the same after the map fitted before these pairs",
    "wmrl/disagreement": "E/q: the calibrated world model's advantage error relative to the signal",
    "wmrl/signal_var": "q: mean squared true advantage per rollout (1 when standardised; reward units² for scale=reward)",
    "wmrl/error_var": "E: mean squared error of the calibrated world model's advantages against the true ones, net of execution noise",
    "wmrl/noise_var": "F: per-call noise the world model reports, per rollout in advantage units",
    "wmrl/anchor_error_var": "N: mean squared error of the real advantages caused by execution noise, per rollout",
    "wmrl/exec_reliability": "rho^2: share of the real scores' within-group variance that is signal, not execution noise",
    "wmrl/exec_noise_var": "sigma^2 used for this step's executed rollouts (reward units², mean); 0 when assumed deterministic",
    "wmrl/exec_noise_route": "where sigma^2 came from: 0 assumed deterministic, 1 declared by the source, 2 measured from repeats",
    "wmrl/exec_noise_measured": "pooled repeat estimate of sigma^2, (r1 - r2)^2 / 2 (None before fusion.min_repeats repeats)",
    "wmrl/exec_repeats": "rollouts executed a second time this step with both scores known",
    "wmrl/exec_repeat_differs": "share of this step's repeats whose two scores differ (flaky execution); None without repeats",
    "wmrl/executions": "real executions this step (whole anchor groups, single rollouts and repeats)",
    "wmrl/execution_share_realised": "real executions / rollouts over the whole run (memory hits cost none)",
    "wmrl/rollout_anchors": "single rollouts executed outside anchor groups this step",
    "wmrl/persistence": "psi: extra error per unit of error from rollouts repeating a solution within the update's memory (None: no solution keys)",
    "wmrl/design_effect": "multiplier on E for persistent error: 1 + psi, or the bias_horizon fallback without solution keys",
    "wmrl/variance_ratio": "V_wm / V_anchor: the anchor weight over the world-model weight before normalisation",
    "wmrl/weight_anchor": "mean group weight of anchor groups",
    "wmrl/weight_world_model": "mean group weight of world-model groups",
    "wmrl/anchor_share": "share of the total group weight carried by anchor groups (lambda)",
    "wmrl/effective_lr_scale": "mean group weight over contributing groups: the implied learning-rate multiplier",
    "wmrl/groups_skipped": "groups with fewer than min_graded known rewards (no advantages)",
    "wmrl/groups_degenerate": "contributing groups whose known rewards are all equal",
    "wmrl/fusion_bound": "1 when a bound, not the measurement, set this step's weights (max_ratio in mse/inverse_variance; a negative correlation or a clipped variance in gain)",
    "wmrl/wm_gain": "rho: within-group correlation of a calibrated world-model call with the true reward (measured in every fusion mode but paper, applied by gain; None before evidence)",
    "wmrl/gain_route": "where rho came from: 0 no evidence yet, 1 residuals of executed rollouts (random-effects model), 2 whole anchor groups",
    "wmrl/wm_spread_var": "V_c: within-group variance of calibrated world-model scores (reward units²)",
    "wmrl/wm_slope": "beta: within-group slope of the real score on the calibrated world-model score (1: calibrated; 0: no relation)",
    "wmrl/wm_residual_var": "sigma_u^2: error variance of one calibrated world-model call against real execution, net of execution noise",
    "wmrl/wm_fresh_var": "sigma_xi^2: per-call noise, from repeated world-model calls on one solution within a step (None: too few)",
    "wmrl/wm_persistent_var": "sigma_b^2 = sigma_u^2 - sigma_xi^2: the per-solution error that repeated calls do not average away",
    "wmrl/wm_icc": "sigma_b^2 / sigma_u^2: share of the world model's error that persists per solution",
    "wmrl/weight_zero_groups": "contributing groups given weight 0 (gain fusion: no measured gain in their rewards)",
    "memory/hits": "rollouts graded from the execution memory this step (no world model, no execution)",
    "memory/misses": "rollouts with a solution key the memory did not know this step",
    "memory/size": "solutions in the execution memory",
    "memory/recorded": "real outcomes added to the memory this step",
    "memory/known_share": "share of this step's rollouts graded from the memory",
}


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
    # The default, decided by measurement at equal cost (docs/method.md §6, docs/benchmarks.md): the
    # execution budget on single rollouts, a quota of half of each group, each group's top-ranked
    # solutions not yet known; no whole anchor groups; every outcome remembered; the gain fusion.
    scheduler: SchedulerConfig = field(
        default_factory=lambda: SchedulerConfig(fraction=0.5, floor=0, rollout_share=1.0)
    )
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    fusion: FusionConfig = field(default_factory=lambda: FusionConfig(mode="gain"))
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)

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


PRESETS = {
    "wmrl": lambda c: c,
    # The default before issue 32: whole anchor groups at 10%, the mse fusion with its horizon, no memory.
    "wmrl_groups": _groups,
    # The default's parts, each taken away (docs/benchmarks.md)
    "wmrl_no_memory": lambda c: _with(c, memory={"enabled": False}),
    "wmrl_flat": lambda c: _with(c, fusion={"mode": "none"}),
    # The default before issue 11: errors in reward units, execution noise ignored, horizon H = 8.
    "wmrl_previous": lambda c: _with(
        _groups(c), fusion={"mode": "mse", "scale": "reward", "bias_horizon": 8.0}
    ),
    "wmrl_measured": lambda c: _with(_groups(c), fusion={"mode": "mse", "persistence": "measured"}),
    # The whole execution budget on single rollouts (each group's top-scored solution), no anchor
    # groups: the arm that won on the benchmark's tuning seeds (docs/benchmarks.md).
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
    anchor: np.ndarray
    fraction: float
    execute: np.ndarray | None = None
    repeat: np.ndarray | None = None
    known: np.ndarray | None = None

    @property
    def anchor_indices(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.anchor)]

    def execute_mask(self, group_size: int) -> np.ndarray:
        """``(n_groups, group_size)`` bool: the rollouts to execute (the anchor rows when ``execute`` is unset)."""
        if self.execute is not None:
            if self.execute.shape[1] != group_size:
                raise ValueError(
                    f"the plan was made for groups of {self.execute.shape[1]} rollouts, not {group_size}"
                )
            return self.execute
        return np.repeat(self.anchor[:, None], group_size, axis=1)

    def repeat_mask(self, group_size: int) -> np.ndarray:
        """``(n_groups, group_size)`` bool: the rollouts to execute a second time (none when ``repeat`` is unset)."""
        if self.repeat is not None:
            if self.repeat.shape[1] != group_size:
                raise ValueError(
                    f"the plan was made for groups of {self.repeat.shape[1]} rollouts, not {group_size}"
                )
            return self.repeat
        return np.zeros((len(self.anchor), group_size), dtype=bool)


@dataclass
class Correction:
    """The corrected batch.

    Attributes:
        rewards: ``(n_groups, group_size)`` rewards used for advantages: real scores in anchor
            groups, calibrated world-model scores elsewhere; NaN = unknown.
        advantages: ``(n_groups, group_size)``, fusion weights applied; NaN = no advantage (mask out).
        weights: ``(n_groups,)`` group weights (0 for groups that contribute nothing).
        anchor: ``(n_groups,)`` bool.
        metrics: ``wmrl/*`` metrics (see :data:`METRICS`); ``None`` where a value could not be measured.
        calibrated: ``(n_groups, group_size)`` every world-model score through the map in force after
            this step's refit (anchor groups included, for display); NaN = unknown.
        executed: ``(n_groups, G)`` bool, the rollouts whose reward is a real score (the mean of its
            executions when it was repeated; the execution memory's outcome for ``from_memory``).
        from_memory: ``(n_groups, G)`` bool, the rollouts graded from the execution memory (their
            solution was executed at an earlier step).
    """

    rewards: np.ndarray
    advantages: np.ndarray
    weights: np.ndarray
    anchor: np.ndarray
    metrics: dict[str, float | None]
    calibrated: np.ndarray | None = None
    executed: np.ndarray | None = None
    from_memory: np.ndarray | None = None

    def advantages_list(self, sizes: Sequence[int] | np.ndarray | None = None) -> list[list[float | None]]:
        """Advantages as ragged lists with ``None`` for masked rollouts (``sizes``: true group sizes)."""
        n, width = self.advantages.shape
        if sizes is None:
            sizes = [width] * n
        sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(sizes) != n or any(not 0 <= v <= width for v in sizes):
            raise ValueError(f"sizes must give {n} group sizes, each in [0, {width}]; got {sizes}")
        return [
            [None if np.isnan(v) else float(v) for v in row[:s]]
            for row, s in zip(self.advantages, sizes, strict=True)
        ]


def _validate_scores(
    name: str, scores: np.ndarray | Sequence[Sequence[float | None]], shape: tuple[int, int] | None
) -> np.ndarray:
    matrix = as_reward_matrix(scores, name)
    if shape is not None and matrix.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (groups, rollouts); got {matrix.shape}")
    return matrix


def _refuse_stray(name: str, scores: np.ndarray, allowed: np.ndarray, what: str) -> None:
    stray = ~allowed & ~np.isnan(scores)
    if stray.any():
        cells = [(int(r), int(c)) for r, c in zip(*np.nonzero(stray), strict=True)][:5]
        raise ValueError(
            f"{name} hold values at (group, rollout) {cells}{'...' if stray.sum() > 5 else ''}: only the plan's "
            f"{what} are graded by real execution; leave the rest NaN/None"
        )


def _share_executed(
    real: np.ndarray, used: np.ndarray, anchor: np.ndarray, keys: np.ndarray, anchor_rows_too: bool = False
) -> tuple[np.ndarray, np.ndarray]:
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
        acc = sums.get(keys[r, c])
        if acc is not None:
            real[r, c] = acc[0] / acc[1]
            used[r, c] = True
    return real, used


def _task_keys(task_keys: Sequence[Any] | None, n: int) -> tuple[str, ...] | None:
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


def _solution_keys(keys: Any, shape: tuple[int, int]) -> np.ndarray | None:
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
        self.tasks = _task_keys(task_keys, n)
        self.step = corrector.step_count
        sched = corrector.scheduler
        budget = sched.count(self.step, n, in_flight, corrector.fraction)
        whole = sched.split(self.step, budget, n)
        self.anchor = sched.select(
            self.step, self.keys, self.tasks, None, in_flight, corrector.fraction, count=whole
        )
        self.solutions = _solution_keys(solution_keys, self.shape)
        self.lookup = corrector.known(self.solutions, self.shape)
        memory_on = self.solutions is not None and corrector.memory is not None
        self.known = self.lookup.known if memory_on else None
        self.execute = np.repeat(self.anchor[:, None], self.shape[1], axis=1)
        if self.known is not None:
            self.execute = _first_unknown(self.execute, self.known, self.solutions)
        self.per_group = (
            corrector.fraction * self.shape[1] if corrector.config.scheduler.rollout_share >= 1.0 else None
        )
        self.covered: set[str] = set()
        if self.solutions is not None:
            self.covered = {k for k in self.solutions[self.anchor].reshape(-1).tolist() if k is not None}
        self.wm = np.full(self.shape, np.nan)
        self.added = np.zeros(n, dtype=bool)

    def anchor_rows(self) -> np.ndarray:
        """``(n_groups, G)`` bool: the anchor groups' executions (known before any world-model score)."""
        return self.execute & self.anchor[:, None]

    def add(self, row: int, wm_row: np.ndarray | Sequence[float | None]) -> np.ndarray:
        """Group ``row``'s world-model scores are in: its single executions, ``(G,)`` bool (none for an
        anchor group, whose executions :meth:`anchor_rows` gave)."""
        if self.added[row]:
            raise ValueError(f"group {row} was added twice")
        scores = _validate_scores("wm_scores", [list(wm_row)], (1, self.shape[1]))[0]
        self.added[row] = True
        self.wm[row] = scores
        if self.anchor[row] or self.per_group is None:
            return np.zeros(self.shape[1], dtype=bool)
        task = "" if self.tasks is None else self.tasks[row]
        cal = self.corrector.debiaser.calibrate(
            scores[None, :], np.full((1, self.shape[1]), task, dtype=object)
        )[0]
        chosen = self.corrector.scheduler.select_group(
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


def _task_matrix(tasks: Sequence[str] | None, shape: tuple[int, int]) -> np.ndarray:
    """The task of every rollout, ``(n_groups, G)`` object (``""`` for one task)."""
    return np.array([[t] * shape[1] for t in (tasks or ("",) * shape[0])], dtype=object).reshape(shape)


def _first_unknown(execute: np.ndarray, known: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``execute`` without known solutions, and each unknown solution executed once (its first cell).

    A solution's other rollouts get its real score when it lands (:func:`_share_executed`).
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


def _calls_and_means(
    values: np.ndarray, scored: np.ndarray, keys: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
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
        acc = sums.get(keys[r, c]) if keys[r, c] is not None else None
        if acc is not None:
            calls[r, c] = acc[1]
            means[r, c] = acc[0] / acc[1]
    return calls, means


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
        keys = _solution_keys(solution_keys, shape)
        if self.memory is None or keys is None:
            return MemoryLookup.nothing(shape)
        return self.memory.lookup(keys, shape, count=False)

    def plan_stream(
        self,
        group_keys: Sequence[str],
        task_keys: Sequence[str | None] | None,
        group_size: int,
        solution_keys: Sequence[Sequence[str | None]] | np.ndarray | None = None,
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
        wm_scores: np.ndarray | Sequence[Sequence[float | None]] | None = None,
        in_flight: int = 0,
        group_size: int | None = None,
        solution_keys: Sequence[Sequence[str | None]] | np.ndarray | None = None,
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
        """
        keys = tuple(str(k) for k in group_keys)
        n = len(keys)
        if n == 0:
            raise ValueError("plan() needs at least one group")
        tasks = _task_keys(task_keys, n)
        sched = self.config.scheduler
        wm = None
        if wm_scores is not None:
            wm = _validate_scores("wm_scores", wm_scores, None)
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
            per_item = self.debiaser.uncertainty(wm)
            known = ~np.isnan(wm)
            uncertainty = np.where(
                known.any(axis=1), (per_item * known).sum(axis=1) / np.maximum(known.sum(axis=1), 1), 0.0
            )
        step = self.step_count
        budget = self.scheduler.count(step, n, in_flight, self.fraction)
        whole = self.scheduler.split(step, budget, n)
        mask = self.scheduler.select(step, keys, tasks, uncertainty, in_flight, self.fraction, count=whole)
        execute = repeat = known = None
        if width is not None:
            shape = (n, width)
            solutions = _solution_keys(solution_keys, shape)
            lookup = self.known(solutions, shape)
            known = lookup.known if solutions is not None and self.memory is not None else None
            execute = np.repeat(mask[:, None], width, axis=1)
            if whole < budget or sched.rollout_share >= 1.0:
                # The same number of executions as the whole groups they replace; ranked by what is
                # known (the memory's outcome) before the world model's calibrated score.
                cal = self.debiaser.calibrate(wm, _task_matrix(tasks, shape))
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
                )
            if known is not None:
                execute = _first_unknown(execute, known, solutions)
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
        wm_scores: np.ndarray | Sequence[Sequence[float | None]],
        anchor_scores: np.ndarray | Sequence[Sequence[float | None]],
        wm_variance: np.ndarray | Sequence[Sequence[float | None]] | None = None,
        *,
        anchor_repeats: np.ndarray | Sequence[Sequence[float | None]] | None = None,
        anchor_noise: NoiseModel | np.ndarray | None = None,
        solution_keys: Sequence[Sequence[str | None]] | np.ndarray | None = None,
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
                solution": the fusion measures from them how far the world model's error on a
                solution persists (``docs/method.md`` §3).
        """
        if plan.step != self.step_count:
            raise ValueError(
                f"plan is for step {plan.step} but the corrector is at step {self.step_count}: plan each step once"
            )
        n = len(plan.group_keys)
        if n == 0:
            raise ValueError("correct() needs a plan with at least one group")
        wm = _validate_scores("wm_scores", wm_scores, None)
        if wm.shape[0] != n:
            raise ValueError(f"wm_scores has {wm.shape[0]} groups; the plan has {n}")
        shape = wm.shape
        real = _validate_scores("anchor_scores", anchor_scores, shape)
        execute = plan.execute_mask(shape[1])
        repeat_mask = plan.repeat_mask(shape[1])
        anchor = plan.anchor
        _refuse_stray("anchor_scores", real, execute, "executed rollouts (plan.execute)")
        second = None
        if anchor_repeats is not None:
            second = _validate_scores("anchor_repeats", anchor_repeats, shape)
            _refuse_stray("anchor_repeats", second, repeat_mask, "repeated rollouts (plan.repeat)")
        noise = None
        if wm_variance is not None:
            noise = _validate_scores("wm_variance", wm_variance, shape)
            if (noise < 0).any():
                raise ValueError(
                    "wm_variance holds negative values: a variance is >= 0 (score units²), NaN if unknown"
                )
        declared = self._declared(anchor_noise, shape, real, second)
        keys = _solution_keys(solution_keys, shape)
        task_of_item = np.array(
            [[t] * shape[1] for t in (plan.task_keys or ("",) * n)], dtype=object
        ).reshape(shape)
        metrics: dict[str, float | None] = {}

        # 0. Repeated executions: the noise measurement, and the rewards as means of the executions.
        repeats = self.exec_noise.observe(real, second)
        executions = (~np.isnan(real)).astype(np.int64)
        if second is not None:
            executions += ~np.isnan(second)
            with np.errstate(invalid="ignore"):
                real_mean = np.where(
                    executions > 0, np.nansum(np.stack([real, second]), axis=0) / executions, np.nan
                )
        else:
            real_mean = real
        # What the execution memory knew before this step (graded from it, not executed now).
        lookup = self.memory.lookup(keys, shape) if self.memory is not None else MemoryLookup.nothing(shape)
        from_memory = lookup.known & np.isnan(real_mean)

        # 1. Prequential measurement on anchor pairs, with the map fitted before they arrived.
        pair = execute & ~np.isnan(wm) & ~np.isnan(real_mean)
        rows, cols = np.nonzero(pair)
        calibrated_pairs = self.debiaser.calibrate(wm[rows, cols], task_of_item[rows, cols])
        exec_var, route = self.exec_noise.variances(
            declared, calibrated_pairs, executions[rows, cols], (rows, cols)
        )
        in_anchor = anchor[rows]
        wm_var = None
        if noise is not None:
            slope = self._map_slope(wm[rows, cols], task_of_item[rows, cols])
            wm_var = (noise[rows, cols] * slope**2)[in_anchor]
        used_real = execute & ~np.isnan(real_mean)
        if keys is not None and (self.memory is not None or (execute & ~anchor[:, None]).any()):
            # A solution executed this step needs no second opinion: its real score (the mean of its
            # executions) serves every other rollout of it.
            real_mean, used_real = _share_executed(
                real_mean, used_real, anchor, keys, anchor_rows_too=self.memory is not None
            )
        real_mean = np.where(from_memory, lookup.mean, real_mean)
        used_real = used_real | from_memory
        self.fusion.observe(
            FusionInputs(
                real=real_mean[rows, cols][in_anchor],
                calibrated=calibrated_pairs[in_anchor],
                group=rows[in_anchor],
                exec_var=exec_var[in_anchor],
                wm_var=wm_var,
                keys=None if keys is None else keys[rows, cols][in_anchor],
                n_groups=n,
            )
        )
        if self.debiaser.calibrated and self.config.fusion.mode != "paper":
            # measured (and reported) whatever the fusion: what the world model shares with the truth
            self.fusion.observe_gain(
                self._gain_inputs(wm, real_mean, calibrated_pairs, exec_var, rows, cols, keys, task_of_item)
            )

        # 2. Add the pairs, refit once for the step.
        diag = self.debiaser.observe(
            self.step_count, wm[rows, cols], real_mean[rows, cols], rows, task_of_item[rows, cols]
        )
        self.debiaser.refit(self.step_count)

        # 3. Rewards: real in anchor groups (unknown stays unknown), in executed single rollouts and
        #    in solutions the memory knows (an unknown one falls back to its world-model score),
        #    calibrated world model elsewhere (with the gain fusion, the mean of this step's calls on
        #    the same solution).
        calibrated = self.debiaser.calibrate(wm, task_of_item)
        wm_reward, wm_calls = calibrated, None
        if self.config.fusion.mode == "gain":
            wm_calls, wm_reward = _calls_and_means(calibrated, ~np.isnan(calibrated), keys)
        rewards = np.where(anchor[:, None] | used_real, real_mean, wm_reward)
        ga = group_advantages(rewards, None, self.config.advantages)
        known = ~np.isnan(rewards)
        is_real = (anchor[:, None] | used_real) & known
        share = is_real.sum(axis=1) / np.maximum(known.sum(axis=1), 1)
        if wm_calls is not None:
            # gain: a weight per rollout (a real reward's gain beside the world model's, in one group)
            wm_calls = np.where(is_real | ~known, np.nan, wm_calls)
            cell = self.fusion.cell_weights(is_real, wm_calls, ga.contributes, known)
            advantages = ga.advantages * cell
            counts = np.maximum(known.sum(axis=1), 1)
            weights = np.where(ga.contributes, cell.sum(axis=1) / counts, 0.0)
        else:
            weights = self.fusion.weights(anchor, ga.contributes, share)
            advantages = ga.advantages * weights[:, None]

        # The memory learns every outcome executed this step (after it was used as a lookup).
        recorded = 0
        if self.memory is not None and keys is not None:
            for scores in (real, second):
                if scores is not None:
                    done = ~np.isnan(scores) & (keys != None)  # noqa: E711 (object array)
                    recorded += self.memory.record(keys[done].tolist(), scores[done].tolist())

        # 4. Bookkeeping: commit the selection, move the budget, report.
        self.scheduler.commit(anchor, plan.task_keys)
        self.step_count += 1
        self._update_budget()
        metrics.update(self._metrics(plan, wm, real, anchor, ga, weights, diag))
        metrics.update(
            {
                "wmrl/exec_noise_var": float(exec_var.mean()) if exec_var.size else None,
                "wmrl/exec_noise_route": float(route),
                "wmrl/exec_noise_measured": self.exec_noise.measured_var,
                "wmrl/exec_repeats": repeats["repeats"],
                "wmrl/exec_repeat_differs": repeats["differs"],
                "wmrl/executions": float(execute.sum() + repeat_mask.sum()),
                "wmrl/execution_share_realised": self._count_executions(
                    int(
                        np.count_nonzero(~np.isnan(real))
                        + (0 if second is None else np.count_nonzero(~np.isnan(second)))
                    ),
                    int(np.count_nonzero(~np.isnan(wm) | ~np.isnan(real) | from_memory)),
                ),
                "wmrl/rollout_anchors": float((execute & ~anchor[:, None]).sum()),
                "wmrl/weight_zero_groups": float(np.count_nonzero(ga.contributes & (weights == 0))),
            }
        )
        metrics.update(self._gain_metrics())
        if self.memory is not None:
            with_key = 0 if keys is None else int(np.count_nonzero(keys != None))  # noqa: E711
            metrics.update(
                {
                    "memory/hits": float(from_memory.sum()),
                    "memory/misses": float(with_key - int(lookup.known.sum())),
                    "memory/size": float(len(self.memory)),
                    "memory/recorded": float(recorded),
                    "memory/known_share": float(from_memory.mean()) if from_memory.size else None,
                }
            )
        return Correction(
            rewards=rewards,
            advantages=advantages,
            weights=weights,
            anchor=anchor.copy(),
            metrics=metrics,
            calibrated=calibrated,
            executed=is_real,
            from_memory=from_memory & known,
        )

    @staticmethod
    def _declared(
        anchor_noise: NoiseModel | np.ndarray | None,
        shape: tuple[int, int],
        real: np.ndarray,
        second: np.ndarray | None,
    ) -> NoiseModel | np.ndarray | None:
        """Validate the declared execution noise against the scores it describes."""
        if anchor_noise is None:
            return None
        if isinstance(anchor_noise, NoiseModel):
            if anchor_noise.kind == "bernoulli":
                for name, scores in (("anchor_scores", real), ("anchor_repeats", second)):
                    if scores is not None:
                        known = scores[~np.isnan(scores)]
                        if ((known != 0) & (known != 1)).any():
                            raise ValueError(
                                f"the anchor declares bernoulli noise but {name} holds values other than 0 and 1"
                            )
            return anchor_noise
        if not isinstance(anchor_noise, np.ndarray) and not isinstance(anchor_noise, (list, tuple)):
            raise ValueError(
                f"anchor_noise must be a NoiseModel or a (n_groups, G) variance array; got {type(anchor_noise).__name__}"
            )
        var = _validate_scores("anchor_noise", anchor_noise, shape)
        if (var < 0).any():
            raise ValueError("anchor_noise holds negative variances: a variance is >= 0 (score units²)")
        return var

    def _count_executions(self, executions: int, rollouts: int) -> float | None:
        self.executions_total += executions
        self.rollouts_total += rollouts
        return self.executions_total / self.rollouts_total if self.rollouts_total else None

    def _gain_inputs(
        self,
        wm: np.ndarray,
        real_mean: np.ndarray,
        calibrated_pairs: np.ndarray,
        exec_var: np.ndarray,
        rows: np.ndarray,
        cols: np.ndarray,
        keys: np.ndarray | None,
        tasks: np.ndarray,
    ) -> GainInputs:
        """This step's evidence for the random-effects model of the world model's error (``core/gain.py``),
        all on the map fitted before this step's pairs (prequential)."""
        before = self.debiaser.calibrate(wm, tasks)
        scored = ~np.isnan(before)
        group = np.broadcast_to(np.arange(wm.shape[0])[:, None], wm.shape)
        spread_ss, spread_dof = within_sums(before[scored], group[scored])
        dup_ss = dup_dof = 0.0
        if keys is not None:
            keyed = scored & (keys != None)  # noqa: E711 (object array)
            if keyed.any():
                dup_ss, dup_dof = within_sums(before[keyed], keys[keyed].astype(str))
        return GainInputs(
            real=real_mean[rows, cols],
            calibrated=calibrated_pairs,
            group=rows,
            exec_var=exec_var,
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

    def _map_slope(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Local slope of the current map at ``x`` (maps per-call noise onto the calibrated scale).

        A central difference over 5% of the map's range (relative, so units do not matter); a map
        with a single knot is constant, slope 0.
        """
        if not self.debiaser.calibrated:
            return np.ones_like(x)
        span = float(np.ptp(self.debiaser.pooled.x_knots))
        if span <= 0:
            return np.zeros_like(x)
        h = 0.05 * span
        return (self.debiaser.calibrate(x + h, keys) - self.debiaser.calibrate(x - h, keys)) / (2 * h)

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

    def _metrics(self, plan, wm, real, anchor, ga, weights, diag) -> dict[str, float | None]:
        n = len(anchor)
        contributes = ga.contributes
        total_w = float(weights[contributes].sum())

        def stream_mean(mask: np.ndarray) -> float | None:
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
