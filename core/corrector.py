"""The corrector: one object per run that owns the anchor scheduler, the debiaser and the fusion.

It is the method's mathematics, with no sources in it: ``plan(...)`` says which groups to execute
for real, the caller scores, ``correct(...)`` does the rest. Calling the two reward sources,
booking their costs and checkpointing belong to :class:`wmrl.core.pipeline.RewardPipeline`, which
every trainer and engine drives.

One step, in order: choose anchors (outcome-blind) → score → measure the world model's error on
the anchor pairs with the map fitted *before* them (prequential) → update the fusion estimates →
add the pairs and refit the map (once per step) → calibrate the world-model groups → advantages per
group → multiply by the fusion weights. Every metric name the corrector emits is listed in
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
from wmrl.core.fusion import Fusion, FusionConfig
from wmrl.core.modes import MODE_PRESETS, Mode, apply_changes
from wmrl.core.rollouts import Group
from wmrl.core.scheduler import AnchorScheduler, SchedulerConfig

__all__ = [
    "METRICS",
    "PRESETS",
    "BudgetConfig",
    "Correction",
    "Corrector",
    "CorrectorConfig",
    "Group",
    "Plan",
]

STATE_VERSION = 1

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
    "wmrl/disagreement": "E/S: calibrated world-model error variance relative to the real within-group variance",
    "wmrl/signal_var": "S: variance of real within-group-centred rewards (decayed estimate)",
    "wmrl/error_var": "E: mean squared within-group error of the calibrated world model (decayed estimate)",
    "wmrl/noise_var": "N: per-call noise variance the world model reports, on the calibrated scale",
    "wmrl/weight_anchor": "mean group weight of anchor groups",
    "wmrl/weight_world_model": "mean group weight of world-model groups",
    "wmrl/anchor_share": "share of the total group weight carried by anchor groups (lambda)",
    "wmrl/effective_lr_scale": "mean group weight over contributing groups: the implied learning-rate multiplier",
    "wmrl/groups_skipped": "groups with fewer than min_graded known rewards (no advantages)",
    "wmrl/groups_degenerate": "contributing groups whose known rewards are all equal",
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
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)

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


PRESETS = {
    "wmrl": lambda c: c,
    "wmrl_inverse_variance": lambda c: _with(c, fusion={"mode": "inverse_variance"}),
    "wmrl_mse": lambda c: _with(c, fusion={"mode": "mse"}),
    "wmrl_adaptive_budget": lambda c: _with(c, budget={"adaptive": True}),
    "wmrl_active": lambda c: _with(c, scheduler={"active_share": 0.5}),
    "wmrl_paper_weight": lambda c: _with(c, fusion={"mode": "paper"}),
    "debias_only": lambda c: _with(c, fusion={"mode": "none"}),
    "fusion_only": lambda c: _with(c, debias={"enabled": False}),
    "uncorrected_mix": lambda c: _with(c, debias={"enabled": False}, fusion={"mode": "none"}),
    # the training modes: one definition, in wmrl.core.modes
    "world_model": lambda c: apply_changes(c, MODE_PRESETS[Mode.WORLD_MODEL]),
    "real": lambda c: apply_changes(c, MODE_PRESETS[Mode.REAL]),
}


@dataclass(frozen=True)
class Plan:
    """Which groups of a step are graded by real execution.

    Attributes:
        step: the corrector step this plan belongs to.
        group_keys: one unique key per group.
        task_keys: one task per group (``None``: one task).
        anchor: bool ``(n_groups,)``.
        fraction: the target fraction the scheduler used.
    """

    step: int
    group_keys: tuple[str, ...]
    task_keys: tuple[str, ...] | None
    anchor: np.ndarray
    fraction: float

    @property
    def anchor_indices(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.anchor)]


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
    """

    rewards: np.ndarray
    advantages: np.ndarray
    weights: np.ndarray
    anchor: np.ndarray
    metrics: dict[str, float | None]
    calibrated: np.ndarray | None = None

    def advantages_list(self, sizes: Sequence[int] | None = None) -> list[list[float | None]]:
        """Advantages as ragged lists with ``None`` for masked rollouts (``sizes``: true group sizes)."""
        sizes = sizes or [self.advantages.shape[1]] * self.advantages.shape[0]
        return [
            [None if np.isnan(v) else float(v) for v in row[:s]]
            for row, s in zip(self.advantages, sizes, strict=True)
        ]


def _validate_scores(
    name: str, scores: np.ndarray | Sequence[Sequence[float | None]], shape: tuple[int, int] | None
) -> np.ndarray:
    matrix = as_reward_matrix(scores)
    if shape is not None and matrix.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (groups, rollouts); got {matrix.shape}")
    return matrix


class Corrector:
    """Owns the scheduler, debiaser and fusion of one run. See the module docstring."""

    def __init__(self, config: CorrectorConfig | None = None) -> None:
        self.config = config or CorrectorConfig()
        self.scheduler = AnchorScheduler(self.config.scheduler, seed=self.config.seed)
        self.debiaser = OnlineDebiaser(self.config.debias)
        self.fusion = Fusion(self.config.fusion)
        self.step_count = 0
        self.budget_reference: float | None = None
        self.fraction = self.config.scheduler.fraction

    # -- the split API -----------------------------------------------------------------------
    def plan(
        self,
        group_keys: Sequence[str],
        task_keys: Sequence[str] | None = None,
        wm_scores: np.ndarray | Sequence[Sequence[float | None]] | None = None,
        in_flight: int = 0,
    ) -> Plan:
        """Choose this step's anchor groups. ``wm_scores`` is needed only by the active scheduler."""
        keys = tuple(str(k) for k in group_keys)
        tasks = None if task_keys is None else tuple(str(t) for t in task_keys)
        uncertainty = None
        if self.config.scheduler.active_share > 0:
            if wm_scores is None:
                raise ValueError(
                    "the active scheduler (scheduler.active_share > 0) needs wm_scores in plan()"
                )
            wm = _validate_scores("wm_scores", wm_scores, None)
            if wm.shape[0] != len(keys):
                raise ValueError(f"wm_scores has {wm.shape[0]} groups but {len(keys)} keys were given")
            per_item = self.debiaser.uncertainty(wm)
            known = ~np.isnan(wm)
            uncertainty = np.where(
                known.any(axis=1), (per_item * known).sum(axis=1) / np.maximum(known.sum(axis=1), 1), 0.0
            )
        mask = self.scheduler.select(self.step_count, keys, tasks, uncertainty, in_flight, self.fraction)
        return Plan(
            step=self.step_count, group_keys=keys, task_keys=tasks, anchor=mask, fraction=self.fraction
        )

    def correct(
        self,
        plan: Plan,
        wm_scores: np.ndarray | Sequence[Sequence[float | None]],
        anchor_scores: np.ndarray | Sequence[Sequence[float | None]],
        wm_variance: np.ndarray | None = None,
    ) -> Correction:
        """Calibrate, fuse and form advantages for the step ``plan`` was made for.

        Args:
            plan: this step's plan (from :meth:`plan`; the corrector refuses a stale one).
            wm_scores: ``(n_groups, G)`` world-model scores of every group, NaN/None = unknown.
            anchor_scores: ``(n_groups, G)`` real scores; only anchor groups may hold values
                (rows of world-model groups must be all NaN/None).
            wm_variance: optional ``(n_groups, G)`` per-call noise variance of each world-model score.
        """
        if plan.step != self.step_count:
            raise ValueError(
                f"plan is for step {plan.step} but the corrector is at step {self.step_count}: plan each step once"
            )
        n = len(plan.group_keys)
        wm = _validate_scores("wm_scores", wm_scores, None)
        if wm.shape[0] != n:
            raise ValueError(f"wm_scores has {wm.shape[0]} groups; the plan has {n}")
        real = _validate_scores("anchor_scores", anchor_scores, wm.shape)
        noise = None if wm_variance is None else _validate_scores("wm_variance", wm_variance, wm.shape)
        anchor = plan.anchor
        stray = ~anchor & ~np.isnan(real).all(axis=1)
        if stray.any():
            raise ValueError(
                f"anchor_scores hold values for world-model groups {np.flatnonzero(stray).tolist()}: "
                "only the plan's anchor groups are graded by real execution"
            )
        task_of_item = np.array(
            [[t] * wm.shape[1] for t in (plan.task_keys or ("",) * n)], dtype=object
        ).reshape(wm.shape)
        metrics: dict[str, float | None] = {}

        # 1. Prequential measurement on anchor pairs, with the map fitted before they arrived.
        pair = anchor[:, None] & ~np.isnan(wm) & ~np.isnan(real)
        rows, cols = np.nonzero(pair)
        calibrated_pairs = self.debiaser.calibrate(wm[rows, cols], task_of_item[rows, cols])
        real_groups, cal_groups, noise_groups = [], [], []
        slope = self._map_slope(wm[rows, cols], task_of_item[rows, cols]) if noise is not None else None
        for g in np.flatnonzero(anchor):
            sel = rows == g
            if sel.sum() >= 2:
                real_groups.append(real[g, cols[sel]])
                cal_groups.append(calibrated_pairs[sel])
                if noise is not None:
                    var = noise[g, cols[sel]]
                    noise_groups.append(None if np.isnan(var).any() else var * slope[sel] ** 2)
        self.fusion.observe(real_groups, cal_groups, noise_groups if noise is not None else None)

        # 2. Add the pairs, refit once for the step.
        diag = self.debiaser.observe(
            self.step_count, wm[rows, cols], real[rows, cols], rows, task_of_item[rows, cols]
        )
        self.debiaser.refit(self.step_count)

        # 3. Rewards: real in anchor groups, calibrated world model elsewhere.
        calibrated = self.debiaser.calibrate(wm, task_of_item)
        rewards = np.where(anchor[:, None], real, calibrated)
        ga = group_advantages(rewards, None, self.config.advantages)
        weights = self.fusion.weights(anchor, ga.contributes)
        advantages = ga.advantages * weights[:, None]

        # 4. Bookkeeping: commit the selection, move the budget, report.
        self.scheduler.commit(anchor, plan.task_keys)
        self.step_count += 1
        self._update_budget()
        metrics.update(self._metrics(plan, wm, real, anchor, ga, weights, diag))
        return Correction(
            rewards=rewards,
            advantages=advantages,
            weights=weights,
            anchor=anchor.copy(),
            metrics=metrics,
            calibrated=calibrated,
        )

    def _map_slope(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Local slope of the current map at ``x`` (maps per-call noise onto the calibrated scale)."""
        if not self.debiaser.calibrated:
            return np.ones_like(x)
        h = 0.05 * max(float(np.ptp(self.debiaser.pooled.x_knots)), 1e-6)
        return (self.debiaser.calibrate(x + h, keys) - self.debiaser.calibrate(x - h, keys)) / (2 * h)

    def _update_budget(self) -> None:
        cfg = self.config.budget
        rho = self.fusion.disagreement
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
            "fraction": self.fraction,
            "budget_reference": self.budget_reference,
            "scheduler": self.scheduler.state_dict(),
            "debiaser": self.debiaser.state_dict(),
            "fusion": self.fusion.state_dict(),
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
        self.fraction = float(state["fraction"])
        ref = state["budget_reference"]
        self.budget_reference = None if ref is None else float(ref)
        self.scheduler.load_state_dict(state["scheduler"])
        self.debiaser.load_state_dict(state["debiaser"])
        self.fusion.load_state_dict(state["fusion"])

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
