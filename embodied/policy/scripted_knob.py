"""Turn a knob on (LIBERO's ``TurnOn``): grip it from above and twist the wrist about its axis.

A knob is an articulated fixture whose hinge stands upright (the flat stove's burner knob). The
hand descends over the hinge's anchor, closes, and turns its yaw by ``twist`` radians in the
positive sense of the joint (LIBERO's stove is on from +0.5 rad), watching the joint: it is done
when the joint has turned by ``target`` radians. If the fingers close on nothing, or the joint does
not follow, it lets go and tries the other grip (a quarter turn around), ``max_attempts`` in all.
Imports only numpy and scipy (see ``scripted_control``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from wmrl.embodied.policy.scripted_grasp import (
    EMPTY_GAP,
    TIP_BELOW_EEF,
    finger_gap,
    fold_yaw,
    hand_yaw,
    move_action,
    scene_value,
)

__all__ = ["TurnKnob"]


class TurnKnob:
    """Turn ``fixture``'s upright hinge by ``target`` radians (positive sense).

    Args:
        fixture: the articulated object (``flat_stove_1``).
        target: how far the joint must turn (radians).
        twist: how far the wrist turns while gripping (radians; more than ``target``: the grip slips).
        grip_depth: how far below the knob's top the fingertips close (metres).
        max_attempts: grips tried.
        phase_steps: steps a phase may take.
    """

    def __init__(
        self,
        fixture: str,
        target: float = 0.8,
        twist: float = 1.2,
        grip_depth: float = 0.02,
        max_attempts: int = 4,
        phase_steps: int = 60,
    ) -> None:
        self.obj = fixture
        self.relation, self.target = "turnon", fixture
        self.turn_target, self.twist, self.grip_depth = target, twist, grip_depth
        self.max_attempts, self.phase_steps = max_attempts, phase_steps
        self.phase = "approach"
        self.steps_in_phase = 0
        self.attempts = 1
        self.failed = False
        self.reason: str | None = None
        self._yaw = 0.0
        self._start_qpos: float | None = None
        self._hold: np.ndarray | None = None

    def _joint(self, scene: Mapping[str, np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
        """The upright joint's position (radians), anchor ``(3,)`` and moving part's box ``(6,)``."""
        frames = scene_value(scene, self.obj, "joint_frames")
        upright = np.flatnonzero(np.abs(frames[:, 5]) > 0.9)
        if len(upright) == 0:
            raise ValueError(f"{self.obj} has no upright hinge to turn")
        j = int(upright[0])
        qpos = float(scene_value(scene, self.obj, "joints")[j]) * float(np.sign(frames[j, 5]))
        return qpos, frames[j, :3], scene_value(scene, self.obj, "joint_boxes")[j]

    def holds(self, scene: Mapping[str, np.ndarray]) -> bool:
        """Whether the knob has turned by ``target`` since the episode's first look at it."""
        qpos, _, _ = self._joint(scene)
        start = self._start_qpos if self._start_qpos is not None else 0.0
        return qpos - start >= self.turn_target

    def _enter(self, phase: str) -> None:
        self.phase, self.steps_in_phase = phase, 0

    def _move(
        self, obs: Mapping[str, np.ndarray], goal: np.ndarray, yaw: float, grip: float, speed: float = 0.6
    ) -> np.ndarray:
        return move_action(obs, goal, yaw, grip, speed)

    def _other_grip(self) -> None:
        if self.attempts >= self.max_attempts:
            self.failed, self.reason = True, f"{self.attempts} grips did not turn the knob"
            self._enter("done")
            return
        self.attempts += 1
        self._yaw = fold_yaw(self._yaw + np.pi / 2)
        self._enter("let_go")

    def act(self, obs: Mapping[str, np.ndarray], scene: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """The next action ``(7,)``, or ``None`` when the knob is on (or every grip failed)."""
        if self.phase == "done":
            return None
        try:
            qpos, anchor, part = self._joint(scene)
        except (KeyError, ValueError) as exc:
            self.failed, self.reason = True, str(exc)
            self._enter("done")
            return None
        if self._start_qpos is None:
            self._start_qpos = qpos
        self.steps_in_phase += 1
        now = _KnobNow(
            obs=obs,
            scene=scene,
            eef=np.asarray(obs["robot0_eef_pos"], dtype=np.float64),
            above=np.array([anchor[0], anchor[1], part[5] + 0.08 + TIP_BELOW_EEF]),
            grip_at=np.array([anchor[0], anchor[1], part[5] - self.grip_depth + TIP_BELOW_EEF]),
            timed_out=self.steps_in_phase > self.phase_steps,
        )
        return getattr(self, f"_{self.phase}")(now)

    def _approach(self, now: _KnobNow) -> np.ndarray:
        if np.linalg.norm(now.above - now.eef) < 0.015 or now.timed_out:
            self._enter("descend")
        return self._move(now.obs, now.above, self._yaw, -1.0, speed=1.0)

    def _descend(self, now: _KnobNow) -> np.ndarray:
        if np.linalg.norm(now.grip_at - now.eef) < 0.006 or now.timed_out:
            self._enter("close")
        return self._move(now.obs, now.grip_at, self._yaw, -1.0, speed=0.4)

    def _close(self, now: _KnobNow) -> np.ndarray:
        if self.steps_in_phase >= 12:
            if finger_gap(now.obs) > EMPTY_GAP:
                self._hold = now.eef.copy()
                self._enter("twist")
            else:  # shut on nothing
                self._other_grip()
        return self._move(now.obs, now.eef, self._yaw, 1.0)

    def _twist(self, now: _KnobNow) -> np.ndarray:
        yaw = self._yaw + min(self.twist, 0.05 * self.steps_in_phase)
        if self.holds(now.scene):
            self._enter("release")
        elif self.steps_in_phase > self.twist / 0.05 + 10 or now.timed_out:
            self._other_grip()  # the knob did not follow: grip it another way
        return self._move(now.obs, self._hold if self._hold is not None else now.eef, yaw, 1.0)

    def _release(self, now: _KnobNow) -> np.ndarray:
        if self.steps_in_phase >= 8:
            self._enter("rise")
        return self._move(now.obs, now.eef, hand_yaw(now.obs["robot0_eef_quat"]), -1.0)

    def _let_go(self, now: _KnobNow) -> np.ndarray:
        if self.steps_in_phase >= 8:
            self._enter("approach_again")
        return self._move(now.obs, now.eef, hand_yaw(now.obs["robot0_eef_quat"]), -1.0)

    def _rise(self, now: _KnobNow) -> np.ndarray:
        return self._up(now, then="done")

    def _approach_again(self, now: _KnobNow) -> np.ndarray:
        return self._up(now, then="approach")

    def _up(self, now: _KnobNow, then: str) -> np.ndarray:
        if now.eef[2] >= now.above[2] - 0.02 or now.timed_out:
            self._enter(then)
        return self._move(
            now.obs,
            np.array([now.eef[0], now.eef[1], now.above[2]]),
            hand_yaw(now.obs["robot0_eef_quat"]),
            -1.0,
        )


class _KnobNow(NamedTuple):
    """What one step of turning a knob reads."""

    obs: Mapping[str, np.ndarray]
    scene: Mapping[str, np.ndarray]
    eef: np.ndarray  # (3,) end-effector position, metres
    above: np.ndarray  # (3,) the hand's waypoint above the knob
    grip_at: np.ndarray  # (3,) where the hand grips it
    timed_out: bool
