"""The world model's measured gain: how much of its within-group signal is the truth (``docs/method.md`` §2.5).

A GRPO group's gradient points along its standardised advantages. If the rewards ``y`` of a group
correlate with the true expected rewards ``μ`` by ``ρ_g`` (within the group), the group's expected
gradient is ``ρ_g`` times the true one while its sampling variance is the same as any other group's
(standardised advantages have unit scale). The signal-to-noise-optimal weights of a mean-1
combination of groups are then ``w_g ∝ ρ_g`` (gain over variance): a world model that tracks the
truth gets nearly an anchor's weight, one that is pure noise gets nearly none.

The world model's ``ρ`` is measured, never assumed, as a random-effects model of its calibrated score
``c`` of a rollout of solution ``k``::

    c = μ_k + b_k + ξ,       b_k ~ (0, σ_b²) persistent per solution,  ξ ~ (0, σ_ξ²) fresh per call.

* ``σ_ξ²`` — per-call noise, from repeated world-model calls on the same solution within a step
  (duplicates in a batch cost nothing extra to compare): the pooled within-key variance;
* ``σ_u² = σ_b² + σ_ξ²`` — the residual ``r − c`` of executed rollouts, scored with the map fitted
  *before* their pairs arrived (prequential), centred within each group (an offset is invisible to
  GRPO) and net of the execution noise; ``σ_b² = σ_u² − σ_ξ²``, ``ICC = σ_b² / σ_u²``;
* ``β`` — the within-group slope of ``r`` on ``c`` over the same pairs (1 for a calibrated score;
  a map that fitted noise has ``β < 1``; selecting pairs by ``c`` does not bias a slope on ``c``);
* ``V_c`` — the within-group variance of calibrated scores over every world-model-graded group.

Write ``c = m + ν`` with ``m = E[r | c]``-part ``β·c`` and ``ν`` what the map fitted to noise: the
within-group variance of the truth is ``β V_c + σ_u² − (1 − β) V_c`` and its covariance with ``c``
is ``β V_c``, so

    ρ² = β² V_c / (σ_u² − (1 − 2β) V_c),

which is ``V_c / (V_c + σ_u²)`` for a calibrated score and 0 for one with no relation to the truth
(``β ≤ 0`` gives no gain, never a negative one). A solution scored ``n`` times in one step is scored
by the mean of its calls, whose fresh noise shrinks to ``σ_ξ²/n``: ``V_c`` and ``σ_u²`` each lose
``σ_ξ²(1 − 1/n)``.

The persistent part ``σ_b²`` is what the gradient cannot average away: a solution executed once
is graded by the execution memory from then on (its ``b_k`` is gone), so the weight sees only the
solutions still unknown. Where whole anchor groups carry both scores, ``ρ`` is read directly from
their standardised advantages instead (the fusion's within-group, noise-disattenuated correlation),
which is invariant to any per-group positive affine distortion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["GainInputs", "GainStats", "within_sums"]


class _RunningSums:
    """The exponentially decayed sums (floats; :data:`_SUMS` lists them in this order)."""

    w_dof: float  # Σ (m_g − 1) over groups with >= 2 pairs
    w_cc: float  # Σ (c − c̄_g)²
    w_cr: float  # Σ (c − c̄_g)(r − r̄_g)
    w_zz: float  # Σ (z − z̄_g)², z = r − c
    w_exec: float  # Σ σ²(1 − 1/m_g)
    p_n: float  # pooled over every pair (the fallback before groups hold two pairs)
    p_c: float
    p_r: float
    p_cc: float
    p_cr: float
    p_zz: float
    p_z: float
    p_exec: float
    spread_ss: float
    spread_dof: float
    dup_ss: float
    dup_dof: float


_SUMS: tuple[str, ...] = tuple(_RunningSums.__annotations__)


@dataclass
class GainInputs:
    """One step's evidence, flat.

    Attributes:
        real / calibrated: ``(M,)`` real scores of executed rollouts with a world-model score, and
            their calibrated scores (the map fitted before them).
        group: ``(M,)`` the group of each pair.
        exec_var: ``(M,)`` execution-noise variance of each real score (reward units²).
        spread_ss / spread_dof: ``Σ_g Σ_i (c_i − c̄_g)²`` and ``Σ_g (m_g − 1)`` over the step's groups
            with at least two world-model scores.
        dup_ss / dup_dof: the same within solution keys scored more than once in the step.
    """

    real: npt.NDArray[Any]
    calibrated: npt.NDArray[Any]
    group: npt.NDArray[Any]
    exec_var: npt.NDArray[Any]
    spread_ss: float
    spread_dof: float
    dup_ss: float
    dup_dof: float


def within_sums(values: npt.NDArray[Any], labels: npt.NDArray[Any]) -> tuple[float, float]:
    """``(Σ (v − mean of its label)², Σ (count − 1))`` over labels with at least two values."""
    if values.size < 2:
        return 0.0, 0.0
    uniq, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    means = np.bincount(inverse, weights=values, minlength=uniq.size) / counts
    multi = counts[inverse] >= 2
    ss = float(np.sum((values[multi] - means[inverse][multi]) ** 2))
    return ss, float(np.sum(counts[counts >= 2] - 1))


class GainStats(_RunningSums):
    """Exponentially decayed sums of the random-effects model, and the estimates they give."""

    def __init__(self, half_life_steps: float, min_pairs: int, min_duplicates: int) -> None:
        self.half_life_steps = float(half_life_steps)
        self.min_pairs = int(min_pairs)
        self.min_duplicates = int(min_duplicates)
        for name in _SUMS:
            setattr(self, name, 0.0)
        self.clipped = False

    def observe(self, inputs: GainInputs) -> None:
        decay = 0.5 ** (1.0 / self.half_life_steps)
        for name in _SUMS:
            setattr(self, name, getattr(self, name) * decay)
        r = np.asarray(inputs.real, dtype=float)
        c = np.asarray(inputs.calibrated, dtype=float)
        var = np.asarray(inputs.exec_var, dtype=float)
        z = r - c
        if r.size:
            self.p_n += float(r.size)
            self.p_c += float(c.sum())
            self.p_r += float(r.sum())
            self.p_cc += float(c @ c)
            self.p_cr += float(c @ r)
            self.p_zz += float(z @ z)
            self.p_z += float(z.sum())
            self.p_exec += float(var.sum())
            _, inverse, counts = np.unique(np.asarray(inputs.group), return_inverse=True, return_counts=True)
            multi = counts[inverse] >= 2
            if multi.any():
                centred = []
                for v in (c, r, z):
                    means = np.bincount(inverse, weights=v) / counts
                    centred.append((v - means[inverse])[multi])
                cc, rc, zc = centred
                self.w_dof += float(np.sum(counts[counts >= 2] - 1))
                self.w_cc += float(cc @ cc)
                self.w_cr += float(cc @ rc)
                self.w_zz += float(zc @ zc)
                self.w_exec += float(np.sum((var * (1.0 - 1.0 / counts[inverse]))[multi]))
        self.spread_ss += float(inputs.spread_ss)
        self.spread_dof += float(inputs.spread_dof)
        self.dup_ss += float(inputs.dup_ss)
        self.dup_dof += float(inputs.dup_dof)

    # -- the random-effects estimates (calibrated reward units²) ----------------------------------
    @property
    def within(self) -> bool:
        """Whether the within-group sums hold enough pairs (else the pooled ones are used)."""
        return self.w_dof >= self.min_pairs / 2

    @property
    def residual_var(self) -> float | None:
        """``σ_u²``: the calibrated score's error per call, centred within groups, net of execution noise."""
        if self.within:
            return max((self.w_zz - self.w_exec) / self.w_dof, 0.0)
        if self.p_n < self.min_pairs:
            return None
        mean = self.p_z / self.p_n
        return max(self.p_zz / self.p_n - mean**2 - self.p_exec / self.p_n, 0.0)

    @property
    def slope(self) -> float | None:
        """``β``: the slope of the real score on the calibrated one (within groups, else pooled)."""
        if self.within:
            return self.w_cr / self.w_cc if self.w_cc > 0 else None
        if self.p_n < self.min_pairs:
            return None
        var = self.p_cc / self.p_n - (self.p_c / self.p_n) ** 2
        cov = self.p_cr / self.p_n - (self.p_c / self.p_n) * (self.p_r / self.p_n)
        return cov / var if var > 0 else None

    @property
    def spread_var(self) -> float | None:
        """``V_c``: within-group variance of the calibrated world-model scores."""
        return self.spread_ss / self.spread_dof if self.spread_dof > 0 else None

    @property
    def per_call_var(self) -> float | None:
        """``σ_ξ²``: fresh per-call noise, from solutions scored more than once in a step (``None``: too few)."""
        if self.dup_dof < self.min_duplicates:
            return None
        return self.dup_ss / self.dup_dof

    def _fresh(self) -> float:
        """``σ_ξ²`` as used: unmeasured counts as 0 (all error persistent, the safe side); never above
        ``σ_u²`` or ``V_c`` (sets :attr:`clipped` when that binds)."""
        fresh = self.per_call_var or 0.0
        u, v = self.residual_var or 0.0, self.spread_var or 0.0
        self.clipped = fresh > min(u, v)
        return min(fresh, u, v)

    @property
    def persistent_var(self) -> float | None:
        """``σ_b² = σ_u² − σ_ξ²``."""
        u = self.residual_var
        return None if u is None else u - self._fresh()

    @property
    def icc(self) -> float | None:
        """Share of the world model's error that persists per solution (1 when it is deterministic)."""
        u = self.residual_var
        return None if u is None or u <= 0 else (u - self._fresh()) / u

    def gain_sq(self, calls: float | npt.NDArray[Any] = 1.0) -> float | npt.NDArray[Any] | None:
        """``ρ_n²`` for a score that is the mean of ``calls`` world-model calls (``None`` without evidence)."""
        u, v, beta = self.residual_var, self.spread_var, self.slope
        if u is None or v is None or beta is None:
            return None
        fresh = self._fresh()
        shrink = fresh * (1.0 - 1.0 / np.maximum(np.asarray(calls, dtype=float), 1.0))
        v_n, u_n = v - shrink, u - shrink
        b = max(beta, 0.0)
        den = u_n - (1.0 - 2.0 * b) * v_n
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(den > 0, b * b * v_n / np.where(den > 0, den, 1.0), 1.0 if b > 0 else 0.0)
        out = np.clip(out, 0.0, 1.0)
        return float(out) if np.ndim(out) == 0 else out

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _SUMS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = {name: float(state[name]) for name in _SUMS}
        if any(not math.isfinite(v) for v in values.values()):
            raise ValueError("gain state holds non-finite sums")
        for name, value in values.items():
            setattr(self, name, value)
