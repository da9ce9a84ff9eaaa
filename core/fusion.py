"""Inverse-variance fusion of the anchor and world-model gradient streams.

Each GRPO group contributes ``Σ_i A_i ∇log π(y_i)`` to the gradient. An anchor group's advantages
come from real execution; a world-model group's from calibrated world-model scores, which err.
Per rollout, with advantages measured in reward units:

* ``S`` — the variance of the real, within-group-centred rewards (the signal every group carries,
  and the sampling noise of the policy gradient scales with it);
* ``E`` — the mean squared error of the calibrated world model's centred scores against the real
  centred scores, ``mean(((c - c̄) - (r - r̄))²)``, measured on anchor groups, which carry both.

A world-model group's gradient then has error variance ``S + E`` against ``S`` for an anchor
group, and the minimum-variance convex combination weights each group by the inverse:
``w_anchor / w_wm = 1 + E/S``, normalised so that the batch-mean group weight is 1 (the fusion
must not secretly change the learning rate). ``docs/method.md`` derives this.

Modes:

* ``inverse_variance``: the rule above, ``E`` and ``S`` re-estimated every step from
  exponentially-decayed sums over anchor groups, measured prequentially (the map that scored a
  pair had not seen it).
* ``mse`` (default; chosen by ``wmrl bench synthetic``, see ``docs/benchmarks.md``): errors that persist across steps (the world model's per-solution bias) add up
  coherently over the ``bias_horizon`` steps a solution keeps being sampled, while fresh noise
  averages out; the persistent part of ``E`` is counted ``bias_horizon`` times:
  ``w_anchor / w_wm = 1 + (N + H·max(E - N, 0)) / S`` with ``N`` the world model's per-call noise
  variance (from the variances the source reports; 0 when it reports none, so all error counts
  as persistent).
* ``paper``: the official heuristic. Anchor weight ``clip(1 + c·s², 1, w_max)`` with ``s²`` an EMA
  (half-life 64 groups) of per-group disagreement and ``c`` frozen after ``warmup_groups`` so that
  the weight equals ``target_weight`` then; world-model groups keep weight 1 and nothing is
  normalised, so the mean weight (the implied learning-rate multiplier) exceeds 1.
* ``none``: every weight is 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from wmrl.core.advantages import centre_within_groups
from wmrl.core.config import require

__all__ = ["Fusion", "FusionConfig", "group_disagreement"]

FusionMode = Literal["inverse_variance", "mse", "paper", "none"]


@dataclass(frozen=True)
class FusionConfig:
    """Settings of the stream weights.

    Attributes:
        mode: ``inverse_variance`` | ``mse`` | ``paper`` | ``none`` (see the module docstring).
        half_life_steps: decay of the variance estimates, in training steps.
        min_groups: anchor groups measured before weights depart from 1.
        max_ratio: cap on ``w_anchor / w_wm`` (guards against a tiny ``S`` estimate).
        bias_horizon: ``H`` of the ``mse`` mode, in steps.
        paper_target_weight, paper_max_weight, paper_half_life_groups, paper_warmup_groups: the
            official heuristic's constants (2.0, 4.0, 64, 32).
    """

    mode: FusionMode = "mse"
    half_life_steps: float = 20.0
    min_groups: int = 8
    max_ratio: float = 16.0
    bias_horizon: float = 8.0
    paper_target_weight: float = 2.0
    paper_max_weight: float = 4.0
    paper_half_life_groups: float = 64.0
    paper_warmup_groups: int = 32

    def __post_init__(self) -> None:
        require(
            self.mode in ("inverse_variance", "mse", "paper", "none"),
            f"fusion.mode must be inverse_variance, mse, paper or none; got {self.mode!r}",
        )
        require(self.half_life_steps > 0, f"fusion.half_life_steps must be > 0; got {self.half_life_steps}")
        require(self.min_groups >= 1, f"fusion.min_groups must be >= 1; got {self.min_groups}")
        require(self.max_ratio >= 1, f"fusion.max_ratio must be >= 1; got {self.max_ratio}")
        require(self.bias_horizon >= 1, f"fusion.bias_horizon must be >= 1; got {self.bias_horizon}")
        require(
            self.paper_max_weight >= self.paper_target_weight >= 1,
            "fusion: need 1 <= paper_target_weight <= paper_max_weight",
        )
        require(
            self.paper_half_life_groups > 0 and self.paper_warmup_groups >= 1,
            "fusion: paper half-life and warm-up must be positive",
        )


def group_disagreement(calibrated: np.ndarray, real: np.ndarray) -> float | None:
    """The official per-group disagreement ``mean(((c - c̄) - (r - r̄))²) / var(r)``; ``None`` if ``var(r) ≈ 0``."""
    var = float(np.var(real))
    if var < 1e-9:
        return None
    return float(np.mean(((calibrated - calibrated.mean()) - (real - real.mean())) ** 2)) / var


class Fusion:
    """Estimates the streams' error variances from anchor groups and turns them into group weights."""

    def __init__(self, config: FusionConfig | None = None) -> None:
        self.config = config or FusionConfig()
        self.signal_ss = 0.0  # decayed Σ (r - r̄)² over anchor groups
        self.error_ss = 0.0  # decayed Σ ((c - c̄) - (r - r̄))²
        self.noise_ss = 0.0  # decayed Σ per-call noise variance of the calibrated world model
        self.dof = 0.0  # decayed Σ (m_g - 1)
        self.noise_dof = 0.0  # decayed Σ (m_g - 1) over groups whose noise variance was reported
        self.groups_measured = 0
        self.paper_ema: float | None = None
        self.paper_groups = 0
        self.paper_gain: float | None = None

    # -- estimation --------------------------------------------------------------------------
    def observe(
        self,
        real_groups: Sequence[np.ndarray],
        calibrated_groups: Sequence[np.ndarray],
        noise_var_groups: Sequence[np.ndarray | None] | None = None,
    ) -> dict[str, float | None]:
        """Update the estimates with one step's anchor groups (paired, known entries only).

        Args:
            real_groups: per anchor group, the real scores of rollouts graded by both sources, shape ``(m_g,)``.
            calibrated_groups: the matching calibrated world-model scores (prequential map), shape ``(m_g,)``.
            noise_var_groups: per group, the per-call noise variance of each calibrated score
                (score units²) or ``None`` when the source reports none.
        """
        cfg = self.config
        decay = 0.5 ** (1.0 / cfg.half_life_steps)
        self.signal_ss *= decay
        self.error_ss *= decay
        self.noise_ss *= decay
        self.dof *= decay
        self.noise_dof *= decay
        alpha = 1.0 - 0.5 ** (1.0 / cfg.paper_half_life_groups)
        usable = [
            g
            for g, (real, cal) in enumerate(zip(real_groups, calibrated_groups, strict=True))
            if np.size(real) >= 2 and np.shape(cal) == np.shape(real)
        ]
        measured = len(usable)
        if measured:
            sizes = np.array([np.size(real_groups[g]) for g in usable])
            index = np.repeat(np.arange(measured), sizes)
            real = np.concatenate([np.asarray(real_groups[g], dtype=float) for g in usable])
            cal = np.concatenate([np.asarray(calibrated_groups[g], dtype=float) for g in usable])
            r_c, _ = centre_within_groups(real, index, measured)
            e_c = centre_within_groups(cal, index, measured)[0] - r_c
            ss_signal = np.bincount(index, weights=r_c**2, minlength=measured)
            ss_error = np.bincount(index, weights=e_c**2, minlength=measured)
            self.signal_ss += float(ss_signal.sum())
            self.error_ss += float(ss_error.sum())
            self.dof += float((sizes - 1).sum())
            if noise_var_groups is not None:
                for g, m in zip(usable, sizes, strict=True):
                    noise = noise_var_groups[g]
                    if noise is not None:
                        # Centring m values removes 1/m of their independent noise.
                        self.noise_ss += float(np.sum(noise)) * (1.0 - 1.0 / m)
                        self.noise_dof += m - 1
            # The official per-group disagreement, ss_error / ss_signal (= mean sq. error / var(r)),
            # in arrival order for its EMA; groups with var(r) ~ 0 are skipped as the official code does.
            for ss_e, ss_r, m in zip(ss_error, ss_signal, sizes, strict=True):
                if ss_r / m < 1e-9:
                    continue
                d = float(ss_e / ss_r)
                self.paper_ema = d if self.paper_ema is None else (1 - alpha) * self.paper_ema + alpha * d
                self.paper_groups += 1
                if (
                    self.paper_gain is None
                    and self.paper_groups >= cfg.paper_warmup_groups
                    and self.paper_ema > 1e-12
                ):
                    # Frozen once, as in the official code: the weight is exactly the target at warm-up.
                    self.paper_gain = (cfg.paper_target_weight - 1.0) / self.paper_ema
        self.groups_measured += measured
        return {"fusion_groups_new": float(measured)}

    @property
    def signal_var(self) -> float | None:
        return self.signal_ss / self.dof if self.dof > 0 else None

    @property
    def error_var(self) -> float | None:
        return self.error_ss / self.dof if self.dof > 0 else None

    @property
    def noise_var(self) -> float | None:
        """Per-call noise variance reported by the world model (``None`` when it reports none)."""
        return self.noise_ss / self.noise_dof if self.noise_dof > 0 else None

    @property
    def disagreement(self) -> float | None:
        """``E / S``: the calibrated world model's error variance relative to the real signal."""
        s, e = self.signal_var, self.error_var
        if s is None or e is None or s < 1e-12:
            return None
        return e / s

    @property
    def ratio(self) -> float:
        """``w_anchor / w_wm`` for the normalised modes (1 until enough evidence)."""
        cfg = self.config
        if cfg.mode in ("none", "paper") or self.groups_measured < cfg.min_groups:
            return 1.0
        s, e = self.signal_var, self.error_var
        if s is None or e is None or s < 1e-12:
            return 1.0
        if cfg.mode == "inverse_variance":
            excess = e
        else:
            noise = min(self.noise_var or 0.0, e)
            excess = noise + cfg.bias_horizon * (e - noise)
        return float(min(1.0 + excess / s, cfg.max_ratio))

    def paper_weight(self) -> float:
        cfg = self.config
        if self.paper_gain is None or self.paper_ema is None:
            return 1.0
        return float(min(max(1.0 + self.paper_gain * self.paper_ema, 1.0), cfg.paper_max_weight))

    # -- weights -----------------------------------------------------------------------------
    def weights(self, is_anchor: np.ndarray, contributes: np.ndarray) -> np.ndarray:
        """Per-group loss weights, shape ``(n_groups,)``.

        Args:
            is_anchor: bool ``(n_groups,)``, the groups graded by real execution.
            contributes: bool ``(n_groups,)``, the groups that produce advantages (>= 2 graded).

        Normalised modes return weights whose mean over contributing groups is exactly 1;
        non-contributing groups get weight 0 (they carry no gradient anyway).
        """
        is_anchor = np.asarray(is_anchor, dtype=bool)
        contributes = np.asarray(contributes, dtype=bool)
        mode = self.config.mode
        if mode == "paper":
            w = np.where(is_anchor, self.paper_weight(), 1.0)
            return np.where(contributes, w, 0.0)
        raw = np.where(is_anchor, self.ratio, 1.0)
        raw = np.where(contributes, raw, 0.0)
        total = raw.sum()
        if total <= 0:
            return raw
        return raw * (contributes.sum() / total)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "signal_ss": self.signal_ss,
            "error_ss": self.error_ss,
            "noise_ss": self.noise_ss,
            "dof": self.dof,
            "noise_dof": self.noise_dof,
            "groups_measured": self.groups_measured,
            "paper_ema": self.paper_ema,
            "paper_groups": self.paper_groups,
            "paper_gain": self.paper_gain,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("signal_ss", "error_ss", "noise_ss", "dof", "noise_dof"):
            setattr(self, name, float(state[name]))
        self.groups_measured = int(state["groups_measured"])
        self.paper_ema = None if state["paper_ema"] is None else float(state["paper_ema"])
        self.paper_groups = int(state["paper_groups"])
        self.paper_gain = None if state["paper_gain"] is None else float(state["paper_gain"])
        if any(
            not math.isfinite(getattr(self, n))
            for n in ("signal_ss", "error_ss", "noise_ss", "dof", "noise_dof")
        ):
            raise ValueError("fusion state holds non-finite sums")
