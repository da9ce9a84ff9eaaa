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
their real outcomes (``learn(items, values)``, an optional method any source may implement), and it
saves what they learned in its checkpoints (``state_dict`` / ``load_state_dict``, optional too).

:meth:`FusedWorldModel.grade` keeps the first source's status, information and feedback (what a
K-turn agent observes next) and replaces its value by the fused one: a domain whose world model
predicts more than a number (AutoResearch's predicted traceback) keeps it behind a fusion.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.rollouts import RolloutNeeds, needs_of
from wmrl.core.sources import Grade, RewardSource, Role, collect_grades

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

    def state_dict(self) -> dict[str, Any]:
        """The points learned (JSON-ready lists) and the settings they were learned under."""
        return {
            "k": self.k,
            "radius": self.radius,
            "max_points": self.max_points,
            "x": None if self._x is None else self._x.tolist(),
            "y": self._y.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the points of :meth:`state_dict` (the settings must be this regression's)."""
        saved = (state["k"], state["radius"], state["max_points"])
        if saved != (self.k, self.radius, self.max_points):
            raise ValueError(
                f"the saved nearest-neighbour regression has k, radius, max_points = {saved}; this one "
                f"{(self.k, self.radius, self.max_points)}: resume with the same settings"
            )
        self._x = (
            None if state["x"] is None else np.asarray(state["x"], dtype=float).reshape(len(state["y"]), -1)
        )
        self._y = np.asarray(state["y"], dtype=float)


class SurrogateSource:
    """A world model fitted on the run's real outcomes over domain features (see the module docstring).

    Args:
        features: ``item -> (d,)`` array (the same ``d`` for every item).
        model: the regression (default :class:`NearestNeighbours` with ``k=3``); with ``partition``, the
            empty template every partition's regression is copied from.
        name: the source's name.
        partition: ``item -> key``: items learn only from items of their own key (AutoResearch: the
            task, whose rewards are on their own scale); ``None``: one regression for every item.
    """

    role = Role.WORLD_MODEL

    def __init__(
        self,
        features: Callable[[Any], Floats],
        model: NearestNeighbours | None = None,
        name: str = "surrogate",
        partition: Callable[[Any], Hashable] | None = None,
    ) -> None:
        self.features = features
        # not `model or ...`: an empty regression has length 0 and is falsy
        self.model = model if model is not None else NearestNeighbours()
        self.name = name
        self.partition = partition
        self._parts: dict[str, NearestNeighbours] = {}

    def __len__(self) -> int:
        """Real outcomes learned (every partition's)."""
        return len(self.model) + sum(len(m) for m in self._parts.values())

    def _key(self, item: Any) -> str | None:
        # str: partitions are saved in JSON checkpoints by key
        return None if self.partition is None else str(self.partition(item))

    def _regression(self, key: str | None, create: bool) -> NearestNeighbours | None:
        if key is None:
            return self.model
        if key not in self._parts and create:
            self._parts[key] = copy.deepcopy(self.model)
        return self._parts.get(key)

    def _matrix(self, items: Sequence[Any]) -> Floats:
        return np.stack([np.asarray(self.features(item), dtype=float).reshape(-1) for item in items])

    def _by_key(self, items: Sequence[Any]) -> dict[str | None, list[int]]:
        rows: dict[str | None, list[int]] = {}
        for i, item in enumerate(items):
            rows.setdefault(self._key(item), []).append(i)
        return rows

    def score(self, items: Sequence[Any]) -> list[float | None]:
        out: list[float | None] = [None] * len(items)
        for key, rows in self._by_key(items).items():
            model = self._regression(key, create=False)
            if model is None or not len(model):
                continue
            predictions = model.predict(self._matrix([items[i] for i in rows]))
            for i, v in zip(rows, predictions, strict=True):
                out[i] = None if math.isnan(v) else float(v)
        return out

    def grade(self, items: Sequence[Any]) -> list[Grade]:
        """:meth:`score` as grades of per-call variance 0: the same state predicts the same value."""
        return [Grade(v, variance=None if v is None else 0.0) for v in self.score(items)]

    def learn(self, items: Sequence[Any], values: Sequence[float | None]) -> None:
        """Add the real outcomes of ``items`` (``None`` = unknown, not learned)."""
        pairs = [
            (item, v) for item, v in zip(items, values, strict=True) if v is not None and math.isfinite(v)
        ]
        for key, rows in self._by_key([p[0] for p in pairs]).items():
            model = self._regression(key, create=True)
            assert model is not None
            model.add(self._matrix([pairs[i][0] for i in rows]), np.array([pairs[i][1] for i in rows]))

    def state_dict(self) -> dict[str, Any]:
        """What it learned: the regression's points (each partition's)."""
        return {
            "model": self.model.state_dict(),
            "parts": {key: m.state_dict() for key, m in self._parts.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self._parts = {}
        for key, part in state["parts"].items():
            model = copy.deepcopy(self.model)
            model.load_state_dict(part)
            self._parts[key] = model


class _Residuals:
    """Decayed sums of one source's calibrated residuals: a linear map ``r ≈ a·x + b`` and its error."""

    def __init__(self, half_life: float) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.n = self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0
        # the range of the outcomes seen: a line fitted to scores that barely vary has a huge slope,
        # and a score outside their range would be carried far beyond any real outcome
        self.lo, self.hi = math.inf, -math.inf
        self.count = 0.0  # outcomes learned, not decayed: the threshold counts outcomes, not weight

    def add(self, x: Floats, y: Floats) -> None:
        d = self.decay
        self.n, self.sx, self.sy = self.n * d, self.sx * d, self.sy * d
        self.sxx, self.sxy, self.syy = self.sxx * d, self.sxy * d, self.syy * d
        self.n += float(x.size)
        self.count += float(x.size)
        self.sx += float(x.sum())
        self.sy += float(y.sum())
        self.sxx += float(x @ x)
        self.sxy += float(x @ y)
        self.syy += float(y @ y)
        if y.size:
            self.lo, self.hi = min(self.lo, float(y.min())), max(self.hi, float(y.max()))

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
        line = self.line() if self.count >= min_pairs else None
        return None if line is None else (*line, 1.0 / self._error(line))

    def calibrated(self, fit: tuple[float, float, float], score: float) -> float:
        """``score`` on the outcomes' scale: the line, clipped to the range of the outcomes seen."""
        return min(max(fit[0] * score + fit[1], self.lo), self.hi)

    def state_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in _SUMS}

    def load_state_dict(self, state: dict[str, float]) -> None:
        for name in _SUMS:
            setattr(self, name, float(state[name]))


_SUMS = ("n", "sx", "sy", "sxx", "sxy", "syy", "lo", "hi", "count")


class FusedWorldModel:
    """Several world-model sources, calibrated and weighted each by its own measured error.

    Args:
        sources: the world models (any :class:`RewardSource`; those with ``learn`` learn too). The
            first is the primary: its status, information and feedback go with every fused grade.
        min_pairs: executed rollouts a source needs scored before it is calibrated and weighted;
            until then the first source's raw scores are used.
        half_life: how fast the calibration and error estimates forget, in learned outcomes.
        name: the source's name.
        item_key: ``item -> hashable``: which scored item a learned outcome belongs to (default
            ``id``: the same object; an engine that rebuilds its items between scoring and execution,
            as verl's reward manager does, needs a key of their content).
    """

    role = Role.WORLD_MODEL

    def __init__(
        self,
        sources: Sequence[RewardSource],
        min_pairs: int = 16,
        half_life: float = 2_000.0,
        name: str = "fused_world_model",
        item_key: Callable[[Any], Hashable] = id,
    ) -> None:
        if not sources:
            raise ValueError("FusedWorldModel needs at least one source")
        if isinstance(min_pairs, bool) or not isinstance(min_pairs, int) or min_pairs < 2:
            raise ValueError(
                f"min_pairs must be an integer >= 2 (a line needs two points); got {min_pairs!r}"
            )
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0; got {half_life!r}")
        self.sources = list(sources)
        self.min_pairs = min_pairs
        self.name = name
        self._residuals = [_Residuals(half_life) for _ in self.sources]
        self.item_key = item_key
        self._last: dict[Hashable, list[float | None]] = {}  # item key -> each source's score, until learned

    @property
    def needs(self) -> RolloutNeeds:
        """What the sources read, together; feedback is the primary's (the fused grade carries its)."""
        every = [needs_of(source) for source in self.sources]
        cameras = {n.camera for n in every if n.frames and n.camera is not None}
        if len(cameras) > 1:
            raise ValueError(f"the fused world models read frames from different cameras: {sorted(cameras)}")
        return RolloutNeeds(
            text=any(n.text for n in every),
            frames=max(n.frames for n in every),
            camera=next(iter(cameras), None),
            feedback=every[0].feedback,
        )

    def _fits(self) -> list[tuple[float, float, float] | None]:
        return [r.fit(self.min_pairs) for r in self._residuals]

    def grade(self, items: Sequence[Any]) -> list[Grade]:
        """Per item: the fused value, the primary's status, information and feedback, and the per-call
        variance of the fused value (``Σ (wₛ aₛ / Σw)² varₛ`` over the sources combined; ``None`` when
        one of them reports none). ``info["scores"]``: each source's own score."""
        if not items:
            return []
        columns = [collect_grades(source, items) for source in self.sources]
        for i, item in enumerate(items):
            self._last[self.item_key(item)] = [column[i].value for column in columns]
        fits = self._fits()
        out = []
        for i in range(len(items)):
            primary = columns[0][i]
            scores = {
                source.name: column[i].value for source, column in zip(self.sources, columns, strict=True)
            }
            measured = [
                (fit, residuals, graded, column[i].variance)
                for fit, residuals, column in zip(fits, self._residuals, columns, strict=True)
                if fit is not None and (graded := column[i].value) is not None
            ]
            if not any(fit is not None for fit in fits):  # nothing measured yet: the primary, as it is
                value, variance = primary.value, primary.variance
            elif not measured:
                value, variance = None, None
            else:
                total = sum(fit[2] for fit, _, _, _ in measured)
                value = sum(fit[2] * r.calibrated(fit, raw) for fit, r, raw, _ in measured) / total
                variances = [var for _, _, _, var in measured if var is not None]
                variance = (
                    None
                    if len(variances) < len(measured)
                    else sum(
                        (fit[2] * fit[0] / total) ** 2 * var
                        for (fit, _, _, _), var in zip(measured, variances, strict=True)
                    )
                )
            info = {**primary.info, "scores": scores}
            out.append(Grade(value, primary.status, variance, info, primary.feedback))
        return out

    def score(self, items: Sequence[Any]) -> list[float | None]:
        return [g.value for g in self.grade(items)]

    def weights(self) -> list[float | None]:
        """Each source's current share of the weight (``None``: not measured yet)."""
        raw = [None if fit is None else fit[2] for fit in self._fits()]
        total = sum(w for w in raw if w is not None)
        return [None if w is None else w / total for w in raw]

    def metrics(self) -> dict[str, float | None]:
        """``world_model/weight/<source>`` per source, and ``world_model/learned/<source>`` (outcomes a
        learning source holds)."""
        out: dict[str, float | None] = {
            f"world_model/weight/{source.name}": w
            for source, w in zip(self.sources, self.weights(), strict=True)
        }
        sources: list[Any] = self.sources  # duck-typed: ``learn`` and ``__len__`` are optional
        for source in sources:
            if callable(getattr(source, "learn", None)) and hasattr(source, "__len__"):
                out[f"world_model/learned/{source.name}"] = float(len(source))
        return out

    def learn(self, items: Sequence[Any], values: Sequence[float | None]) -> None:
        """Measure every source on the outcomes (with the scores it gave *before* them), then let the
        sources that learn, learn."""
        for item, value in zip(items, values, strict=True):
            scores = self._last.pop(self.item_key(item), None)
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

    def state_dict(self) -> dict[str, Any]:
        """Each source's calibration sums and, for a source that has one, its own state."""
        sources: list[Any] = self.sources  # duck-typed: ``state_dict`` is optional
        return {
            "sources": [source.name for source in self.sources],
            "residuals": [r.state_dict() for r in self._residuals],
            "states": [
                source.state_dict() if callable(getattr(source, "state_dict", None)) else None
                for source in sources
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = [source.name for source in self.sources]
        if state["sources"] != names:
            raise ValueError(f"the saved fusion combined {state['sources']}; this one combines {names}")
        for residuals, saved in zip(self._residuals, state["residuals"], strict=True):
            residuals.load_state_dict(saved)
        sources: list[Any] = self.sources  # duck-typed: a source saved a state only if it has one
        for source, saved in zip(sources, state["states"], strict=True):
            if saved is not None:
                source.load_state_dict(saved)


def learn_from(source: Any, items: Sequence[Any], values: Sequence[float | None]) -> None:
    """Hand real outcomes to a source that learns from them (its optional ``learn`` method)."""
    learn = getattr(source, "learn", None)
    if callable(learn) and items:
        learn(list(items), list(values))
