"""The fusion estimators kept for comparison with the default (``docs/method.md`` §2.1–2.4, §2.6).

* ``mse``: inverse-variance weights of whole groups, ``V_a = q + N`` against ``V_wm = q + F + H·(E − F)``
  (``persistence="horizon"``: the persistent part of the error counted ``bias_horizon`` times) or the
  keyed design effect (``persistence="measured"``); ``scale="reward"`` the estimator before issue 11;
* ``inverse_variance``: ``V_wm = q + E`` (every error fresh);
* ``paper``: the official heuristic, anchor weight ``clip(1 + c·s², 1, w_max)``, not normalised.

Each is a pure function of the evidence :class:`~wmrl.core.fusion.Fusion` accumulates; the ratio
``V_wm / V_a`` is clipped to ``[1/max_ratio, max_ratio]`` and ``fusion.bound_binds`` says when the
clip decided. Group weights are broadcast to the group's rollouts (:data:`FUSION_RULES` entries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from wmrl.core.fusion_rules import WeightContext, register_fusion

if TYPE_CHECKING:
    from wmrl.core.fusion import Fusion

__all__ = ["design_effect", "group_weights", "keyed", "paper_weight", "variance_ratio", "variances"]


def keyed(fusion: Fusion) -> tuple[float, float, float, float] | None:
    """``(κ_s, κ_e, κ_n, ψ)`` from solution keys, ``None`` without enough keyed evidence.

    ``κ`` are the ratios of the keyed (gradient-geometry) sums to the per-rollout sums, net of
    execution noise: they turn the per-rollout ``q``, ``E`` and ``N`` into what the gradient
    sees. ``ψ = 2·A·(1 - f)/f / (Σ_k D_k² - noise)`` adds the error shared with other groups and
    steps: across-group pairs are seen only between anchor groups, a share ``f`` of the groups a
    world-model group pairs with.
    """
    f = fusion.anchor_share
    if fusion.key_rollouts < fusion.config.min_keyed_rollouts or f is None or f <= 0:
        return None
    signal = fusion.key_signal - fusion.key_noise
    signal_diag = fusion.key_signal_diag - fusion.key_noise_diag
    error = fusion.key_error - fusion.key_noise
    error_diag = fusion.key_error_diag - fusion.key_noise_diag
    if signal <= 0 or signal_diag <= 0:
        return None
    k_s = signal / signal_diag
    k_e = max(error, 0.0) / error_diag if error_diag > 0 else 1.0
    k_n = fusion.key_noise / fusion.key_noise_diag if fusion.key_noise_diag > 0 else 1.0
    psi = max(2.0 * fusion.key_across * (1.0 - f) / f / error, 0.0) if error > 0 else 0.0
    return k_s, k_e, k_n, psi


def variances(fusion: Fusion) -> tuple[float, float, float] | None:
    """``(V_a, V_wm, D)`` per rollout, or ``None`` while there is too little evidence (cached per step)."""
    if fusion._cache is None:
        fusion._cache = (_compute_variances(fusion),)
    cached: tuple[float, float, float] | None = fusion._cache[0]
    return cached


def _compute_variances(fusion: Fusion) -> tuple[float, float, float] | None:
    cfg = fusion.config
    if cfg.mode in ("none", "paper", "gain") or fusion.groups_measured < cfg.min_groups:
        return None
    q, e, n_a = fusion.signal_var, fusion.error_var, fusion.anchor_error_var
    if q is None or e is None or n_a is None or q <= 0:
        return None
    if cfg.mode == "inverse_variance":
        return q + n_a, q + e, 1.0
    measured = keyed(fusion) if cfg.scale == "advantage" and cfg.persistence == "measured" else None
    if measured is not None:
        k_s, k_e, k_n, psi = measured
        d = k_e * (1.0 + psi) / k_s
        return q + n_a * k_n / k_s, q + d * e, d
    # Unmeasured persistence: what the source reports as per-call noise is fresh, the rest
    # is counted bias_horizon times.
    fresh = min(fusion.noise_var or 0.0, e)
    excess = fresh + cfg.bias_horizon * (e - fresh)
    return q + n_a, q + excess, (excess / e if e > 0 else 1.0)


def design_effect(fusion: Fusion) -> float | None:
    """The multiplier applied to ``E`` (``1 + ψ``, or the fallback's), ``None`` before warm-up."""
    v = variances(fusion)
    return None if v is None else v[2]


def variance_ratio(fusion: Fusion) -> float:
    """``V_wm / V_a``: the anchor weight over the world-model weight (1 until enough evidence).

    Clipped to ``[1/max_ratio, max_ratio]``: below 1 when the world model is the better stream
    (execution noisier than the world model's error); ``fusion.bound_binds`` is set when it binds.
    """
    v = variances(fusion)
    if v is None:
        return 1.0
    cap = fusion.config.max_ratio
    raw = v[1] / v[0]
    fusion.bound_binds = not (1.0 / cap < raw < cap)
    return float(min(max(raw, 1.0 / cap), cap))


def paper_weight(fusion: Fusion) -> float:
    """The official heuristic's anchor weight ``clip(1 + c·s², 1, w_max)`` (1 before warm-up)."""
    if fusion.paper_gain is None or fusion.paper_ema is None:
        return 1.0
    return float(min(max(1.0 + fusion.paper_gain * fusion.paper_ema, 1.0), fusion.config.paper_max_weight))


def group_weights(
    fusion: Fusion,
    is_anchor: npt.NDArray[Any],
    contributes: npt.NDArray[Any],
    executed_share: npt.NDArray[Any] | None = None,
) -> npt.NDArray[Any]:
    """Per-group loss weights of ``mse``, ``inverse_variance``, ``paper`` and ``none``, ``(n_groups,)``.

    ``executed_share``: the share in [0, 1] of each group's known rewards that are real (default: 1
    for anchor groups, 0 otherwise); a group with share ``s`` has ``V = s·V_a + (1 − s)·V_wm``.
    Normalised modes make the mean over contributing groups exactly 1; non-contributing groups get 0.

    Raises:
        FloatingPointError: a weight came out non-finite or not positive (never applied).
    """
    is_anchor = np.asarray(is_anchor, dtype=bool)
    contributes = np.asarray(contributes, dtype=bool)
    share = is_anchor.astype(float) if executed_share is None else np.asarray(executed_share, dtype=float)
    fusion.bound_binds = False
    if fusion.config.mode == "paper":
        w = np.where(is_anchor, paper_weight(fusion), 1.0)
        out = np.where(contributes, w, 0.0)
    else:
        ratio = variance_ratio(fusion)
        # 1/V_g with V_g = s·V_a + (1 - s)·V_wm, in units of V_a: s + (1 - s)·ratio.
        raw = np.where(contributes, 1.0 / (share + (1.0 - share) * ratio), 0.0)
        total = raw.sum()
        out = raw * (contributes.sum() / total) if total > 0 else raw
    used = out[contributes]
    if not (np.all(np.isfinite(used)) and np.all(used > 0)):
        raise FloatingPointError(
            f"fusion produced group weights {used.tolist()}: weights must be finite and > 0 "
            "(this is a bug; the estimates were "
            f"signal={fusion.signal_var}, error={fusion.error_var}, anchor error={fusion.anchor_error_var})"
        )
    return out


def _broadcast(fusion: Fusion, ctx: WeightContext) -> npt.NDArray[Any]:
    weights = group_weights(fusion, ctx.is_anchor, ctx.contributes, ctx.real_share)
    return np.where(ctx.live, weights[:, None], 0.0)


for _name in ("mse", "inverse_variance", "paper"):
    register_fusion(_name)(_broadcast)
