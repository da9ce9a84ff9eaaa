"""One demonstration in memory (:class:`Demo`) and orientation conversion of its frames."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from wmrl.embodied.env.images import check_orientation, orient_image

__all__ = ["Demo", "convert_orientation"]


def convert_orientation(frames: np.ndarray, source: str, target: str) -> np.ndarray:
    """Re-orient frames stored in ``source`` orientation to ``target`` (exact: flips only).

    Each orientation is an involution of the rendered (``raw``) image, so ``raw = orient(frame,
    source)`` and the result is ``orient(raw, target)``.

    Args:
        frames: ``uint8 (..., H, W, 3)``: one frame or a stack.
        source, target: one of ``upright``, ``rotate180``, ``raw``.
    """
    check_orientation(source)
    check_orientation(target)
    if source == target:
        return frames
    if frames.ndim == 3:
        return orient_image(orient_image(frames, source), target)
    return np.stack([orient_image(orient_image(f, source), target) for f in frames])


@dataclass
class Demo:
    """One demonstration. ``T`` = number of actions.

    Attributes:
        instruction: the task's language instruction.
        actions: ``float32 (T, 7)`` in LIBERO's action space (end-effector deltas in [-1, 1], gripper
            -1 = open, +1 = close).
        frames: camera name -> ``uint8 (T, H, W, 3)``; ``frames[c][t]`` is what the camera showed when
            ``actions[t]`` was chosen.
        orientation: orientation of ``frames`` (see ``wmrl.embodied.env.images``).
        suite, task_id: the LIBERO task, when known.
        states: ``float64 (T, D)`` flattened MuJoCo states before each action, when known;
            ``states[0]`` is the state a replay starts from.
        success: whether the episode reached the goal (``None``: not recorded).
        name: where it came from (``file.hdf5:demo_0``, ``dataset:episode 3``...).
        init_state: index of the task's fixed initial state it started from, when known.
        frames_after_action: the source stores the observation *after* each action with it
            (LIBERO's HDF5 files do); a replay regenerates correctly paired frames.
        labelled_by: ``None`` when ``actions`` are what was executed; else the policy whose action at
            each visited state is recorded in place of the executed one (DAgger: one policy drives,
            another labels). Such a demonstration cannot be replayed: its actions do not reproduce
            its frames.
    """

    instruction: str
    actions: np.ndarray
    frames: dict[str, np.ndarray]
    orientation: str
    suite: str | None = None
    task_id: int | None = None
    states: np.ndarray | None = None
    success: bool | None = None
    name: str = ""
    init_state: int | None = None
    frames_after_action: bool = False
    labelled_by: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.actions = np.asarray(self.actions, dtype=np.float32)
        if self.actions.ndim != 2 or self.actions.shape[1] != 7:
            raise ValueError(f"{self.name}: actions must have shape (T, 7); got {self.actions.shape}")
        check_orientation(self.orientation)
        t = self.actions.shape[0]
        for camera, stack in self.frames.items():
            if stack.dtype != np.uint8 or stack.ndim != 4 or stack.shape[-1] != 3 or stack.shape[0] != t:
                raise ValueError(
                    f"{self.name}: frames[{camera!r}] must be uint8 ({t}, H, W, 3); got {stack.dtype} {stack.shape}"
                )
        if self.states is not None and len(self.states) != t:
            raise ValueError(f"{self.name}: {len(self.states)} states for {t} actions")

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])

    def oriented(self, target: str) -> Demo:
        """The same demonstration with its frames in ``target`` orientation."""
        frames = {c: convert_orientation(f, self.orientation, target) for c, f in self.frames.items()}
        return replace(self, frames=frames, orientation=target)
