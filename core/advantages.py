"""Group-relative advantages (GRPO) as pure functions over ``(groups, rollouts)`` arrays.

Unknown rewards are NaN. They are excluded from their group's statistics and get a NaN
advantage (the engine masks those rollouts out of the loss). A group with fewer than
``min_graded`` known rewards is skipped: all its advantages are NaN. Group weights multiply the
advantages *after* normalisation: scaling rewards before a std-normalising GRPO would be undone by
the normalisation.

The std convention is the *population* std (divide by the number of known rewards ``n``), chosen
deliberately: it makes the mean squared advantage of a non-degenerate group exactly 1 per known
rollout (up to ``eps``) whatever ``n`` is, so a group with 3 known rewards pushes each of its rollouts
as hard as a group with 8. TRL's GRPO divides by the Bessel-corrected std, whose mean square is
``(n - 1)/n`` per rollout: 0.67 for 3 known rewards, 0.88 for 8. With unknowns the number of known
rewards varies from group to group, and under that convention the gradient's per-rollout scale
would vary with it.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.config import require

__all__ = [
    "AdvantageConfig",
    "GroupAdvantages",
    "as_reward_matrix",
    "centre_within_groups",
    "group_advantages",
]


@dataclass(frozen=True)
class AdvantageConfig:
    """Attributes:
    standardize: divide by the group's standard deviation (GRPO); ``False`` centres only (Dr. GRPO).
    eps: added to the standard deviation (reward units).
    min_graded: known rewards a group needs to produce advantages.
    """

    standardize: bool = True
    eps: float = 1e-4
    min_graded: int = 2

    def __post_init__(self) -> None:
        require(
            isinstance(self.eps, (int, float)) and 0 <= self.eps < float("inf"),
            f"advantages.eps must be finite and >= 0; got {self.eps}",
        )
        require(self.min_graded >= 2, f"advantages.min_graded must be >= 2; got {self.min_graded}")


@dataclass
class GroupAdvantages:
    """Attributes:
    advantages: ``(n_groups, group_size)`` float; NaN for unknown rewards and skipped groups.
    contributes: ``(n_groups,)`` bool, groups that produced advantages.
    degenerate: ``(n_groups,)`` bool, contributing groups whose known rewards are all equal (zero advantages).
    graded: ``(n_groups,)`` int, known rewards per group.
    """

    advantages: npt.NDArray[Any]
    contributes: npt.NDArray[Any]
    degenerate: npt.NDArray[Any]
    graded: npt.NDArray[Any]


def _as_number(value: object, name: str, where: str) -> float:
    if value is None:
        return np.nan
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{name}{where} is {value!r} ({type(value).__name__}): scores must be real numbers "
            "(int or float, not bool, str or an array) or None for unknown"
        )
    return float(value)


def as_reward_matrix(
    rewards: npt.NDArray[Any] | Sequence[Sequence[float | None]], name: str = "rewards"
) -> npt.NDArray[Any]:
    """Rewards as a float ``(n_groups, max_group_size)`` array, ``None`` and padding as NaN.

    Accepts a 2-D numeric array (int or float dtype; object arrays are checked entry by entry) or
    a sequence of groups, each a sequence of real numbers or ``None``. Raises ``ValueError`` naming
    the rule on text, booleans, nested arrays, infinite values (unknown must be ``None``/NaN, never
    inf) and empty groups.
    """
    if isinstance(rewards, np.ndarray):
        if rewards.ndim != 2:
            raise ValueError(f"{name} must be a 2-D (groups, rollouts) array; got shape {rewards.shape}")
        if rewards.dtype.kind in "iuf":
            matrix = rewards.astype(float, copy=True)
        elif rewards.dtype.kind == "O":
            matrix = np.array(
                [
                    [_as_number(v, name, f"[{i}][{j}]") for j, v in enumerate(row)]
                    for i, row in enumerate(rewards)
                ],
                dtype=float,
            ).reshape(rewards.shape)
        else:
            raise ValueError(
                f"{name} has dtype {rewards.dtype}: scores must be numbers (int or float), "
                "not text or booleans; unknown is NaN"
            )
    else:
        if isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence):
            raise ValueError(
                f"{name} must be a 2-D array or a sequence of groups; got {type(rewards).__name__}"
            )
        groups = []
        for i, g in enumerate(rewards):
            if isinstance(g, (str, bytes)) or not isinstance(g, (Sequence, np.ndarray)):
                raise ValueError(
                    f"{name}[{i}] must be a sequence of scores (one group); got {type(g).__name__}"
                )
            groups.append(list(g))
        width = max((len(g) for g in groups), default=0)
        matrix = np.full((len(groups), width), np.nan)
        for i, g in enumerate(groups):
            matrix[i, : len(g)] = [_as_number(v, name, f"[{i}][{j}]") for j, v in enumerate(g)]
        if any(len(g) == 0 for g in groups):
            raise ValueError(f"every group needs at least one rollout; {name} has an empty group")
    if matrix.shape[0] and not matrix.shape[1]:
        raise ValueError(f"every group needs at least one rollout; {name} has shape {matrix.shape}")
    if np.isinf(matrix).any():
        raise ValueError(f"{name} contain inf: mark an unknown reward as None/NaN, never inf")
    return matrix


def centre_within_groups(
    values: npt.NDArray[Any], group_index: npt.NDArray[Any], n_groups: int
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Subtract each group's mean from its members, for flat (ragged) data.

    Args:
        values: ``(m,)`` values, all known.
        group_index: ``(m,)`` integer group of each value, in ``[0, n_groups)``.
        n_groups: number of groups.

    Returns:
        ``(centred (m,), counts (n_groups,))``.
    """
    counts = np.bincount(group_index, minlength=n_groups)
    sums = np.bincount(group_index, weights=values, minlength=n_groups)
    return values - (sums / np.maximum(counts, 1))[group_index], counts


def group_advantages(
    rewards: npt.NDArray[Any],
    weights: npt.NDArray[Any] | None = None,
    config: AdvantageConfig | None = None,
) -> GroupAdvantages:
    """Per-group normalised advantages, then multiplied by each group's weight.

    Args:
        rewards: ``(n_groups, group_size)`` float, NaN = unknown.
        weights: ``(n_groups,)`` non-negative group weights, applied after normalisation (default 1).
        config: standardisation, epsilon and the minimum graded count.

    For each group with at least ``min_graded`` known rewards ``r``:
    ``A = (r - mean(r)) / (std(r) + eps)`` (population std; see the module docstring for why) or
    ``A = r - mean(r)``.
    """
    cfg = config or AdvantageConfig()
    r = as_reward_matrix(rewards)
    n = r.shape[0]
    known = ~np.isnan(r)
    graded = known.sum(axis=1)
    contributes = graded >= cfg.min_graded
    safe = np.where(known, r, 0.0)
    mean = safe.sum(axis=1) / np.maximum(graded, 1)
    centred = np.where(known, r - mean[:, None], np.nan)
    var = np.where(known, centred**2, 0.0).sum(axis=1) / np.maximum(graded, 1)
    std = np.sqrt(var)
    # Degenerate = all known rewards exactly equal (scale-free, unlike a threshold on the std).
    high = np.where(known, r, -np.inf).max(axis=1)
    low = np.where(known, r, np.inf).min(axis=1)
    degenerate = contributes & (high == low)
    with np.errstate(divide="ignore", invalid="ignore"):  # degenerate groups are zeroed just below
        adv = centred / (std + cfg.eps)[:, None] if cfg.standardize else centred
    # A group whose known rewards are all equal carries no preference: exact zeros, not 0/eps noise.
    adv = np.where(degenerate[:, None] & known, 0.0, adv)
    adv[~contributes] = np.nan
    if weights is not None:
        w = np.asarray(weights, dtype=float)
        if w.shape != (n,):
            raise ValueError(f"weights must have shape ({n},), one per group; got {w.shape}")
        if not np.all(np.isfinite(w)) or (w < 0).any():
            raise ValueError("group weights must be finite and >= 0")
        adv = adv * w[:, None]
    return GroupAdvantages(advantages=adv, contributes=contributes, degenerate=degenerate, graded=graded)
