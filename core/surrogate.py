"""A world model that learns from the run, and several world models fused at once (beyond the paper).

Two reward sources for the ``world_model`` role, each a plain :class:`~wmrl.core.sources.RewardSource`
(the two-source API of :class:`~wmrl.core.pipeline.RewardPipeline` does not change):

* :class:`SurrogateSource` — a nearest-neighbour regression of the real outcome on features the
  domain supplies (AutoResearch: a text embedding of the solution, or the world model's hidden state
  at its scoring position; a simulator: anything that puts variants of one solution close together),
  fitted online on every real outcome the run obtains (:meth:`SurrogateSource.learn`). It predicts a
  rollout as the mean outcome of its ``k`` nearest executed neighbours within ``radius``, and is
  unknown (``None``) where it has none: it spreads what execution learned to solutions that recur
  *in variants*, which the execution memory (exact keys) cannot.
* :class:`FusedWorldModel` — several world-model sources combined per rollout, each calibrated
  linearly to the real outcome and weighted by the inverse of its own measured error (the variance of
  its calibrated residual on executed rollouts, measured *before* each outcome is learned:
  prequential). A source that is unknown for a rollout is left out of that rollout's combination.

The pipeline feeds both: after each step it hands the world-model source the rollouts executed and
their real outcomes (``learn(items, values)``, an optional method any source may implement).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.sources import RewardSource, Role

__all__ = ["Floats", "FusedWorldModel", "NearestNeighbours", "SurrogateSource", "learn_from"]

#: ``(n, d)`` float64 features or ``(n,)`` float64 values.
Floats = npt.NDArray[np.float64]


class NearestNeighbours:
    """Online ``k``-nearest-neighbour regression in Euclidean feature space (bounded: oldest forgotten).

    Args:
        k: neighbours averaged.
        radius: neighbours farther than this do not count (``None``: any distance).
        max_points: points kept at most.
    """

    def __init__(self, k: int = 3, radius: float | None = None, max_points: int = 20_000) -> None:
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1; got {k!r}")
        if radius is not None and not radius > 0:
            raise ValueError(f"radius must be > 0 or None; got {radius!r}")
        self.k, self.radius, self.max_points = k, radius, int(max_points)
        self._x: Floats | None = None
        self._y: Floats = np.empty(0)

    def __len__(self) -> int:
        return int(self._y.size)

    def add(self, features: Floats, values: Floats) -> None:
        """Add points: ``features`` ``(n, d)``, ``values`` ``(n,)`` (non-finite values are skipped)."""
        x = np.atleast_2d(np.asarray(features, dtype=float))
        y = np.asarray(values, dtype=float).reshape(-1)
        keep = np.isfinite(y) & np.all(np.isfinite(x), axis=1)
        x, y = x[keep], y[keep]
        if not y.size:
            return
        if self._x is None:
            self._x = x
        else:
            if x.shape[1] != self._x.shape[1]:
                raise ValueError(
                    f"features have {x.shape[1]} dimensions; earlier ones had {self._x.shape[1]}"
                )
            self._x = np.concatenate([self._x, x])
        self._y = np.concatenate([self._y, y])
        if self._y.size > self.max_points:
            self._x, self._y = self._x[-self.max_points :], self._y[-self.max_points :]

    def predict(self, features: Floats) -> Floats:
        """``(n,)`` predictions, NaN where no neighbour lies within ``radius`` (or nothing was learned)."""
        x = np.atleast_2d(np.asarray(features, dtype=float))
        out = np.full(x.shape[0], np.nan)
        if self._x is None or not self._y.size:
            return out
        # all squared distances at once, (n, points): one matrix product instead of a loop over rows
        d2 = (x * x).sum(axis=1)[:, None] + (self._x * self._x).sum(axis=1)[None, :] - 2.0 * x @ self._x.T
        d2 = np.maximum(d2, 0.0)
        k = min(self.k, self._y.size)
        nearest = (
            np.argpartition(d2, k - 1, axis=1)[:, :k]
            if k < self._y.size
            else np.tile(np.arange(self._y.size), (x.shape[0], 1))
        )
        near_d2 = np.take_along_axis(d2, nearest, axis=1)
        within = np.ones_like(near_d2, dtype=bool) if self.radius is None else near_d2 <= self.radius**2
        counts = within.sum(axis=1)
        sums = np.where(within, self._y[nearest], 0.0).sum(axis=1)
        has = counts > 0
        out[has] = sums[has] / counts[has]
        return out


class SurrogateSource:
    """A world model fitted on the run's real outcomes over domain features (see the module docstring).

    Args:
        features: ``item -> (d,)`` array (the same ``d`` for every item).
        model: the regression (default :class:`NearestNeighbours` with ``k=3``).
        name: the source's name.
    """

    role = Role.WORLD_MODEL

    def __init__(
        self,
        features: Callable[[Any], Floats],
        model: NearestNeighbours | None = None,
        name: str = "surrogate",
    ) -> None:
        self.features = features
        # not `model or ...`: an empty regression has length 0 and is falsy
        self.model = model if model is not None else NearestNeighbours()
        self.name = name

    def _matrix(self, items: Sequence[Any]) -> Floats:
        return np.stack([np.asarray(self.features(item), dtype=float).reshape(-1) for item in items])

    def score(self, items: Sequence[Any]) -> list[float | None]:
        if not items:
            return []
        predictions = self.model.predict(self._matrix(items))
        return [None if math.isnan(v) else float(v) for v in predictions]

    def learn(self, items: Sequence[Any], values: Sequence[float | None]) -> None:
        """Add the real outcomes of ``items`` (``None`` = unknown, not learned)."""
        pairs = [
            (item, v) for item, v in zip(items, values, strict=True) if v is not None and math.isfinite(v)
        ]
        if pairs:
            self.model.add(self._matrix([p[0] for p in pairs]), np.array([p[1] for p in pairs]))


class _Residuals:
    """Decayed sums of one source's calibrated residuals: a linear map ``r ≈ a·x + b`` and its error."""

    def __init__(self, half_life: float) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.n = self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0

    def add(self, x: Floats, y: Floats) -> None:
        d = self.decay
        self.n, self.sx, self.sy = self.n * d, self.sx * d, self.sy * d
        self.sxx, self.sxy, self.syy = self.sxx * d, self.sxy * d, self.syy * d
        self.n += float(x.size)
        self.sx += float(x.sum())
        self.sy += float(y.sum())
        self.sxx += float(x @ x)
        self.sxy += float(x @ y)
        self.syy += float(y @ y)

    def line(self) -> tuple[float, float] | None:
        if self.n < 2:
            return None
        var = self.sxx / self.n - (self.sx / self.n) ** 2
        if var <= 1e-12:
            return None
        a = (self.sxy / self.n - (self.sx / self.n) * (self.sy / self.n)) / var
        return a, self.sy / self.n - a * self.sx / self.n

    def _error(self, line: tuple[float, float]) -> float:
        """The residual variance of ``y`` around ``line`` (floored at 1e-6)."""
        a, b = line
        # Σ (y − a x − b)² / n, from the sums
        n = self.n
        mean_sq = (
            self.syy - 2 * a * self.sxy - 2 * b * self.sy + a * a * self.sxx + 2 * a * b * self.sx + b * b * n
        ) / n
        return max(mean_sq, 1e-6)

    def fit(self, min_pairs: int) -> tuple[float, float, float] | None:
        """``(slope, intercept, weight = 1 / error)`` once ``min_pairs`` outcomes are in; ``None`` before."""
        line = self.line() if self.n >= min_pairs else None
        return None if line is None else (*line, 1.0 / self._error(line))


class FusedWorldModel:
    """Several world-model sources, calibrated and weighted each by its own measured error.

    Args:
        sources: the world models (any :class:`RewardSource`; those with ``learn`` learn too).
        min_pairs: executed rollouts a source needs scored before it is calibrated and weighted;
            until then the first source's raw scores are used.
        half_life: how fast the calibration and error estimates forget, in learned outcomes.
        name: the source's name.
    """

    role = Role.WORLD_MODEL

    def __init__(
        self,
        sources: Sequence[RewardSource],
        min_pairs: int = 16,
        half_life: float = 2_000.0,
        name: str = "fused_world_model",
    ) -> None:
        if not sources:
            raise ValueError("FusedWorldModel needs at least one source")
        self.sources = list(sources)
        self.min_pairs = int(min_pairs)
        self.name = name
        self._residuals = [_Residuals(half_life) for _ in self.sources]
        self._last: dict[int, list[float | None]] = {}  # id(item) -> each source's score, until learned

    def _all_scores(self, items: Sequence[Any]) -> Floats:
        columns = []
        for source in self.sources:
            values = source.score(items)
            columns.append([np.nan if v is None else float(v) for v in values])
        return np.array(columns, dtype=float).reshape(len(self.sources), len(items))

    def score(self, items: Sequence[Any]) -> list[float | None]:
        if not items:
            return []
        scores = self._all_scores(items)
        for i, item in enumerate(items):
            self._last[id(item)] = [None if np.isnan(v) else float(v) for v in scores[:, i]]
        # each measured source's calibrated scores, with its weight
        measured = [
            (fit[2], fit[0] * scores[s] + fit[1])
            for s, fit in enumerate(r.fit(self.min_pairs) for r in self._residuals)
            if fit is not None
        ]
        if not measured:  # nothing measured yet: the first source, as it is
            return [None if np.isnan(v) else float(v) for v in scores[0]]
        out: list[float | None] = []
        for i in range(len(items)):
            num = den = 0.0
            for w, c in measured:
                if not np.isnan(c[i]):
                    num += w * c[i]
                    den += w
            out.append(num / den if den > 0 else None)
        return out

    def weights(self) -> list[float | None]:
        """Each source's current share of the weight (``None``: not measured yet)."""
        raw = [None if fit is None else fit[2] for fit in (r.fit(self.min_pairs) for r in self._residuals)]
        total = sum(w for w in raw if w is not None)
        return [None if w is None else w / total for w in raw]

    def learn(self, items: Sequence[Any], values: Sequence[float | None]) -> None:
        """Measure every source on the outcomes (with the scores it gave *before* them), then let the
        sources that learn, learn."""
        for item, value in zip(items, values, strict=True):
            scores = self._last.pop(id(item), None)
            if scores is None or value is None or not math.isfinite(value):
                continue
            for s, score in enumerate(scores):
                if score is not None:
                    self._residuals[s].add(np.array([score]), np.array([float(value)]))
        for source in self.sources:
            learn_from(source, items, values)
        if len(self._last) > 100_000:  # scores of rollouts never executed: forget the oldest
            for key in list(self._last)[: len(self._last) - 50_000]:
                del self._last[key]


def learn_from(source: Any, items: Sequence[Any], values: Sequence[float | None]) -> None:
    """Hand real outcomes to a source that learns from them (its optional ``learn`` method)."""
    learn = getattr(source, "learn", None)
    if callable(learn) and items:
        learn(list(items), list(values))
