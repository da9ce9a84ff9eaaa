"""Group-relative advantages (GRPO) as pure functions over ``(groups, rollouts)`` arrays.

Unknown rewards are NaN. They are excluded from their group's statistics and get a NaN
advantage (the engine masks those rollouts out of the loss). A group with fewer than
``min_graded`` known rewards is skipped: all its advantages are NaN. Group weights multiply the
advantages *after* normalisation: scaling rewards before a std-normalising GRPO would be undone by
the normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
        require(self.eps >= 0, f"advantages.eps must be >= 0; got {self.eps}")
        require(self.min_graded >= 2, f"advantages.min_graded must be >= 2; got {self.min_graded}")


@dataclass
class GroupAdvantages:
    """Attributes:
    advantages: ``(n_groups, group_size)`` float; NaN for unknown rewards and skipped groups.
    contributes: ``(n_groups,)`` bool, groups that produced advantages.
    degenerate: ``(n_groups,)`` bool, contributing groups whose known rewards are all equal (zero advantages).
    graded: ``(n_groups,)`` int, known rewards per group.
    """

    advantages: np.ndarray
    contributes: np.ndarray
    degenerate: np.ndarray
    graded: np.ndarray


def as_reward_matrix(rewards: np.ndarray | Sequence[Sequence[float | None]]) -> np.ndarray:
    """Rewards as a float ``(n_groups, max_group_size)`` array, ``None`` and padding as NaN.

    Raises on infinite values (unknown must be ``None``/NaN, never inf) and on empty groups.
    """
    if isinstance(rewards, np.ndarray):
        if rewards.ndim != 2:
            raise ValueError(f"rewards must be a 2-D (groups, rollouts) array; got shape {rewards.shape}")
        matrix = rewards.astype(float, copy=True)
    else:
        groups = [list(g) for g in rewards]
        if any(len(g) == 0 for g in groups):
            raise ValueError("every group needs at least one rollout; got an empty group")
        width = max((len(g) for g in groups), default=0)
        matrix = np.full((len(groups), width), np.nan)
        for i, g in enumerate(groups):
            matrix[i, : len(g)] = [np.nan if v is None else float(v) for v in g]
    if np.isinf(matrix).any():
        raise ValueError("rewards contain inf: mark an unknown reward as None/NaN, never inf")
    return matrix


def centre_within_groups(
    values: np.ndarray, group_index: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
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
    rewards: np.ndarray,
    weights: np.ndarray | None = None,
    config: AdvantageConfig | None = None,
) -> GroupAdvantages:
    """Per-group normalised advantages, then multiplied by each group's weight.

    Args:
        rewards: ``(n_groups, group_size)`` float, NaN = unknown.
        weights: ``(n_groups,)`` non-negative group weights, applied after normalisation (default 1).
        config: standardisation, epsilon and the minimum graded count.

    For each group with at least ``min_graded`` known rewards ``r``:
    ``A = (r - mean(r)) / (std(r) + eps)`` (population std) or ``A = r - mean(r)``.
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
