"""The anchor's execution noise: how much a real score varies when the same rollout is executed again.

Real execution is the trusted stream, but not always an exact one: an ML script's score varies with
its seed, a flaky run times out, an episode in a stochastic environment is a Bernoulli draw. The
fusion must not count that noise against the world model (``docs/method.md`` §2), so it needs the
noise variance ``σ²`` of each real score. Three routes, in order of precedence:

1. **measured**: the scheduler re-executes a share of the executed rollouts
   (``scheduler.repeat_share``); two independent executions ``r¹, r²`` of one rollout give the
   unbiased estimate ``(r¹ - r²)² / 2`` of its ``σ²`` whatever the noise's shape (for a 0/1 outcome it
   estimates ``p(1 - p)``). The pooled, exponentially decayed mean is used once ``min_repeats``
   repeats exist. The share of repeats whose two scores differ is reported too: it tells a user
   their execution is flaky;
2. **declared**: the source states a :class:`~wmrl.core.sources.NoiseModel` (or the caller passes a
   per-rollout variance array): ``deterministic`` → 0, ``gaussian`` → its variance, ``bernoulli`` →
   ``c(1 - c)`` with ``c`` the (prequentially) calibrated world-model score, the available estimate of
   the success probability ``E[r | x]``. Since ``E[p(1-p) | x] = c(1-c) - Var(p | x)``, this
   *overstates* the noise where the world model is uninformative (see ``docs/method.md``);
3. **assumed**: nothing is known; execution is assumed deterministic (``σ² = 0``) and the metric
   ``wmrl/exec_noise_route`` says so (0).

A rollout whose reward is the mean of two executions has variance ``σ²/2``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.sources import NoiseModel

__all__ = ["ROUTE_ASSUMED", "ROUTE_DECLARED", "ROUTE_MEASURED", "ExecutionNoise"]

ROUTE_ASSUMED, ROUTE_DECLARED, ROUTE_MEASURED = 0, 1, 2


class ExecutionNoise:
    """Pooled repeat statistics and the per-rollout noise variance each route gives."""

    def __init__(self, half_life_steps: float, min_repeats: int) -> None:
        self.half_life_steps = float(half_life_steps)
        self.min_repeats = int(min_repeats)
        self.repeat_ss = 0.0  # decayed Σ (r¹ - r²)² / 2
        self.repeat_n = 0.0  # decayed number of repeat pairs
        self.repeats_total = 0  # repeat pairs ever seen
        self.differ_total = 0  # of which the two scores differed

    def observe(self, first: npt.NDArray[Any], second: npt.NDArray[Any] | None) -> dict[str, float | None]:
        """Add one step's repeated executions (call once per step; decays the pooled sums).

        Args:
            first, second: ``(n_groups, G)`` real scores of the first and the repeated execution,
                NaN where unknown or not repeated.

        Returns:
            ``repeats`` (pairs with both scores known this step) and ``differs`` (their share whose
            two scores differ; ``None`` with no pairs).
        """
        decay = 0.5 ** (1.0 / self.half_life_steps)
        self.repeat_ss *= decay
        self.repeat_n *= decay
        if second is None:
            return {"repeats": 0.0, "differs": None}
        both = ~np.isnan(first) & ~np.isnan(second)
        a, b = first[both], second[both]
        count = int(a.size)
        if not count:
            return {"repeats": 0.0, "differs": None}
        differs = int(np.count_nonzero(a != b))
        self.repeat_ss += float(np.sum((a - b) ** 2)) / 2.0
        self.repeat_n += float(count)
        self.repeats_total += count
        self.differ_total += differs
        return {"repeats": float(count), "differs": differs / count}

    @property
    def measured_var(self) -> float | None:
        """The pooled repeat estimate of ``σ²`` (reward units²); ``None`` before ``min_repeats`` repeats."""
        if self.repeats_total < self.min_repeats or self.repeat_n <= 0:
            return None
        return self.repeat_ss / self.repeat_n

    def variances(
        self,
        declared: NoiseModel | npt.NDArray[Any] | None,
        calibrated: npt.NDArray[Any],
        executions: npt.NDArray[Any],
        cells: tuple[npt.NDArray[Any], npt.NDArray[Any]],
    ) -> tuple[npt.NDArray[Any], int]:
        """Per-pair execution-noise variance of the real reward and the route it came from.

        Args:
            declared: the source's :class:`NoiseModel`, a per-rollout ``(n_groups, G)`` variance
                array, or ``None``.
            calibrated: ``(M,)`` calibrated world-model scores of the pairs (for ``bernoulli``).
            executions: ``(M,)`` number of executions averaged into each pair's real reward (1 or 2).
            cells: ``(rows, cols)`` of the pairs, to index a per-rollout array.

        Returns:
            ``((M,) variances in reward units², route)``.
        """
        measured = self.measured_var
        if measured is not None:
            var, route = np.full(calibrated.shape, measured), ROUTE_MEASURED
        elif declared is None:
            var, route = np.zeros(calibrated.shape), ROUTE_ASSUMED
        elif isinstance(declared, NoiseModel):
            route = ROUTE_DECLARED
            if declared.kind == "deterministic":
                var = np.zeros(calibrated.shape)
            elif declared.kind == "gaussian":
                assert declared.variance is not None  # NoiseModel requires a variance for gaussian
                var = np.full(calibrated.shape, float(declared.variance))
            else:
                p = np.clip(calibrated, 0.0, 1.0)
                var = p * (1.0 - p)
        else:
            var, route = np.asarray(declared, dtype=float)[cells], ROUTE_DECLARED
            # Unknown entries of a declared array: nothing said about that rollout, assume 0.
            var = np.where(np.isnan(var), 0.0, var)
        return var / np.maximum(executions, 1), route

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "repeat_ss": self.repeat_ss,
            "repeat_n": self.repeat_n,
            "repeats_total": self.repeats_total,
            "differ_total": self.differ_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ss, n = float(state["repeat_ss"]), float(state["repeat_n"])
        total, differ = int(state["repeats_total"]), int(state["differ_total"])
        if not (math.isfinite(ss) and math.isfinite(n)) or ss < 0 or n < 0 or not 0 <= differ <= total:
            raise ValueError("execution-noise state is inconsistent (negative, non-finite or differ > total)")
        self.repeat_ss, self.repeat_n, self.repeats_total, self.differ_total = ss, n, total, differ
