"""MP4 videos of episodes (imageio with its bundled ffmpeg, from the ``imageio-ffmpeg`` package)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["episode_frames", "write_video"]


def episode_frames(frames: dict[str, np.ndarray], cameras: Sequence[str] | None = None) -> np.ndarray:
    """Frames of several cameras side by side.

    Args:
        frames: camera -> ``(N, H, W, 3)`` uint8 (as in ``EpisodeRecord.frames``; same N and H).
        cameras: which cameras, left to right; default: all, in dict order.

    Returns:
        ``(N, H, sum(W), 3)`` uint8.
    """
    cameras = list(cameras) if cameras is not None else list(frames)
    if not cameras:
        raise ValueError("no camera frames to write: record frames with at least one camera")
    missing = [c for c in cameras if c not in frames]
    if missing:
        raise ValueError(f"no frames recorded for cameras {missing}; have {sorted(frames)}")
    arrays = [np.asarray(frames[c]) for c in cameras]
    if len({(a.shape[0], a.shape[1]) for a in arrays}) != 1:
        raise ValueError("cameras must have the same number of frames and the same height to be tiled")
    return np.concatenate(arrays, axis=2) if len(arrays) > 1 else arrays[0]


def write_video(path: str | Path, frames: np.ndarray, fps: float = 20.0) -> Path:
    """Write ``(N, H, W, 3)`` uint8 frames to an H.264 MP4 at ``fps`` frames per second."""
    import imageio.v2 as imageio

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 (N, H, W, 3); got {frames.dtype} {frames.shape}")
    if frames.shape[0] == 0:
        raise ValueError("cannot write a video with no frames")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # macro_block_size=2: H.264 with yuv420p needs even sides; imageio pads odd sizes by one pixel.
    with imageio.get_writer(path, fps=fps, codec="libx264", quality=7, macro_block_size=2) as writer:
        for frame in frames:
            # imageio's stubs type get_writer's result as its base class, which lacks the Writer's method
            writer.append_data(frame)  # type: ignore[attr-defined]
    return path
