"""95% Student-t intervals of a mean over seeds: the one definition every benchmark reports."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = ["ci95", "mean_and_ci95", "mean_ci"]


def ci95(values: Sequence[float] | npt.NDArray[np.float64]) -> float:
    """Half-width of the 95% Student-t interval of the mean (0 for one value: a curve's band)."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return 0.0
    return float(stats.t.ppf(0.975, v.size - 1) * np.std(v, ddof=1) / np.sqrt(v.size))


def mean_ci(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """``{"mean", "ci95", "n"}`` over the known values (``None`` where none is known)."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return {"mean": None, "ci95": None, "n": 0}
    return {"mean": float(np.mean(known)), "ci95": ci95(known), "n": len(known)}


def mean_and_ci95(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """``(mean, half-width)`` over the known values; the half-width is ``None`` below two values (an
    interval from one seed is unknown, not 0), the mean ``None`` with none."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None, None
    return float(np.mean(known)), (ci95(known) if len(known) > 1 else None)
