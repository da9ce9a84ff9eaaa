"""Collapse a world model's per-frame progress and success curves into one score per episode.

Robometer returns, for each of the ``K`` frames it read, a progress value in ``[0, 1]`` (the
expectation of its 10-bin progress distribution) and a success probability in ``[0, 1]``. GRPO needs
one number per episode; :class:`ScoreConfig` chooses how it is made (the official WMRL modes):

* ``potential`` (default): ``mean(progress[-k:]) - mean(progress[:k])``, in ``[-1, 1]``. Shaped
  rewards ``Φ(s_t+1) - Φ(s_t)`` summed over an episode telescope to ``Φ_T - Φ_0``; averaging ``k``
  frames at each end smooths single-frame noise. ``k`` is capped at ``K // 2`` so the two windows
  never overlap (with Robometer's 8 frames and the default ``k = 3`` the cap never binds).
* ``final``: ``progress[-1]``, the last frame's progress (what lerobot's Robometer reward returns).
* ``max``: ``max(progress)``. It invites reward hacking (reach a good state, then fall apart).
* ``success``: ``success[-1]``, the success probability at the last frame (the value Robometer's own
  ``extract_success_probs_from_output`` reads).

A curve that cannot be scored (empty, non-finite, outside ``[0, 1]``, a missing success curve in
``success`` mode) raises :class:`ScoreError`; the reward source turns that into an unknown score
(``None``), never a default value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from wmrl.core.config import require, require_int

__all__ = ["SCORE_MODES", "ScoreConfig", "ScoreError", "ScoreMode", "episode_score"]

ScoreMode = Literal["potential", "final", "max", "success"]
SCORE_MODES: tuple[ScoreMode, ...] = ("potential", "final", "max", "success")
# Progress and probabilities come out of softmax/sigmoid in bf16 or fp32; allow that much round-off.
_RANGE_TOL = 1e-4


class ScoreError(ValueError):
    """A progress/success curve that cannot be turned into an episode score."""


@dataclass(frozen=True)
class ScoreConfig:
    """How an episode's curves become one score.

    Attributes:
        mode: ``potential``, ``final``, ``max`` or ``success`` (see the module docstring).
        k: frames averaged at each end in ``potential`` mode (the official ``dense_smooth_k = 3``).
    """

    mode: ScoreMode = "potential"
    k: int = 3

    def __post_init__(self) -> None:
        require(self.mode in SCORE_MODES, f"score mode must be one of {SCORE_MODES}; got {self.mode!r}")
        require_int(self.k, "k (frames averaged at each end)")

    @property
    def value_range(self) -> tuple[float, float]:
        """The interval every score of this mode lies in."""
        return (-1.0, 1.0) if self.mode == "potential" else (0.0, 1.0)


def _curve(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ScoreError(f"{name} must be a 1-D per-frame curve; got shape {arr.shape}")
    if arr.size == 0:
        raise ScoreError(f"{name} is empty: the world model returned no frame")
    if not np.all(np.isfinite(arr)):
        raise ScoreError(f"{name} holds non-finite values: {arr.tolist()}")
    if arr.min() < -_RANGE_TOL or arr.max() > 1.0 + _RANGE_TOL:
        raise ScoreError(f"{name} must lie in [0, 1]; got values in [{arr.min():.4g}, {arr.max():.4g}]")
    return np.clip(arr, 0.0, 1.0)


def episode_score(
    progress: object, success: object | None = None, config: ScoreConfig | None = None
) -> float:
    """One episode's score from its per-frame curves (frames in time order).

    Args:
        progress: ``(K,)`` progress per frame, in ``[0, 1]``.
        success: ``(K,)`` success probability per frame, in ``[0, 1]`` (needed by ``success`` mode only).
        config: the score mode (default: ``potential`` with ``k = 3``).

    Returns:
        The score, in ``config.value_range``.

    Raises:
        ScoreError: the curves cannot be scored (see the module docstring).
    """
    config = config or ScoreConfig()
    if config.mode == "success":
        if success is None:
            raise ScoreError("score mode 'success' needs the per-frame success probabilities")
        return float(_curve(success, "success")[-1])
    p = _curve(progress, "progress")
    if config.mode == "final":
        return float(p[-1])
    if config.mode == "max":
        return float(p.max())
    if p.size < 2:
        raise ScoreError("score mode 'potential' needs at least 2 frames (a start and an end)")
    k = min(config.k, p.size // 2)
    return float(p[-k:].mean() - p[:k].mean())
