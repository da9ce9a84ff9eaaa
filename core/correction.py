"""What the corrector returns for a step, and the names of every metric it reports.

:class:`Correction` carries the step's rewards, weighted advantages, group weights and metrics;
:data:`METRICS` documents each metric name (``docs/architecture.md`` lists them, a test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.arrays import GroupMask, RewardMatrix, RolloutMask

__all__ = ["METRICS", "Correction"]

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

    rewards: RewardMatrix
    advantages: RewardMatrix
    weights: npt.NDArray[np.float64]
    anchor: GroupMask
    metrics: dict[str, float | None]
    calibrated: RewardMatrix | None = None
    executed: RolloutMask | None = None
    from_memory: RolloutMask | None = None

    def advantages_list(
        self, sizes: Sequence[int] | npt.NDArray[Any] | None = None
    ) -> list[list[float | None]]:
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
