"""Frame checks and Robometer's uniform subsampling of an episode to a fixed number of frames.

Robometer reads a fixed-size window of frames (8 for Robometer-4B). Its client-side helper
(``linspace_subsample_frames`` + ``pad_trajectory_to_max_frames_np`` in the robometer package, used
by its LIBERO reward wrapper) picks ``K`` evenly spaced indices over ``[0, T-1]`` — rounded to the
nearest integer with numpy's round-half-to-even, the first and last frame always kept — and pads an
episode shorter than ``K`` on the right by repeating its last frame. :func:`subsample_indices`
reproduces exactly those indices, so a frame window built here is the one the model saw in training.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_frames", "subsample_frames", "subsample_indices"]


def check_frames(frames: np.ndarray, what: str = "frames") -> np.ndarray:
    """Return ``frames`` as a C-contiguous ``uint8 (T, H, W, 3)`` array, or raise naming the broken rule.

    Raises:
        ValueError: not 4-D, not 3 channels last, empty, or not ``uint8``.
    """
    arr = np.asarray(frames)
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"{what} must have shape (T, H, W, 3) (RGB, channels last); got {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0 or arr.shape[2] == 0:
        raise ValueError(f"{what} must hold at least one non-empty frame; got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"{what} must be uint8 (0-255 RGB); got {arr.dtype}")
    return np.ascontiguousarray(arr)


def subsample_indices(num_frames: int, k: int) -> np.ndarray:
    """Indices of the ``k`` frames Robometer reads from an episode of ``num_frames`` frames.

    ``num_frames >= k``: ``rint(linspace(0, num_frames - 1, k))`` with the first index forced to 0 and
    the last to ``num_frames - 1`` (non-decreasing). ``num_frames < k``: every frame once, then the
    last frame repeated to length ``k`` (right padding). ``k == 1`` picks the last frame.

    Returns:
        ``int64 (k,)`` indices into the episode's frames.
    """
    if not isinstance(num_frames, (int, np.integer)) or num_frames < 1:
        raise ValueError(f"an episode needs at least one frame to subsample; got num_frames={num_frames!r}")
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"the number of frames to keep must be a positive integer; got k={k!r}")
    n, k = int(num_frames), int(k)
    if n <= k:
        return np.concatenate([np.arange(n), np.full(k - n, n - 1)]).astype(np.int64)
    if k == 1:
        return np.array([n - 1], dtype=np.int64)
    idx = np.rint(np.linspace(0, n - 1, k)).astype(np.int64)
    idx[0], idx[-1] = 0, n - 1
    return np.maximum.accumulate(np.clip(idx, 0, n - 1))


def subsample_frames(frames: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(frames[idx], idx)`` with ``idx = subsample_indices(len(frames), k)``; frames ``uint8 (k, H, W, 3)``."""
    arr = check_frames(frames)
    idx = subsample_indices(arr.shape[0], k)
    return arr[idx], idx
