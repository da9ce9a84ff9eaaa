"""Camera image orientation.

MuJoCo renders with OpenGL, whose framebuffer rows start at the *bottom* of the picture, so the
arrays robosuite returns (``IMAGE_CONVENTION = "opengl"``) are upside down. Three orientations are
offered:

* ``"upright"`` (default): rows flipped (``frame[::-1]``). This is the true camera view: the table
  is at the bottom and left is left. It matches robosuite's own upright convention
  (``camera_utils.get_camera_segmentation`` and ``project_points_from_world_to_camera``), the
  openvla-mini LIBERO evaluation (``np.flipud``, which MiniVLA was trained against) and Robometer's
  LIBERO loader. Tested against the simulator: a world point projected with robosuite's camera
  matrices lands on the gripper in the upright image.
* ``"rotate180"``: rows and columns flipped (``frame[::-1, ::-1]``): upright but mirrored left to
  right. This is what OpenVLA, openpi and lerobot apply, because their regenerated LIBERO training
  data (``modified_libero_rlds``) was stored that way. Use it only for policies trained on that data.
* ``"raw"``: as rendered (upside down).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ORIENTATIONS", "check_orientation", "orient_image"]

ORIENTATIONS: tuple[str, ...] = ("upright", "rotate180", "raw")


def check_orientation(orientation: str) -> str:
    """Return ``orientation`` if it is one of :data:`ORIENTATIONS`, else raise ``ValueError``."""
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {', '.join(ORIENTATIONS)}; got {orientation!r}")
    return orientation


def orient_image(frame: np.ndarray, orientation: str) -> np.ndarray:
    """Re-orient a rendered frame.

    Args:
        frame: ``(H, W)`` or ``(H, W, C)`` array as MuJoCo rendered it (bottom row first).
        orientation: one of :data:`ORIENTATIONS`.

    Returns:
        A C-contiguous copy of shape ``(H, W[, C])`` (a copy, so later renders cannot alias it).
    """
    check_orientation(orientation)
    if frame.ndim not in (2, 3):
        raise ValueError(f"frame must have shape (H, W) or (H, W, C); got {frame.shape}")
    if orientation == "upright":
        out = frame[::-1]
    elif orientation == "rotate180":
        out = frame[::-1, ::-1]
    else:
        out = frame
    # A reversed view is not contiguous, so ascontiguousarray copies it; "raw" needs an explicit copy.
    return frame.copy() if out is frame else np.ascontiguousarray(out)
