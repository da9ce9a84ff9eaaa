"""One step's inputs to :meth:`wmrl.core.corrector.Corrector.correct`, validated once.

Every rule an engine's scores must follow is checked here, so the corrector's step reads as the
method: the scores are ``(n_groups, G)`` matrices with NaN for unknown; real scores may stand only
where the plan executed; variances are non-negative; a Bernoulli anchor scores 0 or 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from wmrl.core.advantages import as_reward_matrix
from wmrl.core.arrays import KeyMatrix, RewardMatrix, RolloutMask
from wmrl.core.plan import Plan, solution_key_matrix, task_matrix
from wmrl.core.sources import NoiseModel

__all__ = ["Scores", "StepInputs", "score_matrix"]

#: A ``(n_groups, G)`` matrix of scores as callers give it: an array or nested sequences, NaN/None = unknown.
Scores = npt.NDArray[Any] | Sequence[Sequence[float | None]]


def score_matrix(name: str, scores: Scores, shape: tuple[int, int] | None) -> RewardMatrix:
    """``scores`` as a float ``(n_groups, G)`` array (NaN = unknown), checked against ``shape``."""
    matrix = as_reward_matrix(scores, name)
    if shape is not None and matrix.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (groups, rollouts); got {matrix.shape}")
    return matrix


def _refuse_stray(name: str, scores: npt.NDArray[Any], allowed: npt.NDArray[Any], what: str) -> None:
    stray = ~allowed & ~np.isnan(scores)
    if stray.any():
        cells = [(int(r), int(c)) for r, c in zip(*np.nonzero(stray), strict=True)][:5]
        raise ValueError(
            f"{name} hold values at (group, rollout) {cells}{'...' if stray.sum() > 5 else ''}: only the plan's "
            f"{what} are graded by real execution; leave the rest NaN/None"
        )


def _declared_noise(
    anchor_noise: NoiseModel | npt.NDArray[Any] | None,
    shape: tuple[int, int],
    real: npt.NDArray[Any],
    second: npt.NDArray[Any] | None,
) -> NoiseModel | npt.NDArray[Any] | None:
    """The declared execution noise, checked against the scores it describes."""
    if anchor_noise is None:
        return None
    if isinstance(anchor_noise, NoiseModel):
        if anchor_noise.kind == "bernoulli":
            for name, scores in (("anchor_scores", real), ("anchor_repeats", second)):
                if scores is not None:
                    known = scores[~np.isnan(scores)]
                    if ((known != 0) & (known != 1)).any():
                        raise ValueError(
                            f"the anchor declares bernoulli noise but {name} holds values other than 0 and 1"
                        )
        return anchor_noise
    if not isinstance(anchor_noise, np.ndarray) and not isinstance(anchor_noise, (list, tuple)):
        raise ValueError(
            f"anchor_noise must be a NoiseModel or a (n_groups, G) variance array; got {type(anchor_noise).__name__}"
        )
    var = score_matrix("anchor_noise", anchor_noise, shape)
    if (var < 0).any():
        raise ValueError("anchor_noise holds negative variances: a variance is >= 0 (score units²)")
    return var


@dataclass(frozen=True)
class StepInputs:
    """A step's scores and what the plan said, validated (every matrix ``(n_groups, G)``, NaN = unknown).

    Attributes:
        plan: the step's plan.
        wm: world-model scores.
        real: real scores of the first executions (only where ``execute``).
        second: real scores of the repeated executions (only where ``repeat``), or ``None``.
        wm_variance: the world model's per-call noise variance, or ``None``.
        declared: the anchor's declared noise (a model, a variance matrix) or ``None``.
        keys: object matrix of solution keys (``None`` = no key), or ``None`` for no keys.
        tasks: object matrix of each rollout's task (``""`` for one task).
        execute / repeat: bool, the plan's executions and repeats.
    """

    plan: Plan
    wm: RewardMatrix
    real: RewardMatrix
    second: RewardMatrix | None
    wm_variance: RewardMatrix | None
    declared: NoiseModel | RewardMatrix | None
    keys: KeyMatrix | None
    tasks: KeyMatrix
    execute: RolloutMask
    repeat: RolloutMask

    @property
    def shape(self) -> tuple[int, int]:
        return cast("tuple[int, int]", self.wm.shape)

    @property
    def executions(self) -> int:
        """Real executions with a known score: first executions and repeats."""
        known = int(np.count_nonzero(~np.isnan(self.real)))
        if self.second is not None:
            known += int(np.count_nonzero(~np.isnan(self.second)))
        return known

    @property
    def anchor(self) -> npt.NDArray[Any]:
        """``(n_groups,)`` bool: the whole anchor groups."""
        return self.plan.anchor

    @classmethod
    def check(
        cls,
        step: int,
        plan: Plan,
        wm_scores: Scores,
        anchor_scores: Scores,
        wm_variance: Scores | None = None,
        anchor_repeats: Scores | None = None,
        anchor_noise: NoiseModel | npt.NDArray[Any] | None = None,
        solution_keys: Any = None,
    ) -> StepInputs:
        """Validate a step's inputs against its plan (see :meth:`Corrector.correct` for each argument).

        Raises:
            ValueError: naming the input and the rule it breaks.
        """
        if plan.step != step:
            raise ValueError(
                f"plan is for step {plan.step} but the corrector is at step {step}: plan each step once"
            )
        n = len(plan.group_keys)
        if n == 0:
            raise ValueError("correct() needs a plan with at least one group")
        wm = score_matrix("wm_scores", wm_scores, None)
        if wm.shape[0] != n:
            raise ValueError(f"wm_scores has {wm.shape[0]} groups; the plan has {n}")
        shape = (int(wm.shape[0]), int(wm.shape[1]))
        real = score_matrix("anchor_scores", anchor_scores, shape)
        execute = plan.execute_mask(shape[1])
        repeat = plan.repeat_mask(shape[1])
        _refuse_stray("anchor_scores", real, execute, "executed rollouts (plan.execute)")
        second = None
        if anchor_repeats is not None:
            second = score_matrix("anchor_repeats", anchor_repeats, shape)
            _refuse_stray("anchor_repeats", second, repeat, "repeated rollouts (plan.repeat)")
        variance = None
        if wm_variance is not None:
            variance = score_matrix("wm_variance", wm_variance, shape)
            if (variance < 0).any():
                raise ValueError(
                    "wm_variance holds negative values: a variance is >= 0 (score units²), NaN if unknown"
                )
        return cls(
            plan=plan,
            wm=wm,
            real=real,
            second=second,
            wm_variance=variance,
            declared=_declared_noise(anchor_noise, shape, real, second),
            keys=solution_key_matrix(solution_keys, shape),
            tasks=task_matrix(plan.task_keys, shape),
            execute=execute,
            repeat=repeat,
        )
