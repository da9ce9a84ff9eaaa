"""The configuration of one LIBERO environment."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wmrl.embodied.env.images import check_orientation
from wmrl.embodied.env.suites import DEFAULT_SUITE, SUITE_MAX_STEPS, SUITE_NUM_TASKS, check_suite

__all__ = ["DEFAULT_CAMERAS", "LiberoEnvConfig", "parse_cameras"]

DEFAULT_CAMERAS: tuple[str, ...] = ("agentview", "robot0_eye_in_hand")
"""LIBERO's two cameras: the third-person view and the wrist camera."""

_MAX_IMAGE_SIDE = 2048


def parse_cameras(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Camera names from a comma-separated string or a sequence; ``"none"``/``""``/``None`` mean no camera."""
    if value is None:
        return ()
    if isinstance(value, str):
        if value.strip().lower() in ("", "none"):
            return ()
        value = value.split(",")
    return tuple(str(v).strip() for v in value)


@dataclass(frozen=True)
class LiberoEnvConfig:
    """How to build and run one LIBERO environment.

    Attributes:
        suite: ``libero_10`` (LIBERO-Long, default), ``libero_spatial``, ``libero_object``,
            ``libero_goal`` or ``libero_90``.
        task_id: task index within the suite (its default order).
        cameras: cameras to render, in observation order; ``()`` renders nothing (about 10x faster
            on a CPU). Each camera ``c`` yields the observation key ``f"{c}_image"``.
        image_height: rendered image height in pixels.
        image_width: rendered image width in pixels.
        orientation: ``"upright"`` (default), ``"rotate180"`` or ``"raw"``; see ``wmrl.embodied.env.images``.
        max_steps: policy steps before truncation; ``None`` uses the suite's standard value
            (``libero_10``: 520). Settle steps do not count.
        settle_steps: no-op steps (arm still, gripper open) after placing the initial state, so
            objects dropped into the scene come to rest before the policy acts (standard: 10).
        hard_reset: rebuild the MuJoCo model on every reset, as LIBERO's evaluation does.
            ``False`` reuses it (faster reset); episodes from the same initial state are still
            deterministic because the full simulator state is overwritten by the initial state.
        object_state: also return LIBERO's privileged ``object-state`` vector (object poses) in
            the observation. VLA policies do not use it.
        scene_state: also return the privileged scene (``scene/<name>/...`` keys: every object's and
            fixture's pose and collision box, every region site, articulated joints; see
            ``wmrl.embodied.env.scene_state``), which the scripted expert reads. VLA policies do not.
    """

    suite: str = DEFAULT_SUITE
    task_id: int = 0
    cameras: tuple[str, ...] = DEFAULT_CAMERAS
    image_height: int = 256
    image_width: int = 256
    orientation: str = "upright"
    max_steps: int | None = None
    settle_steps: int = 10
    hard_reset: bool = True
    object_state: bool = False
    scene_state: bool = False

    def __post_init__(self) -> None:
        check_suite(self.suite)
        _check_int("task_id", self.task_id, 0, SUITE_NUM_TASKS[self.suite] - 1)
        cameras = parse_cameras(self.cameras)
        if any(not c for c in cameras):
            raise ValueError(f"camera names must be non-empty; got {self.cameras!r}")
        if len(set(cameras)) != len(cameras):
            raise ValueError(f"cameras must not repeat; got {cameras!r}")
        object.__setattr__(self, "cameras", cameras)
        _check_int("image_height", self.image_height, 8, _MAX_IMAGE_SIDE)
        _check_int("image_width", self.image_width, 8, _MAX_IMAGE_SIDE)
        check_orientation(self.orientation)
        if self.max_steps is not None:
            _check_int("max_steps", self.max_steps, 1, 100_000)
        _check_int("settle_steps", self.settle_steps, 0, 10_000)
        if not isinstance(self.hard_reset, bool):
            raise ValueError(f"hard_reset must be a bool; got {self.hard_reset!r}")
        for name in ("object_state", "scene_state"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool; got {getattr(self, name)!r}")

    @property
    def episode_max_steps(self) -> int:
        """The policy-step limit in force: ``max_steps`` or the suite's standard value."""
        return self.max_steps if self.max_steps is not None else SUITE_MAX_STEPS[self.suite]

    @property
    def image_keys(self) -> tuple[str, ...]:
        """Observation keys of the rendered cameras, in camera order."""
        return tuple(f"{c}_image" for c in self.cameras)

    def replace(self, **changes: Any) -> LiberoEnvConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` reads back."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["cameras"] = list(self.cameras)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LiberoEnvConfig:
        """Build from a dict; unknown keys are rejected."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown LiberoEnvConfig keys: {sorted(unknown)}; known: {sorted(known)}")
        values = dict(data)
        if "cameras" in values:
            values["cameras"] = parse_cameras(values["cameras"])
        return cls(**values)


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}]; got {value!r}")
