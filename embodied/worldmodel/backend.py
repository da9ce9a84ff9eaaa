"""What a Robometer backend returns, and the interface both backends (in process, HTTP) implement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["FramePredictions", "RobometerBackend", "Trajectory"]

Trajectory = tuple[np.ndarray, str]
"""``(frames, task)``: ``uint8 (K, H, W, 3)`` upright RGB frames in time order and the instruction."""


@dataclass
class FramePredictions:
    """One trajectory's per-frame outputs, or the reason there are none.

    Attributes:
        progress: ``float64 (K,)`` progress per frame in ``[0, 1]`` (empty when ``error`` is set).
        success: ``float64 (K,)`` success probability per frame in ``[0, 1]`` (may be empty if the
            backend gives none).
        progress_std: ``float64 (K,)`` std of the progress-bin distribution, when the backend has it.
        error: why this trajectory has no prediction, else ``None``.
    """

    progress: np.ndarray = field(default_factory=lambda: np.zeros(0))
    success: np.ndarray = field(default_factory=lambda: np.zeros(0))
    progress_std: np.ndarray | None = None
    error: str | None = None

    @classmethod
    def failed(cls, reason: str) -> FramePredictions:
        return cls(error=reason)


@runtime_checkable
class RobometerBackend(Protocol):
    """Per-frame progress and success for a batch of trajectories.

    ``predict`` returns one :class:`FramePredictions` per trajectory, in order; a trajectory that
    cannot be scored (bad input, a crashed forward pass, an unreachable server, a malformed reply)
    gets one with ``error`` set. Backends should not raise for such failures; callers still treat
    an exception as the failure of the whole batch. Backends do not subsample: they score the
    frames they are given.
    """

    name: str

    def predict(self, trajectories: Sequence[Trajectory]) -> list[FramePredictions]: ...
