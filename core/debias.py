"""Online debiasing: a monotone map from world-model score to expected real score.

Anchor groups are graded by both sources, which yields pairs ``(x, y)`` = (world-model score,
real score). The debiaser fits ``f(x) ≈ E[y | x]`` with scikit-learn's isotonic regression on a
recency-weighted window of those pairs and pushes every world-model score through ``f`` before
advantages are formed. Why monotone and not affine: GRPO standardises rewards within each group,
so an affine map is a no-op on advantages; a monotone piecewise map changes the *spacing* within a
group (which rollout is how much better), which is what the world model gets wrong.

Timeline within a training step (the order matters for honest diagnostics):

1. :meth:`OnlineDebiaser.observe` receives the step's new anchor pairs and scores them with the map
   fitted *before* they arrived (prequential: the map never saw them) — these are the reported
   calibration error and within-group bias reduction;
2. :meth:`OnlineDebiaser.refit` refits once per step on the window, so the map never changes halfway
   through a group;
3. :meth:`OnlineDebiaser.calibrate` maps world-model scores for the step's advantages.

Until ``min_pairs`` pairs have arrived the map is the identity. Optional per-key (per-task) maps are
shrunk toward the pooled map: ``f_k = (n_k·g_k + κ·f) / (n_k + κ)`` with ``n_k`` the key's
effective (recency-weighted) pair count and ``κ = shrinkage``; a convex combination of monotone
maps is monotone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import isotonic_regression

from wmrl.core.advantages import centre_within_groups
from wmrl.core.config import require

__all__ = ["DebiasConfig", "IsotonicMap", "OnlineDebiaser", "within_group_bias_reduction"]


@dataclass(frozen=True)
class DebiasConfig:
    """Settings of the online isotonic calibration.

    Attributes:
        enabled: ``False`` keeps the identity map forever (the ``fusion_only`` ablation).
        min_pairs: pairs needed before the first fit; identity until then.
        half_life_steps: a pair's weight halves every this many steps (``None``: equal weights).
        max_pairs: window size; the oldest pairs are dropped beyond it.
        per_key: fit one map per key (task) shrunk toward the pooled map.
        shrinkage: ``κ``, the pooled map's weight in a per-key map, in pairs.
        min_key_pairs: pairs a key needs before it gets its own map.
    """

    enabled: bool = True
    min_pairs: int = 32
    half_life_steps: float | None = 50.0
    max_pairs: int = 5000
    per_key: bool = False
    shrinkage: float = 32.0
    min_key_pairs: int = 8

    def __post_init__(self) -> None:
        require(self.min_pairs >= 2, f"debias.min_pairs must be >= 2; got {self.min_pairs}")
        require(
            self.half_life_steps is None or self.half_life_steps > 0,
            f"debias.half_life_steps must be > 0 or None; got {self.half_life_steps}",
        )
        require(
            self.max_pairs >= self.min_pairs,
            f"debias.max_pairs ({self.max_pairs}) must be >= min_pairs ({self.min_pairs})",
        )
        require(
            0 <= self.shrinkage < float("inf"),
            f"debias.shrinkage must be finite and >= 0; got {self.shrinkage}",
        )
        require(self.min_key_pairs >= 2, f"debias.min_key_pairs must be >= 2; got {self.min_key_pairs}")


class IsotonicMap:
    """A fitted non-decreasing piecewise-linear map (scikit-learn's isotonic fit, evaluated by interpolation).

    Outside the fitted range it is flat (clipped), as scikit-learn's ``out_of_bounds="clip"``.
    """

    def __init__(self, x_knots: npt.NDArray[Any], y_knots: npt.NDArray[Any]) -> None:
        self.x_knots = np.asarray(x_knots, dtype=float)
        self.y_knots = np.asarray(y_knots, dtype=float)

    @classmethod
    def fit(
        cls,
        x: npt.NDArray[Any],
        y: npt.NDArray[Any],
        weight: npt.NDArray[Any] | None = None,
        presorted: bool = False,
    ) -> IsotonicMap:
        """Weighted isotonic fit of ``y`` on ``x``: scikit-learn's ``IsotonicRegression``, minus its overhead.

        As ``IsotonicRegression`` does, zero-weight samples are dropped first, then ``x`` values
        that sklearn treats as equal are pooled into their weighted mean ``y`` (see
        :func:`pool_ties`); the ordered problem is solved by ``scipy.optimize.isotonic_regression``,
        the pool-adjacent-violators solver ``IsotonicRegression`` itself delegates to. Calling it on
        our already-validated, already-sorted window skips the estimator's per-call validation and
        sort, which dominated the cost of refitting every step. The result equals
        ``IsotonicRegression(out_of_bounds="clip")`` on the same weighted data (checked in the tests).

        Raises:
            ValueError: no sample has a positive weight.
        """
        weight = np.ones_like(x) if weight is None else np.asarray(weight, dtype=float)
        if not presorted:
            order = np.argsort(x, kind="mergesort")
            x, y, weight = x[order], y[order], weight[order]
        positive = weight > 0
        if not positive.all():
            x, y, weight = x[positive], y[positive], weight[positive]
        if not x.size:
            raise ValueError("an isotonic fit needs at least one pair with a positive weight")
        starts = pool_ties(x)
        knots = x[starts]
        w_sum = np.add.reduceat(weight, starts)
        y_mean = np.add.reduceat(weight * y, starts) / w_sum
        fitted = isotonic_regression(y_mean, weights=w_sum, increasing=True).x
        return cls(knots, fitted)

    def __call__(self, x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.interp(x, self.x_knots, self.y_knots)


# scikit-learn's tie tolerance: ``np.finfo(float64).resolution``, absolute, as in its ``_make_unique``.
TIE_RESOLUTION = float(np.finfo(np.float64).resolution)


def pool_ties(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Start index of each run of sorted ``x`` that scikit-learn's isotonic fit pools into one knot.

    scikit-learn (``sklearn._isotonic._make_unique``) scans the sorted values and starts a new knot
    at ``x[j]`` only when ``x[j] - x[start] >= resolution`` (1e-15), ``x[start]`` being the first value
    of the current knot; so ``0.3`` and ``0.1 + 0.2`` are one knot. A gap of at least the resolution
    between neighbours always starts a knot, so the scan is only needed inside the rare runs of
    near-ties that span more than the resolution.

    Args:
        x: ``(m,)`` sorted (non-decreasing) values, ``m >= 1``.

    Returns:
        ``(k,)`` int indices into ``x``, increasing, starting with 0.
    """
    if x.size == 0:
        return np.zeros(0, dtype=np.intp)
    step = x[1:] - x[:-1]
    gap = np.flatnonzero(step >= TIE_RESOLUTION) + 1
    starts = np.concatenate(([0], gap))
    if gap.size == x.size - 1 or not np.any((step > 0) & (step < TIE_RESOLUTION)):
        return starts  # no near-ties at all: runs of exactly equal values only (the common case)
    ends = np.concatenate((gap, [x.size]))
    wide = np.flatnonzero(x[ends - 1] - x[starts] >= TIE_RESOLUTION)
    if not wide.size:
        return starts
    extra = []
    for r in wide.tolist():  # a chain of near-ties: follow scikit-learn's scan exactly
        current = x[starts[r]]
        for j in range(int(starts[r]) + 1, int(ends[r])):
            if x[j] - current >= TIE_RESOLUTION:
                extra.append(j)
                current = x[j]
    return np.sort(np.concatenate((starts, np.array(extra, dtype=starts.dtype))))


def within_group_bias_reduction(
    raw: npt.NDArray[Any], calibrated: npt.NDArray[Any], real: npt.NDArray[Any], group_ids: npt.NDArray[Any]
) -> tuple[float | None, float, float]:
    """How much calibration reduces the world model's error *as GRPO sees it*: within groups.

    For each group with at least two pairs, the centred residual ``(x - x̄) - (y - ȳ)`` is what
    survives GRPO's per-group centring. Returns ``(1 - SS_calibrated / SS_raw, SS_raw, SS_calibrated)``
    summed over groups; the ratio is ``None`` when ``SS_raw`` is zero (nothing to reduce).
    """
    _, index = np.unique(group_ids, return_inverse=True)
    n = int(index.max()) + 1 if index.size else 0
    y_c, counts = centre_within_groups(real, index, n)
    paired = counts[index] >= 2  # a single pair has no within-group difference
    raw_res = centre_within_groups(raw, index, n)[0] - y_c
    cal_res = centre_within_groups(calibrated, index, n)[0] - y_c
    ss_raw = float(np.sum(raw_res[paired] ** 2))
    ss_cal = float(np.sum(cal_res[paired] ** 2))
    # "Nothing to reduce" is judged against the real scores' own within-group spread, so the rule
    # does not depend on the reward's units.
    ss_real = float(np.sum(y_c[paired] ** 2))
    reduction = 1.0 - ss_cal / ss_raw if ss_raw > 1e-12 * ss_real and ss_raw > 0 else None
    return reduction, ss_raw, ss_cal


def _has_two_knots(x_sorted: npt.NDArray[Any], weights: npt.NDArray[Any]) -> bool:
    """Whether the positively weighted scores of a sorted window form at least two isotonic knots."""
    x = x_sorted[weights > 0]
    return x.size >= 2 and float(x[-1] - x[0]) >= TIE_RESOLUTION


class OnlineDebiaser:
    """Isotonic calibration of world-model scores against real scores, refit every step."""

    def __init__(self, config: DebiasConfig | None = None) -> None:
        self.config = config or DebiasConfig()
        self._x = np.empty(0)
        self._y = np.empty(0)
        self._step = np.empty(0, dtype=np.int64)
        self._key = np.empty(0, dtype=np.int64)  # per-pair key as a code into self._key_names
        self._key_names: list[str] = []
        self._key_codes: dict[str, int] = {}
        self._seq = np.empty(0, dtype=np.int64)  # arrival order, to drop the oldest pairs
        self._next_seq = 0
        self.pooled: IsotonicMap | None = None
        self.per_key: dict[str, tuple[IsotonicMap, float]] = {}
        self.fits = 0
        self.last_diagnostics: dict[str, float | None] = {}

    # -- data --------------------------------------------------------------------------------
    @property
    def n_pairs(self) -> int:
        return int(self._x.size)

    @property
    def calibrated(self) -> bool:
        """Whether a fitted map (not the identity) is in use."""
        return self.pooled is not None

    def observe(
        self,
        step: int,
        wm: npt.NDArray[Any],
        real: npt.NDArray[Any],
        group_ids: npt.NDArray[Any],
        keys: Sequence[str] | None = None,
    ) -> dict[str, float | None]:
        """Add a step's anchor pairs; return prequential diagnostics computed *before* adding them.

        Args:
            step: the training step the pairs come from (for recency weights).
            wm, real: shape ``(m,)`` paired scores, both known (callers drop unknowns).
            group_ids: shape ``(m,)``, the group each pair belongs to (within-group diagnostics).
            keys: per-pair key (task) for per-key maps; ``None`` = one key.
        """
        wm = np.asarray(wm, dtype=float)
        real = np.asarray(real, dtype=float)
        group_ids = np.asarray(group_ids)
        m = wm.size
        if real.shape != (m,) or group_ids.shape != (m,):
            raise ValueError(
                f"wm, real and group_ids must have the same shape (m,); got {wm.shape}, {real.shape}, {group_ids.shape}"
            )
        if not (np.all(np.isfinite(wm)) and np.all(np.isfinite(real))):
            raise ValueError("debiaser pairs must be finite: drop unknown (None/NaN) scores before observing")
        key_names = [""] * m if keys is None else [str(k) for k in keys]
        if len(key_names) != m:
            raise ValueError(f"got {len(key_names)} keys for {m} pairs")
        key_arr = np.fromiter((self._code(k) for k in key_names), dtype=np.int64, count=m)
        diagnostics: dict[str, float | None] = {"pairs_new": float(m)}
        if m:
            calibrated = self.calibrate(wm, key_names)
            reduction, ss_raw, ss_cal = within_group_bias_reduction(wm, calibrated, real, group_ids)
            diagnostics.update(
                prequential_mse_raw=float(np.mean((wm - real) ** 2)),
                prequential_mse_calibrated=float(np.mean((calibrated - real) ** 2)),
                bias_reduction=reduction,
                within_group_ss_raw=ss_raw,
                within_group_ss_calibrated=ss_cal,
            )
            self._insert_sorted(wm, real, int(step), key_arr)
        self.last_diagnostics = diagnostics
        return diagnostics

    def _insert_sorted(
        self, wm: npt.NDArray[Any], real: npt.NDArray[Any], step: int, key_arr: npt.NDArray[Any]
    ) -> None:
        """Insert new pairs into the window kept sorted by world-model score; drop the oldest beyond the cap.

        Keeping the window sorted lets each refit skip the sort. The few new pairs are sorted and
        placed after any equal scores already there (``side="right"``), which is exactly the order a
        stable sort of (window + new pairs) gives, at the cost of one copy of the window.
        """
        m = wm.size
        order = np.argsort(wm, kind="stable")
        at = np.searchsorted(self._x, wm[order], side="right")
        self._x = np.insert(self._x, at, wm[order])
        self._y = np.insert(self._y, at, real[order])
        self._step = np.insert(self._step, at, np.full(m, step, dtype=np.int64))
        self._seq = np.insert(self._seq, at, self._next_seq + order)
        self._key = np.insert(self._key, at, key_arr[order])
        self._next_seq += m
        if self._x.size > self.config.max_pairs:
            # The window always holds the newest pairs, so the oldest are those with the smallest
            # arrival numbers: everything before the last ``max_pairs`` arrivals goes.
            keep = self._seq >= self._next_seq - self.config.max_pairs
            self._x, self._y, self._step = self._x[keep], self._y[keep], self._step[keep]
            self._seq, self._key = self._seq[keep], self._key[keep]

    def _code(self, key: str) -> int:
        code = self._key_codes.get(key)
        if code is None:
            code = self._key_codes[key] = len(self._key_names)
            self._key_names.append(key)
        return code

    def _weights(self, now: int) -> npt.NDArray[Any]:
        if self.config.half_life_steps is None:
            return np.ones(self._x.size)
        return 0.5 ** ((now - self._step) / self.config.half_life_steps)

    def refit(self, step: int) -> bool:
        """Refit the maps on the window (once per step). Returns whether a fitted map is in use.

        A map is fitted only on evidence that can shape it: at least ``min_pairs`` pairs, of which
        those with a positive recency weight (old pairs' weights can underflow to exactly 0) hold at
        least two scores that are distinct knots; one knot would make the map a constant. Otherwise
        the previous map stays (the identity before the first fit).
        """
        if not self.config.enabled or self.n_pairs < self.config.min_pairs:
            return self.calibrated
        weights = self._weights(step)
        if not _has_two_knots(self._x, weights):
            return self.calibrated
        self.pooled = IsotonicMap.fit(self._x, self._y, weights, presorted=True)
        self.per_key = {}
        if self.config.per_key:
            for code in np.unique(self._key):
                sel = self._key == code
                if sel.sum() >= self.config.min_key_pairs and _has_two_knots(self._x[sel], weights[sel]):
                    self.per_key[self._key_names[code]] = (
                        IsotonicMap.fit(self._x[sel], self._y[sel], weights[sel], presorted=True),
                        float(weights[sel].sum()),
                    )
        self.fits += 1
        return True

    def calibrate(
        self, wm: npt.NDArray[Any], keys: Sequence[str] | npt.NDArray[Any] | None = None
    ) -> npt.NDArray[Any]:
        """Map world-model scores through the current map (NaN stays NaN). Shape preserved."""
        wm = np.asarray(wm, dtype=float)
        if self.pooled is None:
            return wm.copy()
        out = self.pooled(wm)
        if self.per_key and keys is not None:
            key_arr = np.asarray(keys, dtype=object)
            if key_arr.shape != wm.shape:
                raise ValueError(f"keys must have the scores' shape {wm.shape}; got {key_arr.shape}")
            kappa = self.config.shrinkage
            for key, (fmap, n_k) in self.per_key.items():
                sel = key_arr == key
                if sel.any():
                    out[sel] = (n_k * fmap(wm[sel]) + kappa * out[sel]) / (n_k + kappa)
        out[np.isnan(wm)] = np.nan
        return out

    def uncertainty(self, wm: npt.NDArray[Any], bins: int = 10) -> npt.NDArray[Any]:
        """Per-score uncertainty of the calibration: residual variance / pairs in the score's bin.

        This is the squared standard error of the calibrated value where the score falls, so it
        is large where the calibration has few pairs or a large residual (the active scheduler's
        preference). Shape preserved; NaN scores get 0.
        """
        wm = np.asarray(wm, dtype=float)
        if self.n_pairs == 0:
            return np.where(np.isnan(wm), 0.0, 1.0)
        lo, hi = float(np.min(self._x)), float(np.max(self._x))
        # The top score lands in bin `bins` and is clipped into the last one: no absolute epsilon.
        edges = np.linspace(lo, hi, bins + 1)
        pair_bin = np.clip(np.searchsorted(edges, self._x, side="right") - 1, 0, bins - 1)
        fitted = self.calibrate(self._x)
        resid2 = (self._y - fitted) ** 2
        counts = np.bincount(pair_bin, minlength=bins).astype(float)
        sums = np.bincount(pair_bin, weights=resid2, minlength=bins)
        # A floor relative to the real scores' spread keeps a perfect fit from scoring 0 everywhere.
        scale = float(np.var(self._y)) or float(np.mean(self._y**2)) or 1.0
        pooled_var = float(resid2.mean()) + 1e-6 * scale
        # A bin with no pairs gets the pooled residual variance over half a pair: maximally uncertain.
        var = np.where(counts > 0, sums / np.maximum(counts, 1.0), pooled_var)
        se2 = var / np.where(counts > 0, counts, 0.5)
        score_bin = np.clip(np.searchsorted(edges, np.nan_to_num(wm, nan=lo), side="right") - 1, 0, bins - 1)
        out = se2[score_bin]
        return np.where(np.isnan(wm), 0.0, out)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "x": self._x.copy(),
            "y": self._y.copy(),
            "step": self._step.copy(),
            "key": [self._key_names[c] for c in self._key],
            "seq": self._seq.copy(),
            "next_seq": self._next_seq,
            "pooled": None
            if self.pooled is None
            else (self.pooled.x_knots.copy(), self.pooled.y_knots.copy()),
            "per_key": {k: (m.x_knots.copy(), m.y_knots.copy(), n) for k, (m, n) in self.per_key.items()},
            "fits": self.fits,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, validated as the fusion state is: a broken state raises ``ValueError``.

        Checked: the window's arrays have one entry per pair; pairs are finite; the window is sorted
        by world-model score (refits rely on it); arrival numbers are unique and below ``next_seq``;
        the window is no larger than ``max_pairs``; fitted maps have matching, finite, sorted knots.
        """
        x = np.asarray(state["x"], dtype=float).copy()
        y = np.asarray(state["y"], dtype=float).copy()
        step = np.asarray(state["step"], dtype=np.int64).copy()
        keys = [str(k) for k in state["key"]]
        seq = np.asarray(state["seq"], dtype=np.int64).copy()
        next_seq = int(state["next_seq"])
        m = x.size
        if not (x.shape == y.shape == step.shape == seq.shape == (m,) and len(keys) == m):
            raise ValueError(
                f"debiaser state: x, y, step, key and seq must be 1-D with one entry per pair; got lengths "
                f"{x.size}, {y.size}, {step.size}, {len(keys)}, {seq.size}"
            )
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise ValueError("debiaser state holds non-finite pairs (unknown scores never enter the window)")
        if m > 1 and np.any(np.diff(x) < 0):
            raise ValueError("debiaser state: the window must be sorted by world-model score")
        if m > self.config.max_pairs:
            raise ValueError(f"debiaser state holds {m} pairs, more than max_pairs={self.config.max_pairs}")
        if m and (np.unique(seq).size != m or seq.min() < 0 or seq.max() >= next_seq):
            raise ValueError("debiaser state: arrival numbers must be unique and in [0, next_seq)")
        pooled = state["pooled"]
        pooled_map = None if pooled is None else _checked_map("pooled", pooled[0], pooled[1])
        per_key = {}
        for k, v in state["per_key"].items():
            n_k = float(v[2])
            if not (np.isfinite(n_k) and n_k > 0):
                raise ValueError(
                    f"debiaser state: per-key map {k!r} has weight {n_k}; it must be finite and > 0"
                )
            per_key[str(k)] = (_checked_map(f"per-key map {k!r}", v[0], v[1]), n_k)
        fits = int(state["fits"])
        if fits < 0:
            raise ValueError(f"debiaser state: fits must be >= 0; got {fits}")
        self._x, self._y, self._step, self._seq, self._next_seq = x, y, step, seq, next_seq
        self._key_names, self._key_codes = [], {}
        self._key = np.array([self._code(k) for k in keys], dtype=np.int64)
        self.pooled = pooled_map
        self.per_key = per_key
        self.fits = fits


def _checked_map(name: str, x_knots: Any, y_knots: Any) -> IsotonicMap:
    xk = np.asarray(x_knots, dtype=float)
    yk = np.asarray(y_knots, dtype=float)
    if xk.ndim != 1 or xk.shape != yk.shape or xk.size == 0:
        raise ValueError(
            f"debiaser state: the {name} needs matching 1-D knots; got {xk.shape} and {yk.shape}"
        )
    if not (np.all(np.isfinite(xk)) and np.all(np.isfinite(yk))):
        raise ValueError(f"debiaser state: the {name} has non-finite knots")
    if np.any(np.diff(xk) <= 0) or np.any(np.diff(yk) < 0):
        raise ValueError(f"debiaser state: the {name} must have increasing x knots and non-decreasing values")
    return IsotonicMap(xk, yk)
