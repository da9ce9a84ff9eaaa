"""Inverse-variance fusion of the anchor and world-model gradient streams, measured on the advantages.

Each GRPO group contributes ``Σ_i A_i ∇log π(y_i)``. The error that reaches the gradient is the
error of the *advantages* ``A`` the update uses (standardised within the group, or centred when
``AdvantageConfig.standardize`` is off), so that is where the fusion measures it. Per rollout, in
advantage units (``docs/method.md`` §2 derives every line):

* ``q`` — the mean squared advantage of the truth (1 for standardised advantages); the policy
  gradient's own sampling noise scales with it, in every group;
* ``N`` — the anchor's error: real execution is noisy (a script's score varies with its seed, a
  flaky run fails, an episode's outcome is a Bernoulli draw), so real advantages err too. From the
  execution-noise variance ``σ²`` (declared by the source, measured from repeated executions, or
  assumed 0) the reliability of a real group is ``ρ² = 1 - Σσ²(1 - 1/m) / Σ(r - r̄)²`` and the real
  advantages' error is ``2q(1 - ρ)`` (standardised) or ``Σσ²(1 - 1/m)/M`` (centred);
* ``E`` — the calibrated world model's error against the *true* advantages, measured on anchor
  groups against the noisy real ones and corrected for that noise (Spearman's correction for
  attenuation): ``E = q_c + q - 2 k/ρ`` with ``q_c`` the world model's mean squared advantage and
  ``k`` its mean product with the real advantages. A per-group positive-affine distortion of the
  real scores has ``E = 0``;
* persistence: the world model's error on a solution is largely the same every time that solution
  is graded, so it adds up over the steps of the accumulated update while fresh noise averages out.

A world-model group's gradient has error variance ``V_wm`` against ``V_a = q + N`` for an anchor
group, and the minimum-variance combination with mean weight 1 weights each group by ``1/V`` (a
group with a share ``s`` of executed rollouts by ``1/(s·V_a + (1 - s)·V_wm)``).

Modes:

* ``mse`` (default): ``V_a = q + N`` and, with ``persistence="horizon"`` (default),
  ``V_wm = q + F + H·(E - F)``: ``F`` the per-call noise the world model reports (fresh), the rest
  of ``E`` persistent and counted ``H = bias_horizon`` times. ``H`` is a constant justified by
  measurement (``wmrl bench synthetic``, ``docs/benchmarks/method.md``): the measured design effect below
  gives lower anchor weights than the benchmark's dynamics reward. With ``persistence="measured"``
  and solution keys, ``V_wm = q·κ_s + κ_e(1 + ψ)·E``: rollouts of one solution share a score
  gradient, so ``κ`` turn per-rollout sums into keyed (gradient-geometry) ones, and ``ψ`` is the
  error shared with other groups and steps (same-key products across anchor groups within the
  memory ``β^|Δt|``, scaled by ``(1 - f)/f``, net of execution noise; see :meth:`Fusion._keyed`).
  ``ψ`` is reported (``wmrl/persistence``) whenever keys are given, ``None`` otherwise.
* ``inverse_variance``: ``D = 1`` (every error treated as fresh noise).
* ``paper``: the official heuristic. Anchor weight ``clip(1 + c·s², 1, w_max)`` with ``s²`` an EMA
  (half-life 64 groups) of per-group disagreement and ``c`` frozen after ``warmup_groups`` so that
  the weight equals ``target_weight`` then; world-model groups keep weight 1 and nothing is
  normalised, so the mean weight (the implied learning-rate multiplier) exceeds 1.
* ``none``: every weight is 1.

``scale="reward"`` keeps the previous estimator for comparison: errors in reward units
(``S = E[r̃²]``, ``E = E[(c̃ - r̃)²]``, the anchor's own noise ignored) and ``w_a/w_wm = 1 + E/S``
(``inverse_variance``) or ``1 + (N + H·(E - N))/S`` (``mse``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from wmrl.core.advantages import AdvantageConfig
from wmrl.core.config import require
from wmrl.core.fusion_rules import WeightContext, fusion_rule
from wmrl.core.gain import GainInputs, GainStats

__all__ = ["Fusion", "FusionConfig", "FusionInputs", "group_disagreement"]

FusionMode = Literal["gain", "inverse_variance", "mse", "paper", "none"]
FusionScale = Literal["advantage", "reward"]
Persistence = Literal["horizon", "measured"]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class FusionConfig:
    """Settings of the stream weights.

    Attributes:
        mode: ``mse`` | ``inverse_variance`` | ``paper`` | ``none`` (see the module docstring).
        scale: ``advantage`` (errors measured on the advantages the update uses, execution noise
            separated) or ``reward`` (the previous estimator, kept for comparison).
        persistence: ``horizon`` (the persistent part of ``E`` counted ``bias_horizon`` times) or
            ``measured`` (the keyed design effect, when solution keys are given; else ``horizon``).
        half_life_steps: decay of the variance, noise and persistence estimates, in training steps
            (how fast the estimates forget).
        min_groups: anchor groups measured before weights depart from 1.
        max_ratio: cap on ``V_wm / V_a`` and on its inverse (guards against a tiny estimate).
        bias_horizon: ``H``, the multiplier of persistent error in ``mse`` (``persistence="horizon"``,
            or ``measured`` without keys, and ``scale="reward"``), in steps: 16 chosen by the
            benchmark (see ``docs/benchmarks/method.md``); the previous default was 8.
        persistence_half_life_steps: the memory of the accumulated update over which the errors
            of repeated solutions add up (the kernel ``β^|Δt|`` of ``ψ``), in steps.
        min_keyed_rollouts: anchor pairs carrying a solution key needed before ``ψ`` is measured.
        min_repeats: repeated executions needed before the measured noise variance is used.
        min_pairs: executed rollouts with a world-model score needed before ``gain`` measures the
            world model's residual (``core/gain.py``).
        min_duplicates: degrees of freedom of repeated world-model calls on one solution within a
            step needed before ``gain`` uses the measured per-call noise (before: taken as 0, all error
            persistent).
        paper_target_weight, paper_max_weight, paper_half_life_groups, paper_warmup_groups: the
            official heuristic's constants (2.0, 4.0, 64, 32).
    """

    mode: FusionMode = "mse"
    scale: FusionScale = "advantage"
    persistence: Persistence = "horizon"
    half_life_steps: float = 20.0
    min_groups: int = 8
    max_ratio: float = 16.0
    bias_horizon: float = 16.0
    persistence_half_life_steps: float = 8.0
    min_keyed_rollouts: int = 32
    min_repeats: int = 8
    paper_target_weight: float = 2.0
    paper_max_weight: float = 4.0
    paper_half_life_groups: float = 64.0
    paper_warmup_groups: int = 32
    min_pairs: int = 16
    min_duplicates: int = 8

    def __post_init__(self) -> None:
        require(
            self.mode in ("gain", "inverse_variance", "mse", "paper", "none"),
            f"fusion.mode must be gain, inverse_variance, mse, paper or none; got {self.mode!r}",
        )
        require(
            self.scale in ("advantage", "reward"),
            f"fusion.scale must be advantage or reward; got {self.scale!r}",
        )
        require(
            self.persistence in ("horizon", "measured"),
            f"fusion.persistence must be horizon or measured; got {self.persistence!r}",
        )
        for name, low in (
            ("half_life_steps", 0.0),
            ("persistence_half_life_steps", 0.0),
            ("paper_half_life_groups", 0.0),
        ):
            value = getattr(self, name)
            require(_finite(value) and value > low, f"fusion.{name} must be finite and > 0; got {value}")
        for name in ("max_ratio", "bias_horizon", "paper_target_weight", "paper_max_weight"):
            value = getattr(self, name)
            require(_finite(value) and value >= 1, f"fusion.{name} must be finite and >= 1; got {value}")
        for name in (
            "min_groups",
            "min_keyed_rollouts",
            "min_repeats",
            "paper_warmup_groups",
            "min_pairs",
            "min_duplicates",
        ):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                f"fusion.{name} must be an integer >= 1; got {value!r}",
            )
        require(
            self.paper_max_weight >= self.paper_target_weight,
            "fusion: need 1 <= paper_target_weight <= paper_max_weight",
        )


def group_disagreement(calibrated: npt.NDArray[Any], real: npt.NDArray[Any]) -> float | None:
    """The official per-group disagreement ``mean(((c - c̄) - (r - r̄))²) / var(r)``.

    ``None`` when the real scores carry no spread: ``var(r)`` at most ``1e-12`` of their mean square
    (relative, so that rescaling the rewards never changes which groups count).
    """
    real = np.asarray(real, dtype=float)
    calibrated = np.asarray(calibrated, dtype=float)
    var = float(np.var(real))
    if var <= 1e-12 * float(np.mean(real**2)):
        return None
    return float(np.mean(((calibrated - calibrated.mean()) - (real - real.mean())) ** 2)) / var


@dataclass
class FusionInputs:
    """One step's anchor pairs, flat, for :meth:`Fusion.observe`.

    Attributes:
        real: ``(M,)`` real scores of anchor rollouts graded by both sources (the mean of their
            executions when a rollout was executed twice), reward units.
        calibrated: ``(M,)`` the matching calibrated world-model scores (map fitted before them).
        group: ``(M,)`` int, the anchor group of each pair (any labels; groups with < 2 pairs are skipped).
        exec_var: ``(M,)`` execution-noise variance of each ``real`` value (reward units²); 0 = deterministic.
        wm_var: ``(M,)`` per-call noise variance of each calibrated score, or ``None`` when unreported.
        keys: ``(M,)`` solution key of each pair (equal keys = the same solution; ``None`` = unknown),
            or ``None`` for no keys at all.
        n_groups: groups in this step (anchor and world-model), for the anchor fraction ``f``.
    """

    real: npt.NDArray[Any]
    calibrated: npt.NDArray[Any]
    group: npt.NDArray[Any]
    exec_var: npt.NDArray[Any] | None = None
    wm_var: npt.NDArray[Any] | None = None
    keys: Sequence[str | None] | npt.NDArray[Any] | None = None
    n_groups: int = 0


class _RunningSums:
    """The memory-decayed sums fusion estimates from (floats; :data:`_SUMS` lists them in this order)."""

    # advantage scale
    rollouts: float  # Σ 1 over measured pairs (M)
    spread: float  # Σ 1 over pairs in groups whose real scores are not all equal (M_s)
    q_real: float  # Σ A_r²
    q_wm: float  # Σ A_c² over those groups (over all groups when centring)
    flat_noisy: float  # Σ 1 over pairs in groups whose real scores are all equal but noisy (σ² > 0)
    q_wm_flat: float  # Σ A_c² over groups whose real scores are all equal and exact (σ² = 0)
    cross: float  # Σ A_c·A_r
    real_ss: float  # Σ (r - r̄)², reward units
    exec_ss: float  # Σ σ²(1 - 1/m), reward units
    wm_noise_ss: float  # Σ F_i, advantage units (groups that report a variance)
    wm_noise_n: float  # Σ 1 over those rollouts
    resid_ss: float  # Σ z², z = (c - c̄) - (r - r̄), reward units
    # Solution keys (advantage units): per group and key, R_k = Σ A_r, D_k = Σ (A_c - A_r) over the
    # key's rollouts; the gradient sees these sums, not the single rollouts.
    key_rollouts: float  # Σ 1 over pairs in keyed groups
    key_signal: float  # Σ_k R_k²
    key_signal_diag: float  # Σ A_r² over the same rollouts
    key_error: float  # Σ_k D_k²
    key_error_diag: float  # Σ d²
    key_noise: float  # Σ_k Var(noise part of R_k)
    key_noise_diag: float  # Σ Var(noise part of A_r)
    key_across: float  # Σ D_k·S_k over earlier anchor groups (S_k: memory-decayed Σ D of key k)
    stream_groups: float  # Σ groups per step
    stream_anchors: float  # Σ anchor groups per step
    # reward scale (the previous estimator)
    signal_ss: float
    error_ss: float
    noise_ss: float
    dof: float
    noise_dof: float


_SUMS: tuple[str, ...] = tuple(_RunningSums.__annotations__)


class Fusion(_RunningSums):
    """Estimates the streams' error variances from anchor groups and turns them into group weights."""

    def __init__(self, config: FusionConfig | None = None, advantages: AdvantageConfig | None = None) -> None:
        self.config = config or FusionConfig()
        self.advantages = advantages or AdvantageConfig()
        for name in _SUMS:
            setattr(self, name, 0.0)
        self.steps = 0
        # the step's (V_a, V_wm, D), computed once
        self._cache: tuple[tuple[float, float, float] | None] | None = None
        self.groups_measured = 0
        # Per solution key: memory-decayed Σ z over anchor rollouts, and the step it was decayed to.
        self.key_resid: dict[str, list[float]] = {}
        self.paper_ema: float | None = None
        self.paper_groups = 0
        self.paper_gain: float | None = None
        self.gain = GainStats(self.config.half_life_steps, self.config.min_pairs, self.config.min_duplicates)
        self.bound_binds = False  # whether a bound decided this step's weights

    # -- estimation --------------------------------------------------------------------------
    def observe(self, inputs: FusionInputs) -> dict[str, float | None]:
        """Update the estimates with one step's anchor pairs (known entries only); call once per step."""
        cfg = self.config
        decay = 0.5 ** (1.0 / cfg.half_life_steps)
        for name in _SUMS:
            setattr(self, name, getattr(self, name) * decay)
        self.steps += 1
        real = np.asarray(inputs.real, dtype=float)
        cal = np.asarray(inputs.calibrated, dtype=float)
        labels = np.asarray(inputs.group)
        m_total = real.size
        if cal.shape != (m_total,) or labels.shape != (m_total,):
            raise ValueError(
                f"fusion inputs: real, calibrated and group must have one entry per pair; got "
                f"{real.shape}, {cal.shape}, {labels.shape}"
            )
        exec_var = np.zeros(m_total) if inputs.exec_var is None else np.asarray(inputs.exec_var, dtype=float)
        if exec_var.shape != (m_total,) or not np.all(np.isfinite(exec_var)) or (exec_var < 0).any():
            raise ValueError("fusion inputs: exec_var must hold one finite variance >= 0 per pair")
        self._cache = None
        measured = 0
        anchors = 0
        if m_total:
            wm_var = None if inputs.wm_var is None else np.asarray(inputs.wm_var, dtype=float)
            keys = None if inputs.keys is None else np.asarray(inputs.keys, dtype=object)
            if np.any(labels[1:] < labels[:-1]):  # group the pairs (the corrector passes them grouped)
                order = np.argsort(labels, kind="stable")
                labels, real, cal, exec_var = labels[order], real[order], cal[order], exec_var[order]
                wm_var = None if wm_var is None else wm_var[order]
                keys = None if keys is None else keys[order]
            new = np.concatenate(([True], labels[1:] != labels[:-1]))
            sizes = np.diff(np.append(np.flatnonzero(new), m_total))
            anchors = sizes.size
            keep = np.repeat(sizes >= 2, sizes)  # a single pair has no within-group difference
            if keep.any():
                if not keep.all():
                    real, cal, exec_var = real[keep], cal[keep], exec_var[keep]
                    wm_var = None if wm_var is None else wm_var[keep]
                    keys = None if keys is None else keys[keep]
                    sizes = sizes[sizes >= 2]
                measured = self._measure(real, cal, sizes, exec_var, wm_var, keys)
        self.groups_measured += measured
        self.stream_groups += float(inputs.n_groups)
        self.stream_anchors += float(anchors)
        return {"fusion_groups_new": float(measured)}

    def _measure(
        self,
        real: npt.NDArray[Any],
        cal: npt.NDArray[Any],
        sizes: npt.NDArray[Any],
        exec_var: npt.NDArray[Any],
        wm_var: npt.NDArray[Any] | None,
        keys: npt.NDArray[Any] | None,
    ) -> int:
        """Add one step's grouped pairs (``sizes``: pairs per group, each >= 2, in order) to the sums.

        A step has few anchor groups, so the cost is numpy's per-call overhead: the group statistics
        come from a handful of stacked ``reduceat`` calls and the sums from one Gram matrix.
        """
        n = sizes.size
        index = np.repeat(np.arange(n), sizes)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        m = sizes.astype(float)
        m_i = m[index]
        both = np.stack([real, cal])
        centred = both - (np.add.reduceat(both, starts, axis=1) / m)[:, index]
        var = np.add.reduceat(centred**2, starts, axis=1) / m  # (2, n) population variances
        flat = np.maximum.reduceat(both, starts, axis=1) == np.minimum.reduceat(both, starts, axis=1)
        r_c, c_c = centred
        var_r, var_c = var
        flat_r = flat[0][index]
        if self.advantages.standardize:
            with np.errstate(divide="ignore", invalid="ignore"):
                scaled = centred / (np.sqrt(var) + self.advantages.eps)[:, index]
            # All equal: zero advantages, as group_advantages gives.
            a_r, a_c = np.where(flat[:, index], 0.0, scaled)
            # A group whose real scores are all equal has zero real advantages. If its scores are
            # exact (σ² = 0 for all), the truth is flat too and the world model's spread is all error;
            # if they are noisy (a 0/1 outcome that came out all 0), the truth's direction is unknown.
            noisy = (np.add.reduceat(exec_var, starts) > 0)[index]
            a_c_spread = np.where(flat_r, 0.0, a_c)
            a_c_exact_flat = np.where(flat_r & ~noisy, a_c, 0.0)
            self.flat_noisy += float(np.count_nonzero(flat_r & noisy))
        else:
            a_r, a_c = r_c, c_c
            a_c_spread, a_c_exact_flat = a_c, np.zeros_like(a_c)
        z = c_c - r_c
        vectors = np.stack([a_r, a_c_spread, a_c_exact_flat, r_c, z, a_c])
        gram = vectors @ vectors.T
        self.rollouts += float(real.size)
        self.spread += float(real.size - np.count_nonzero(flat_r))
        self.q_real += float(gram[0, 0])
        self.q_wm += float(gram[1, 1])
        self.q_wm_flat += float(gram[2, 2])
        self.cross += float(gram[5, 0])
        self.real_ss += float(gram[3, 3])
        self.exec_ss += float(exec_var @ (1.0 - 1.0 / m_i))  # centring m values removes 1/m of their noise
        self.resid_ss += float(gram[4, 4])
        # The previous, reward-scale estimator.
        self.signal_ss += float(gram[3, 3])
        self.error_ss += float(gram[4, 4])
        self.dof += float((m - 1).sum())
        if wm_var is not None:
            reported = np.isfinite(wm_var)
            if (wm_var[reported] < 0).any():
                raise ValueError("fusion inputs: wm_var must be >= 0 (score units²)")
            # Groups report as a whole or not at all (one unreported score leaves the group out).
            whole = np.bincount(index, weights=(~reported).astype(float), minlength=n)[index] == 0
            noise = np.where(whole, wm_var, 0.0) * (1.0 - 1.0 / m_i)
            self.noise_ss += float(noise.sum())
            self.noise_dof += float(np.sum(np.where(whole, 1.0 - 1.0 / m_i, 0.0)))
            if self.advantages.standardize:
                scale = (np.sqrt(var_c) + self.advantages.eps)[index] ** 2
                with np.errstate(divide="ignore", invalid="ignore"):
                    noise = np.where(scale > 0, noise / scale, 0.0)
            self.wm_noise_ss += float(noise.sum())
            self.wm_noise_n += float(whole.sum())
        if keys is not None:
            # On the update's scale, like E: the residual of the advantages, and the execution noise
            # carried onto it (linearised: divided by the group's squared standardiser).
            d = a_c - a_r
            # Only the part of the residual orthogonal to the real advantages can add up across
            # groups as a wrong direction; the parallel part is a change of scale (fresh noise in
            # the world model shrinks standardised advantages along the truth, the same sign for the
            # same solution every time, which would otherwise read as persistence).
            along = np.bincount(index, weights=d * a_r, minlength=n)
            norm = np.bincount(index, weights=a_r * a_r, minlength=n)
            d = d - np.where(norm > 0, along / np.where(norm > 0, norm, 1.0), 0.0)[index] * a_r
            carried = exec_var
            if self.advantages.standardize:
                scale = (np.sqrt(var_r) + self.advantages.eps)[index] ** 2
                carried = np.where(flat_r, 0.0, exec_var / np.where(flat_r, 1.0, scale))
            self._last_real_advantages = a_r
            self._cross_keys(d, index, m_i, carried, keys)
        self._paper_update(np.add.reduceat(z**2, starts), var_r * m, np.add.reduceat(real**2, starts))
        return n

    def _cross_keys(
        self,
        z: npt.NDArray[Any],
        index: npt.NDArray[Any],
        m_i: npt.NDArray[Any],
        exec_var: npt.NDArray[Any],
        keys: npt.NDArray[Any],
    ) -> None:
        """Accumulate the keyed (gradient-geometry) sums of one step's anchor groups.

        Rollouts with the same solution key share one score gradient, so a group's gradient is
        ``Σ_k (Σ_{i∈k} A_i) ∇log π(k)``: its signal is ``Σ_k R_k²`` and its error ``Σ_k D_k²`` (the
        errors of duplicates add, or cancel). Across groups, ``D_k·S_k`` with ``S_k`` the memory-decayed
        sum of the key's ``D`` in earlier anchor groups measures the error shared between groups and
        steps. The execution noise's part of ``R_k`` has variance
        ``Σ_{i∈k} ν_i (1 - 2 n_k/m) + n_k² Σ_l ν_l / m²`` (centring), ``ν`` the noise on the advantages'
        scale; independent executions share none across groups. A rollout without a key is its own key.

        Args:
            z: ``(M,)`` advantage residuals ``A_c - A_r``; index: ``(M,)`` group; m_i: ``(M,)`` group
            size of each pair; exec_var: ``(M,)`` ``ν``; keys: ``(M,)`` object, ``None`` = no key.
        """
        beta = 0.5 ** (1.0 / self.config.persistence_half_life_steps)
        now = self.steps
        a_r = self._last_real_advantages
        group_noise = np.bincount(index, weights=exec_var)
        for g in range(int(index.max()) + 1):
            sel = np.flatnonzero(index == g)
            m = float(m_i[sel[0]])
            sums: dict[object, list[float]] = {}
            for i in sel.tolist():
                key = keys[i]
                acc = sums.setdefault(("", i) if key is None else str(key), [0.0, 0.0, 0.0, 0.0])
                acc[0] += float(a_r[i])
                acc[1] += float(z[i])
                acc[2] += float(exec_var[i])
                acc[3] += 1.0
            self.key_rollouts += float(sel.size)
            self.key_signal_diag += float(np.sum(a_r[sel] ** 2))
            self.key_error_diag += float(np.sum(z[sel] ** 2))
            self.key_noise_diag += float(np.sum(exec_var[sel])) * (1.0 - 1.0 / m)
            for key, (r_k, d_k, noise, count) in sums.items():
                self.key_signal += r_k * r_k
                self.key_error += d_k * d_k
                self.key_noise += (
                    noise * (1.0 - 2.0 * count / m) + count * count * float(group_noise[g]) / m**2
                )
                if isinstance(key, str):
                    entry = self.key_resid.get(key)
                    if entry is not None:
                        self.key_across += d_k * entry[0] * beta ** (now - entry[1])
            # Added after the group, so a group is never paired with itself across.
            for key, (_, d_k, _, _) in sums.items():
                if not isinstance(key, str):
                    continue
                entry = self.key_resid.get(key)
                if entry is None:
                    self.key_resid[key] = [d_k, now]
                else:
                    entry[0] = entry[0] * beta ** (now - entry[1]) + d_k
                    entry[1] = now
        if now % 64 == 0:
            # Bounded memory for ever-new keys: forget those whose weight has decayed away.
            stale = [k for k, v in self.key_resid.items() if beta ** (now - v[1]) < 1e-6]
            for key in stale:
                del self.key_resid[key]

    def _paper_update(
        self, ss_error: npt.NDArray[Any], ss_signal: npt.NDArray[Any], ss_raw: npt.NDArray[Any]
    ) -> None:
        """The official per-group disagreement EMA, in arrival order; groups with no real spread skipped.

        Args: per group ``Σ z²``, ``Σ (r - r̄)²`` and ``Σ r²``, shape ``(n,)``.
        """
        cfg = self.config
        alpha = 1.0 - 0.5 ** (1.0 / cfg.paper_half_life_groups)
        # Relative rule, as in group_disagreement: var(r) <= 1e-12 · mean(r²) counts as no spread.
        for ss_e, ss_r, ss_mean in zip(ss_error.tolist(), ss_signal.tolist(), ss_raw.tolist(), strict=True):
            if ss_r <= 1e-12 * ss_mean:
                continue
            d = float(ss_e / ss_r)
            self.paper_ema = d if self.paper_ema is None else (1 - alpha) * self.paper_ema + alpha * d
            self.paper_groups += 1
            if (
                self.paper_gain is None
                and self.paper_groups >= cfg.paper_warmup_groups
                and self.paper_ema > 0
            ):
                # Frozen once, as in the official code: the weight is exactly the target at warm-up.
                self.paper_gain = (cfg.paper_target_weight - 1.0) / self.paper_ema

    # -- estimates (advantage scale, per rollout) ---------------------------------------------
    @property
    def reliability(self) -> float | None:
        """``ρ²``: the share of the real scores' within-group variance that is signal, not execution noise."""
        if self.real_ss <= 0:
            return None
        return float(min(max(1.0 - self.exec_ss / self.real_ss, 0.0), 1.0))

    @property
    def _spread_scale(self) -> float | None:
        """Mean squared standardised advantage in groups whose real scores have a spread (1 up to eps)."""
        return self.q_real / self.spread if self.spread > 0 else None

    @property
    def signal_var(self) -> float | None:
        """``q``: mean squared true advantage per rollout (reward² for ``scale="reward"``: ``S``).

        Standardised, a group with a spread has mean square 1 (up to eps) and a flat one 0; an exact
        flat group carries neither signal nor sampling noise, a noisy flat one (a 0/1 outcome that came
        out all 0) is taken to hide the usual spread.
        """
        if self.config.scale == "reward":
            return self.signal_ss / self.dof if self.dof > 0 else None
        if self.rollouts <= 0:
            return None
        if self.advantages.standardize:
            q_s = self._spread_scale
            return None if q_s is None else (self.q_real + self.flat_noisy * q_s) / self.rollouts
        return max(self.q_real / self.rollouts - self.exec_ss / self.rollouts, 0.0)

    @property
    def anchor_error_var(self) -> float | None:
        """``N``: mean squared error of the real advantages against the true ones, per rollout."""
        if self.config.scale == "reward":
            return 0.0
        q, rel = self._spread_scale if self.advantages.standardize else self.signal_var, self.reliability
        if q is None or rel is None:
            return None
        if self.advantages.standardize:
            # Groups with a spread: two unit-scale vectors with correlation ρ are 2(1 - ρ) apart.
            # Noisy groups whose real scores came out all equal have zero advantages against a
            # truth with a spread: they cost q. Exact flat groups cost nothing.
            return (self.spread * 2.0 * q * (1.0 - math.sqrt(rel)) + self.flat_noisy * q) / self.rollouts
        return self.exec_ss / self.rollouts

    @property
    def error_var(self) -> float | None:
        """``E``: mean squared error of the calibrated world model's advantages against the true ones.

        Disattenuated: ``k/λ`` estimates the product with the true advantages (``λ = ρ`` when
        standardised, 1 when centred), bounded by Cauchy-Schwarz.
        """
        if self.config.scale == "reward":
            return self.error_ss / self.dof if self.dof > 0 else None
        q, rel = self._spread_scale if self.advantages.standardize else self.signal_var, self.reliability
        if q is None or rel is None:
            return None
        if not self.advantages.standardize:
            # Linear: <c̃, r̃> = <c̃, μ̃> + <c̃, η̃>, and the last has mean 0.
            return max(self.q_wm / self.rollouts + q - 2.0 * self.cross / self.rollouts, 0.0)
        exact_flat = self.rollouts - self.spread - self.flat_noisy
        error_spread = 0.0
        if self.spread > 0:
            q_c = self.q_wm / self.spread
            k = self.cross / self.spread
            lam = math.sqrt(rel)
            bound = math.sqrt(q_c * q)
            # With λ = 0 the real advantages are pure noise: no relation can be shown, assume none.
            k_true = min(max(k / lam, -bound), bound) if lam > 0 else 0.0
            error_spread = max(q_c + q - 2.0 * k_true, 0.0)
        # Exact flat groups: the world model's spread is all error. Noisy flat groups show nothing
        # and are taken to err as the groups with a spread do.
        measured = self.spread + exact_flat
        if measured <= 0:
            return None
        return (self.spread * error_spread + self.q_wm_flat) / measured

    @property
    def noise_var(self) -> float | None:
        """``F``: per-call noise the world model reports, per rollout (``None`` when it reports none)."""
        if self.config.scale == "reward":
            return self.noise_ss / self.noise_dof if self.noise_dof > 0 else None
        return self.wm_noise_ss / self.wm_noise_n if self.wm_noise_n > 0 else None

    @property
    def anchor_share(self) -> float | None:
        """``f``: the decayed share of groups that were anchors."""
        return self.stream_anchors / self.stream_groups if self.stream_groups > 0 else None

    @property
    def persistence(self) -> float | None:
        """``ψ``: the world model's error shared with other groups and steps, per unit of a group's own.

        ``None`` without solution keys (persistence unmeasured).
        """
        from wmrl.core.fusion_compare import keyed

        measured = keyed(self) if self.config.scale == "advantage" else None
        return None if measured is None else measured[3]

    # -- the comparison estimators' numbers (wmrl.core.fusion_compare), reported every step --------
    @property
    def design_effect(self) -> float | None:
        """The multiplier ``mse`` applies to ``E`` (``None`` before warm-up and in other modes)."""
        from wmrl.core.fusion_compare import design_effect

        return design_effect(self)

    @property
    def ratio(self) -> float:
        """``V_wm / V_a`` of ``mse`` / ``inverse_variance`` (1 in other modes and before warm-up)."""
        from wmrl.core.fusion_compare import variance_ratio

        return variance_ratio(self)

    def paper_weight(self) -> float:
        """The ``paper`` heuristic's anchor weight (1 before warm-up)."""
        from wmrl.core.fusion_compare import paper_weight

        return paper_weight(self)

    @property
    def reward_disagreement(self) -> float | None:
        """``E/S`` in reward units (the previous estimator's, noise not separated): drives the adaptive budget."""
        if self.dof <= 0 or self.signal_ss <= 0:
            return None
        return self.error_ss / self.signal_ss

    @property
    def disagreement(self) -> float | None:
        """``E / q``: the calibrated world model's error relative to the signal."""
        s, e = self.signal_var, self.error_var
        if s is None or e is None or s <= 0:
            return None
        return e / s

    # -- the gain estimator (mode "gain", core/gain.py) -----------------------------------------
    def observe_gain(self, inputs: GainInputs) -> None:
        """Add one step's residuals and world-model spreads to the random-effects sums."""
        self.gain.observe(inputs)
        self._cache = None

    @property
    def anchor_correlation(self) -> float | None:
        """``ρ`` read from whole anchor groups: the within-group correlation of the calibrated world
        model's advantages with the true ones (disattenuated for execution noise); ``None`` before
        ``min_groups`` anchor groups with a spread."""
        if self.groups_measured < self.config.min_groups or self.spread <= 0:
            return None
        rel = self.reliability
        q = self._spread_scale if self.advantages.standardize else self.signal_var
        q_c = self.q_wm / self.spread
        if rel is None or q is None or rel <= 0 or q <= 0 or q_c <= 0:
            return None
        return float(min(max(self.cross / self.spread / math.sqrt(rel) / math.sqrt(q_c * q), -1.0), 1.0))

    def wm_gain_sq(
        self, calls: npt.NDArray[Any] | float = 1.0
    ) -> tuple[npt.NDArray[Any] | float | None, int]:
        """``(ρ², route)`` of world-model scores that are means of ``calls`` calls.

        Route 2: from whole anchor groups (:attr:`anchor_correlation`, affine-invariant); 1: from the
        random-effects model of executed rollouts' residuals (:class:`~wmrl.core.gain.GainStats`,
        needs a fitted calibration map); 0: no evidence yet (``None``).
        """
        rho = self.anchor_correlation
        if rho is not None:
            self.bound_binds = rho < 0  # a negative correlation is given no weight, not a negative one
            return max(rho, 0.0) ** 2, 2
        sq = self.gain.gain_sq(calls)
        if sq is not None:
            self.bound_binds = self.gain.clipped
            return sq, 1
        return None, 0

    @property
    def wm_gain(self) -> float | None:
        """``ρ`` of a single world-model call (``None`` before evidence)."""
        sq, _ = self.wm_gain_sq(1.0)
        return None if sq is None else math.sqrt(float(sq))

    @property
    def gain_route(self) -> int:
        return self.wm_gain_sq(1.0)[1]

    # -- weights -----------------------------------------------------------------------------
    # -- weights -----------------------------------------------------------------------------
    def rollout_weights(self, ctx: WeightContext) -> npt.NDArray[Any]:
        """``(n_groups, G)`` weights on the advantages, by the rule ``fusion.mode`` names
        (:mod:`wmrl.core.fusion_rules`); 0 where a rollout carries no gradient."""
        return fusion_rule(self.config.mode)(self, ctx)

    def weights(
        self,
        is_anchor: npt.NDArray[Any],
        contributes: npt.NDArray[Any],
        executed_share: npt.NDArray[Any] | None = None,
    ) -> npt.NDArray[Any]:
        """Per-group weights ``(n_groups,)`` of the group rules (``mse``, ``inverse_variance``, ``paper``,
        ``none``; see :func:`wmrl.core.fusion_compare.group_weights`). ``gain`` weights single
        rollouts: use :meth:`rollout_weights`."""
        if self.config.mode == "gain":
            raise ValueError("fusion.mode=gain weights single rollouts: use Fusion.rollout_weights")
        from wmrl.core.fusion_compare import group_weights

        return group_weights(self, is_anchor, contributes, executed_share)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {name: getattr(self, name) for name in _SUMS}
        state.update(
            steps=self.steps,
            groups_measured=self.groups_measured,
            key_resid={k: list(v) for k, v in self.key_resid.items()},
            paper_ema=self.paper_ema,
            paper_groups=self.paper_groups,
            paper_gain=self.paper_gain,
            gain=self.gain.state_dict(),
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        sums = {name: float(state[name]) for name in _SUMS}
        if any(not math.isfinite(v) for v in sums.values()):
            raise ValueError("fusion state holds non-finite sums")
        nonnegative = [n for n in _SUMS if n not in ("cross", "key_signal", "key_noise", "key_across")]
        if any(sums[n] < 0 for n in nonnegative):
            raise ValueError("fusion state holds negative sums of squares or counts")
        key_resid = {str(k): [float(v[0]), int(v[1])] for k, v in state["key_resid"].items()}
        if any(not math.isfinite(v[0]) for v in key_resid.values()):
            raise ValueError("fusion state holds non-finite key statistics")
        for name, value in sums.items():
            setattr(self, name, value)
        self._cache = None
        self.steps = int(state["steps"])
        self.groups_measured = int(state["groups_measured"])
        self.key_resid = key_resid
        self.paper_ema = None if state["paper_ema"] is None else float(state["paper_ema"])
        self.paper_groups = int(state["paper_groups"])
        self.paper_gain = None if state["paper_gain"] is None else float(state["paper_gain"])
        self.gain.load_state_dict(state["gain"])
