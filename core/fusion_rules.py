"""Fusion rules: how a step's measured evidence becomes a weight on every rollout's advantage.

A rule is a pure function ``(fusion, context) -> (n_groups, G) weights`` registered under the name
``fusion.mode`` selects (verl's ``register_adv_est`` is the model): :func:`register_fusion` refuses a
name twice, :func:`fusion_rule` looks one up. The evidence (sums over the anchor pairs, the gain's
random-effects model) lives in :class:`~wmrl.core.fusion.Fusion`; a rule only reads it.

The default family is here: ``none`` (every rollout weight 1: GRPO on the calibrated rewards) and
``gain`` (each rollout weighted by its measured gain, ``docs/method.md`` §2.5). The estimators kept
for comparison (``mse``, ``inverse_variance``, ``paper``) are in :mod:`wmrl.core.fusion_compare`.

Every rule returns 0 where a rollout carries no gradient (an unknown reward, a group that does not
contribute); the normalised rules make the mean weight over the other rollouts exactly 1, so the
fusion never secretly changes the learning rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from wmrl.core.fusion import Fusion

__all__ = ["FUSION_RULES", "FusionRule", "WeightContext", "fusion_rule", "register_fusion"]


@dataclass(frozen=True)
class WeightContext:
    """What a rule weights: one step's rollouts (``(n_groups, G)`` unless said otherwise).

    Attributes:
        is_anchor: ``(n_groups,)`` bool, whole anchor groups.
        contributes: ``(n_groups,)`` bool, groups that produce advantages (>= 2 known rewards).
        is_real: bool, rollouts whose reward is real (executed, or known from the memory).
        known: bool, rollouts with a known reward.
        wm_calls: the number of world-model calls behind each world-model reward (a solution scored
            several times in a step is scored by their mean), NaN where the reward is real or unknown.
    """

    is_anchor: npt.NDArray[Any]
    contributes: npt.NDArray[Any]
    is_real: npt.NDArray[Any]
    known: npt.NDArray[Any]
    wm_calls: npt.NDArray[Any]

    @property
    def live(self) -> npt.NDArray[Any]:
        """Rollouts that carry a gradient: a known reward in a contributing group."""
        return cast("npt.NDArray[Any]", self.known & self.contributes[:, None])

    @property
    def real_share(self) -> npt.NDArray[Any]:
        """``(n_groups,)`` share of each group's known rewards that are real."""
        return cast("npt.NDArray[Any]", self.is_real.sum(axis=1) / np.maximum(self.known.sum(axis=1), 1))


#: ``(fusion, context) -> (n_groups, G)`` weights.
FusionRule = Callable[["Fusion", WeightContext], npt.NDArray[Any]]

FUSION_RULES: dict[str, FusionRule] = {}


def register_fusion(name: str) -> Callable[[FusionRule], FusionRule]:
    """Register a rule under ``name`` (a decorator); a name already taken is refused."""

    def add(rule: FusionRule) -> FusionRule:
        if name in FUSION_RULES:
            raise ValueError(f"a fusion rule named {name!r} is already registered")
        FUSION_RULES[name] = rule
        return rule

    return add


def fusion_rule(name: str) -> FusionRule:
    """The rule registered under ``name``."""
    _load_comparisons()
    try:
        return FUSION_RULES[name]
    except KeyError:
        raise ValueError(f"no fusion rule named {name!r}; registered: {sorted(FUSION_RULES)}") from None


def _load_comparisons() -> None:
    """The comparison estimators register themselves when their module is imported."""
    import wmrl.core.fusion_compare  # noqa: F401


def normalised(raw: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``raw`` scaled so its mean over the rollouts with a positive weight is exactly 1."""
    total, count = raw.sum(), np.count_nonzero(raw > 0)
    out = raw * (count / total) if total > 0 else raw
    if not np.all(np.isfinite(out)) or (out < 0).any():
        raise FloatingPointError(f"fusion produced rollout weights {out.tolist()} (this is a bug)")
    return out


@register_fusion("none")
def flat(fusion: Fusion, ctx: WeightContext) -> npt.NDArray[Any]:
    """Every rollout that carries a gradient weighs 1: GRPO on real and calibrated rewards alike."""
    fusion.bound_binds = False
    return np.where(ctx.live, 1.0, 0.0)


@register_fusion("gain")
def gain(fusion: Fusion, ctx: WeightContext) -> npt.NDArray[Any]:
    """``w_i ∝ ρ_i``: ``ρ_r`` for a real reward, the world model's measured gain for one of its own.

    Under (A1) every rollout's term ``A_i ∇log π(y_i)`` is its own estimate of the gradient with the
    same variance (unit-scale advantages) and gain ``ρ_i``; signal-to-noise-optimal weights are
    proportional to the gains. Before any evidence every weight is 1.
    """
    fusion.bound_binds = False
    calls = np.asarray(ctx.wm_calls, dtype=float)
    sq, _ = fusion.wm_gain_sq(np.where(np.isnan(calls), 1.0, calls))
    if sq is None:
        return np.where(ctx.live, 1.0, 0.0)
    real = fusion.reliability if fusion.reliability is not None else 1.0
    gain_sq = np.where(ctx.is_real, real, np.broadcast_to(sq, calls.shape))
    return normalised(np.where(ctx.live, np.sqrt(np.clip(gain_sq, 0.0, 1.0)), 0.0))
