"""A privileged, closed-loop scripted controller for LIBERO pick-and-place goals.

It reads the scene (``wmrl.embodied.env.scene_state``: object poses and collision boxes, region
sites) and the robot's proprioception, and emits the 7-D actions a VLA emits (end-effector
position and axis-angle deltas in [-1, 1], which robosuite's OSC_POSE controller scales to at most
5 cm and 0.5 rad per step; gripper -1 = open, +1 = close). Every step recomputes its target from
the scene, so it corrects for objects that slip or are pushed: it is closed loop, not a replay.

Each ``In``/``On`` predicate of the task's BDDL goal becomes one pick-and-place, run in goal order:
approach above the object with the fingers across its narrow side, descend, close, lift until the
object clears everything on the way, carry its *body origin* (the point LIBERO's predicates test)
over the target, lower until it is seated or stops, open, retreat. A grasp that fails (the
fingers close on nothing, the object stays behind) is retried from the approach, at most
``max_attempts`` times. Predicates that need articulation (``TurnOn``, ``Open``, ``Close``) are not
scripted: :attr:`ScriptedController.unsupported` names them, and the controller then holds still
once its pick-and-places are done.

Like ``scene_state``, this module and ``scripted_grasp`` import only numpy and scipy (and each
other), so the same code drives upstream robosuite-1.4 LIBERO in the parity benchmark, where
WMRL is installed without its dependencies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from wmrl.embodied.policy.scripted_grasp import (
    EMPTY_GAP,
    TIP_BELOW_EEF,
    choose_grasp,
    choose_place,
    corridor_top,
    finger_gap,
    fold_yaw,
    hand_yaw,
    move_action,
    scene_value,
    yaw_of,
)
from wmrl.embodied.policy.scripted_knob import TurnKnob

__all__ = [
    "PICK_PLACE_PREDICATES",
    "SUPPORTED_PREDICATES",
    "ExpertConfig",
    "PickPlace",
    "ScriptedController",
    "config_from_dict",
]

PICK_PLACE_PREDICATES = frozenset({"in", "on"})
SUPPORTED_PREDICATES = PICK_PLACE_PREDICATES | {"turnon"}


@dataclass(frozen=True)
class ExpertConfig:
    """How the scripted controller moves (lengths in metres, speeds in action units per step).

    Attributes:
        speed: the largest position action while the hand is empty.
        carry_speed: the largest position action while carrying (objects slip when jerked).
        lower_speed: the largest downward action when descending to grasp or to place.
        tolerance: distance to a waypoint that counts as reached.
        grasp_depth: how far below an object's top the fingertips close (capped by its height).
        clearance: how far a carried object's bottom stays above everything on its way.
        hover: height of the fingertips above an object's top before descending to it.
        close_steps: steps the gripper closes before lifting; ``open_steps`` before retreating.
        phase_steps: steps a phase may take before the controller moves on (or retries).
        max_attempts: grasps tried per pick-and-place before giving up on it.
        narrow_ratio: an object whose horizontal half sizes differ by more than this factor is
            grasped across its narrow side; a rounder one keeps the current yaw.
    """

    speed: float = 1.0
    carry_speed: float = 0.6
    lower_speed: float = 0.4
    tolerance: float = 0.008
    grasp_depth: float = 0.035
    clearance: float = 0.04
    hover: float = 0.08
    close_steps: int = 12
    open_steps: int = 10
    phase_steps: int = 80
    max_attempts: int = 3
    narrow_ratio: float = 1.15

    def __post_init__(self) -> None:
        for name in ("speed", "carry_speed", "lower_speed"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]; got {value!r}")
        for name in ("tolerance", "grasp_depth", "clearance", "hover"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be > 0; got {getattr(self, name)!r}")
        for name in ("close_steps", "open_steps", "phase_steps", "max_attempts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if not self.narrow_ratio >= 1.0:
            raise ValueError(f"narrow_ratio must be >= 1; got {self.narrow_ratio!r}")


class PickPlace:
    """Move ``obj`` so that LIBERO's ``relation(obj, target)`` holds (``relation`` is ``in`` or ``on``).

    ``act`` returns the next action, or ``None`` once the object has been released and the hand
    has retreated (or every attempt failed: :attr:`failed`).
    """

    def __init__(self, relation: str, obj: str, target: str, config: ExpertConfig) -> None:
        if relation not in PICK_PLACE_PREDICATES:
            raise ValueError(f"PickPlace handles {sorted(PICK_PLACE_PREDICATES)}; got {relation!r}")
        self.relation, self.obj, self.target, self.config = relation, obj, target, config
        self.phase = "approach"
        self.steps_in_phase = 0
        self.attempts = 1
        self.failed = False
        self.reason: str | None = None
        self._yaw: float | None = None
        self._grasp_local: np.ndarray | None = None
        self._yaw_offset = 0.0
        self._part_depth = 0.0
        self._place_xy: np.ndarray | None = None
        self._failed_grasps: list[tuple[np.ndarray, float]] = []
        self._carry_z: float | None = None
        self._last_z: list[float] = []

    # -- geometry -----------------------------------------------------------------------------
    def _target_point(self, scene: Mapping[str, np.ndarray]) -> tuple[np.ndarray, float]:
        """Where the object's body origin goes (xy) and the lowest its bottom should reach (z)."""
        if f"scene/{self.target}/size" in scene:  # a region site
            centre, size = scene_value(scene, self.target, "pos"), scene_value(scene, self.target, "size")
            mat = scene_value(scene, self.target, "mat").reshape(3, 3)
            half = np.abs(mat @ size)
            if self._place_xy is None:  # chosen once per attempt, clear of what already stands there
                box = scene_value(scene, self.obj, "box")
                radius = float(max(box[3] - box[0], box[4] - box[1])) / 2
                self._place_xy = choose_place(scene, centre[:2], half[:2], self.obj, radius)
            return self._place_xy, float(centre[2] - half[2])
        box = scene_value(scene, self.target, "box")
        return scene_value(scene, self.target, "pos")[:2], float(box[5])

    def _grasp_point(self, scene: Mapping[str, np.ndarray]) -> np.ndarray:
        """End-effector position ``(3,)`` that closes the fingertips around the object's upper part
        (or around one of its walls).

        The grasp is chosen once per attempt and then follows the object (kept in its frame), so
        an object nudged on the way down is still grasped where it was planned."""
        box = scene_value(scene, self.obj, "box")
        pos, mat = scene_value(scene, self.obj, "pos"), scene_value(scene, self.obj, "mat").reshape(3, 3)
        if self._grasp_local is None:
            rough_tip = max(float(box[2]) + 0.006, float(box[5]) - self.config.grasp_depth)
            try:
                avoid = [
                    ((pos + mat @ local)[:2], yaw_of(mat) + offset) for local, offset in self._failed_grasps
                ]
                centre, yaw, part_depth = choose_grasp(
                    scene, self.obj, rough_tip, self.config.narrow_ratio, avoid=avoid
                )
            except ValueError as exc:  # nothing to hold it by: give this goal up, never the episode
                self.failed, self.reason = True, str(exc)
                raise _GiveUp from exc
            self._grasp_local = mat.T @ (np.array([centre[0], centre[1], pos[2]]) - pos)
            self._yaw_offset = yaw - yaw_of(mat)
            self._part_depth = part_depth
        tip_z = max(float(box[2]) + 0.006, float(box[5]) - self._part_depth - self.config.grasp_depth)
        centre = pos + mat @ self._grasp_local
        self._yaw = fold_yaw(yaw_of(mat) + self._yaw_offset)
        return np.array([centre[0], centre[1], tip_z + TIP_BELOW_EEF])

    def holds(self, scene: Mapping[str, np.ndarray]) -> bool:
        """Whether the predicate holds now, by LIBERO's geometric tests (contacts not checked)."""
        obj = scene_value(scene, self.obj, "pos")
        if f"scene/{self.target}/size" in scene:  # a region site: In = in_box, On = under
            centre, size = scene_value(scene, self.target, "pos"), scene_value(scene, self.target, "size")
            mat = scene_value(scene, self.target, "mat").reshape(3, 3)
            if self.relation == "in":
                half = np.abs(mat @ size)
                low, high = centre - half, centre + half
                low[2] -= 0.01
                return bool(np.all(obj > low) and np.all(obj < high))
            delta = mat @ (obj - centre)
            return bool(size[2] - 0.005 < delta[2] < size[2] + 0.10 and np.all(np.abs(delta[:2]) < size[:2]))
        target = scene_value(scene, self.target, "pos")
        return bool(obj[2] >= target[2] and np.linalg.norm(obj[:2] - target[:2]) < 0.03)

    # -- phases --------------------------------------------------------------------------------
    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.steps_in_phase = 0
        self._last_z = []

    def _retry(self, grasp_failed: bool = True) -> None:
        if grasp_failed and self._grasp_local is not None:  # not this grasp again: the next best one
            self._failed_grasps.append((self._grasp_local.copy(), self._yaw_offset))
        if self.attempts >= self.config.max_attempts:
            self.failed, self.reason = True, f"{self.attempts} attempts failed"
            self._enter("done")
            return
        self.attempts += 1
        self._grasp_local = None  # plan the next grasp afresh
        self._place_xy = None
        self._enter("retreat_empty")

    def _move(self, now: _Now, goal: np.ndarray, speed: float, grip: float) -> np.ndarray:
        """Toward ``goal`` at most ``speed`` per axis, turning the hand to the planned yaw."""
        return move_action(now.obs, goal, self._yaw or 0.0, grip, speed)

    def _yaw_error(self, quat: np.ndarray) -> float:
        """Radians between the hand's yaw and the planned one (fingers are symmetric: mod pi)."""
        return fold_yaw(hand_yaw(quat) - (self._yaw or 0.0))

    def _stalled(self, z: float) -> bool:
        """True when the hand has stopped descending for 4 steps (it rests on something)."""
        self._last_z.append(z)
        return len(self._last_z) >= 5 and self._last_z[-5] - z < 0.002

    def act(self, obs: Mapping[str, np.ndarray], scene: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """The next action ``(7,)``, or ``None`` when this pick-and-place is over."""
        if self.phase == "done":
            return None
        self.steps_in_phase += 1
        now = _Now(
            obs=obs,
            scene=scene,
            eef=np.asarray(obs["robot0_eef_pos"], dtype=np.float64),
            quat=np.asarray(obs["robot0_eef_quat"], dtype=np.float64),
            box=scene_value(scene, self.obj, "box"),
            obj_pos=scene_value(scene, self.obj, "pos"),
            timed_out=self.steps_in_phase > self.config.phase_steps,
        )
        try:
            return getattr(self, f"_{self.phase}")(now)
        except _GiveUp:
            self._enter("done")
            return None

    def _approach(self, now: _Now) -> np.ndarray:
        # travel above everything between here and the object, then go straight down
        cfg, eef = self.config, now.eef
        grasp = self._grasp_point(now.scene)
        path_top = corridor_top(now.scene, eef, grasp, {self.obj})
        transit = max(now.box[5] + cfg.hover, path_top + cfg.clearance) + TIP_BELOW_EEF
        above = np.array([grasp[0], grasp[1], transit])
        xy_far = np.linalg.norm(above[:2] - eef[:2]) > 2 * cfg.tolerance
        goal = np.array([eef[0], eef[1], transit]) if eef[2] < transit - 0.02 and xy_far else above
        if (not xy_far and abs(self._yaw_error(now.quat)) < 0.05) or now.timed_out:
            self._enter("descend")
        return self._move(now, goal, cfg.speed, -1.0)

    def _descend(self, now: _Now) -> np.ndarray:
        grasp = self._grasp_point(now.scene)
        action = self._move(now, grasp, self.config.lower_speed, -1.0)
        if (
            np.linalg.norm(grasp - now.eef) < self.config.tolerance
            or self._stalled(now.eef[2])
            or now.timed_out
        ):
            self._enter("close")
        return action

    def _close(self, now: _Now) -> np.ndarray:
        if self.steps_in_phase >= self.config.close_steps:
            if finger_gap(now.obs) > EMPTY_GAP:
                self._enter("lift")
            else:  # fully shut: nothing in the hand
                self._retry()
        return self._move(now, now.eef, self.config.speed, 1.0)

    def _lift(self, now: _Now) -> np.ndarray:
        cfg, eef = self.config, now.eef
        target_xy, _ = self._target_point(now.scene)
        path_top = corridor_top(now.scene, eef, target_xy, {self.obj, self.target})
        target_box = now.scene.get(f"scene/{self.target}/box")
        target_top = float(target_box[5]) if target_box is not None else -np.inf
        hang = eef[2] - now.box[2]  # how far the object's bottom hangs below the hand
        self._carry_z = max(path_top, target_top) + cfg.clearance + hang
        goal = np.array([eef[0], eef[1], self._carry_z])
        if self.steps_in_phase > 5 and _lost(now):
            self._retry()
        elif eef[2] > self._carry_z - 2 * cfg.tolerance or now.timed_out:
            self._enter("carry")
        return self._move(now, goal, cfg.carry_speed, 1.0)

    def _carry(self, now: _Now) -> np.ndarray:
        goal = self._place_goal(now, self._carry_z or now.eef[2])
        if _lost(now):
            self._retry()
        elif np.linalg.norm(goal[:2] - now.eef[:2]) < self.config.tolerance or now.timed_out:
            self._enter("lower")
        return self._move(now, goal, self.config.carry_speed, 1.0)

    def _lower(self, now: _Now) -> np.ndarray:
        _, floor = self._target_point(now.scene)
        hang = now.eef[2] - now.box[2]
        goal = self._place_goal(now, floor + 0.01 + hang)
        action = self._move(now, goal, self.config.lower_speed, 1.0)
        if abs(goal[2] - now.eef[2]) < self.config.tolerance or self._stalled(now.eef[2]) or now.timed_out:
            self._enter("release")
        return action

    def _release(self, now: _Now) -> np.ndarray:
        if self.steps_in_phase >= self.config.open_steps:
            self._enter("retreat")
        return self._move(now, now.eef, self.config.speed, -1.0)

    def _retreat(self, now: _Now) -> np.ndarray:
        goal = self._retreat_goal(now)
        if goal[2] - now.eef[2] < 2 * self.config.tolerance or now.timed_out:
            if self.holds(now.scene):
                self._enter("done")
            else:  # it bounced or tipped out of place: pick it up again (the grasp was fine)
                self._retry(grasp_failed=False)
        return self._move(now, goal, self.config.speed, -1.0)

    def _retreat_empty(self, now: _Now) -> np.ndarray:
        goal = self._retreat_goal(now)
        if goal[2] - now.eef[2] < 2 * self.config.tolerance or now.timed_out:
            self._enter("approach")
        return self._move(now, goal, self.config.speed, -1.0)

    def _retreat_goal(self, now: _Now) -> np.ndarray:
        return np.array(
            [now.eef[0], now.eef[1], max(now.eef[2], now.box[5] + self.config.hover + TIP_BELOW_EEF)]
        )

    def _place_goal(self, now: _Now, z: float) -> np.ndarray:
        """The hand position that puts the object's body origin (not the hand) over the target."""
        target_xy, _ = self._target_point(now.scene)
        offset = now.obj_pos[:2] - now.eef[:2]
        return np.array([target_xy[0] - offset[0], target_xy[1] - offset[1], z])


class _GiveUp(Exception):
    """Raised inside a phase when the pick-and-place cannot go on (``PickPlace.reason`` says why)."""


class _Now(NamedTuple):
    """What one step of a pick-and-place reads."""

    obs: Mapping[str, np.ndarray]
    scene: Mapping[str, np.ndarray]
    eef: np.ndarray  # (3,) end-effector position, metres
    quat: np.ndarray  # (4,) its orientation, (x, y, z, w)
    box: np.ndarray  # (6,) the object's world box
    obj_pos: np.ndarray  # (3,) the object's body origin
    timed_out: bool


def _lost(now: _Now) -> bool:
    """True when the hand is shut on nothing or the object is no longer at the fingertips."""
    eef, box = now.eef, now.box
    tip_z = eef[2] - TIP_BELOW_EEF
    inside_xy = np.all(eef[:2] > box[:2] - 0.03) and np.all(eef[:2] < box[3:5] + 0.03)
    inside_z = box[2] - 0.03 < tip_z < box[5] + 0.03
    return finger_gap(now.obs) < EMPTY_GAP or not (inside_xy and inside_z)


class ScriptedController:
    """Solve a LIBERO goal (its BDDL predicates) one pick-and-place at a time.

    Args:
        goal: the task's goal predicates as LIBERO parses them, e.g.
            ``[["in", "alphabet_soup_1", "basket_1_contain_region"], ...]``.
        config: motion settings.
    """

    def __init__(self, goal: Sequence[Sequence[str]], config: ExpertConfig | None = None) -> None:
        self.config = config or ExpertConfig()
        self.goal = [tuple(str(x) for x in p) for p in goal]
        if not self.goal:
            raise ValueError("the goal has no predicates")
        self.unsupported = [p for p in self.goal if p[0].lower() not in SUPPORTED_PREDICATES]
        # objects first, articulation after: a knob or a door is worked once nothing is carried past it
        supported = [p for p in self.goal if p[0].lower() in SUPPORTED_PREDICATES]
        self._pending = sorted(supported, key=lambda p: p[0].lower() not in PICK_PLACE_PREDICATES)
        self._current: PickPlace | TurnKnob | None = None
        self.finished: list[tuple[tuple[str, ...], bool]] = []

    def reset(self) -> None:
        """Start a new episode with the same goal."""
        self.__init__(self.goal, self.config)  # type: ignore[misc]

    @property
    def gave_up(self) -> bool:
        """A pick-and-place failed every attempt: the goal is out of this controller's reach (its later
        actions hold still or go on to other predicates, and are no demonstration of the task)."""
        return any(not ok for _, ok in self.finished) or bool(
            self._current is not None and self._current.failed
        )

    @property
    def phase(self) -> str:
        """What the controller is doing now (``"<predicate>: <phase>"``, or ``"idle"``)."""
        if self._current is None:
            return "idle"
        return f"{' '.join((self._current.relation, self._current.obj, self._current.target))}: {self._current.phase}"

    def act(self, obs: Mapping[str, np.ndarray], scene: Mapping[str, np.ndarray]) -> np.ndarray:
        """The next action ``(7,)`` (``float32``), from the observation's proprioception and the scene."""
        while True:
            if self._current is None:
                if not self._pending:
                    return np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)  # nothing left: hold still
                predicate = self._pending.pop(0)
                if predicate[0].lower() == "turnon":
                    self._current = TurnKnob(predicate[1])
                else:
                    relation, obj, target = predicate
                    self._current = PickPlace(relation.lower(), obj, target, self.config)
            action = self._current.act(obs, scene)
            if action is not None:
                return np.clip(action, -1.0, 1.0).astype(np.float32)
            done = self._current
            self.finished.append(((done.relation, done.obj, done.target), not done.failed))
            self._current = None


def config_from_dict(data: Mapping[str, object]) -> ExpertConfig:
    """An :class:`ExpertConfig` from a mapping; unknown keys are refused."""
    known = {f.name for f in dataclasses.fields(ExpertConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown ExpertConfig keys {sorted(unknown)}; known: {sorted(known)}")
    return ExpertConfig(**data)  # type: ignore[arg-type]
