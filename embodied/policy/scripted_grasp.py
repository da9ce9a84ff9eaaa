"""Geometry of the scripted expert's grasps: where to put the fingers, how to turn the hand,
how high to travel (see ``scripted_control``). Imports only numpy and scipy.

Frames: world coordinates in metres; rotation matrices ``(3, 3)``; the hand's quaternion in
robosuite's (x, y, z, w) order, as ``robot0_eef_quat`` reports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.spatial.transform import Rotation

__all__ = [
    "EMPTY_GAP",
    "POSITION_SCALE",
    "ROTATION_SCALE",
    "TIP_BELOW_EEF",
    "box_distance",
    "choose_grasp",
    "choose_place",
    "corridor_top",
    "finger_axis",
    "finger_gap",
    "fold_yaw",
    "grasp_candidates",
    "hand_orientation",
    "hand_yaw",
    "move_action",
    "rect_distance",
    "rotation_action",
    "scene_names",
    "scene_value",
    "yaw_of",
]

# OSC_POSE's output limits: an action of 1 moves the goal 5 cm / turns it 0.5 rad.
POSITION_SCALE = 0.05
ROTATION_SCALE = 0.5
# robosuite's Panda: the end-effector site sits this far above the fingertips (measured on both stacks).
TIP_BELOW_EEF = 0.011
# The start pose of every LIBERO scene: gripper pointing down, fingers closing along world y.
_DOWN = np.diag([1.0, -1.0, -1.0])


def scene_value(scene: Mapping[str, np.ndarray], name: str, field: str) -> np.ndarray:
    key = f"scene/{name}/{field}"
    if key not in scene:
        raise KeyError(f"the scene has no {key!r}: is scene_state on, and is {name!r} in this task?")
    return np.asarray(scene[key], dtype=np.float64)


def scene_names(scene: Mapping[str, np.ndarray], field: str) -> list[str]:
    return [
        k[len("scene/") : -len(field) - 1]
        for k in scene
        if k.startswith("scene/") and k.endswith("/" + field)
    ]


def rotation_action(current_quat_xyzw: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The axis-angle action ``(3,)`` that turns the hand from its orientation toward ``target`` (3x3)."""
    current = Rotation.from_quat(current_quat_xyzw).as_matrix()
    error = Rotation.from_matrix(target @ current.T).as_rotvec()  # world frame, as OSC applies it
    return np.clip(error / ROTATION_SCALE, -1.0, 1.0)


def hand_orientation(yaw: float) -> np.ndarray:
    """Pointing down, turned by ``yaw`` radians about world z from the start pose."""
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ _DOWN


_FINGER_REACH = 0.045  # an open fingertip's distance from the grasp centre, along the finger axis
_PAD_RADIUS = 0.012  # a fingertip's footprint
# The Panda hand above the fingers: its underside sits this far above the fingertips, and its
# footprint is a 20 x 6 cm rectangle along the finger axis.
_HAND_ABOVE_TIP = 0.065
_HAND_HALF_LENGTH = 0.10
_HAND_HALF_WIDTH = 0.03


def fold_yaw(yaw: float) -> float:
    """A yaw in [-pi/2, pi/2): the fingers are symmetric, so yaw and yaw + pi grasp alike."""
    return float((yaw + np.pi / 2) % np.pi - np.pi / 2)


def hand_yaw(quat_xyzw: np.ndarray) -> float:
    """The hand's yaw now (radians, as :func:`hand_orientation` measures it), from its quaternion."""
    fingers = Rotation.from_quat(np.asarray(quat_xyzw, dtype=np.float64)).as_matrix()[:2, 1]
    return float(np.arctan2(fingers[0], -fingers[1]))  # the fingers close along the hand's y axis


EMPTY_GAP = 0.003
"""Finger gap (metres, both fingers together) below which the hand holds nothing."""


def finger_gap(obs: Mapping[str, np.ndarray]) -> float:
    """How far apart the fingers are now (metres, ``robot0_gripper_qpos`` summed in magnitude)."""
    return float(np.sum(np.abs(obs["robot0_gripper_qpos"])))


def move_action(
    obs: Mapping[str, np.ndarray], goal: np.ndarray, yaw: float, grip: float, speed: float
) -> np.ndarray:
    """The action ``(7,)`` toward ``goal`` (at most ``speed`` per axis), turning the hand to ``yaw``,
    with the gripper command ``grip``."""
    eef = np.asarray(obs["robot0_eef_pos"], dtype=np.float64)
    position = np.clip((goal - eef) / POSITION_SCALE, -speed, speed)
    rotation = rotation_action(np.asarray(obs["robot0_eef_quat"], dtype=np.float64), hand_orientation(yaw))
    return np.concatenate([position, rotation, [grip]])


def finger_axis(yaw: float) -> np.ndarray:
    """The horizontal direction ``(2,)`` the fingers close along at ``yaw``."""
    return np.array([np.sin(yaw), -np.cos(yaw)])


def box_distance(point: np.ndarray, box: np.ndarray) -> float:
    """Horizontal distance from ``point`` (xy) to a box's footprint (0 inside)."""
    gap = np.maximum(np.maximum(box[:2] - point, point - box[3:5]), 0.0)
    return float(np.linalg.norm(gap))


# The widest object the open hand closes around (metres): wider ones are held by a wall.
_MAX_WHOLE_WIDTH = 0.07


def grasp_candidates(
    scene: Mapping[str, np.ndarray], name: str, ratio: float
) -> list[tuple[np.ndarray, float, float]]:
    """Grasps to consider, as (centre xy, yaw, fingertip depth below the grasped part's top).

    Around the whole object when it fits in the hand: across the narrow side of a box-like one
    (shifted along its long side, a little turned), at four yaws around a round one. Straddling
    one of its tallest walls when it does not fit (a mug), or when it has walls and nothing else.
    The first candidate is the plainest (centred, square)."""
    extent = scene_value(scene, name, "extent")
    mat = scene_value(scene, name, "mat").reshape(3, 3)
    box = scene_value(scene, name, "box")
    centre = np.array([(box[0] + box[3]) / 2, (box[1] + box[4]) / 2])
    a, b = np.argsort(np.abs(mat[2, :]))[:2]  # the object's two local axes closest to horizontal
    whole: list[tuple[np.ndarray, float, float]] = []
    if 2 * min(extent[a], extent[b]) <= _MAX_WHOLE_WIDTH:
        if max(extent[a], extent[b]) < ratio * min(extent[a], extent[b]):
            whole = [(centre, yaw, 0.0) for yaw in (0.0, np.pi / 4, -np.pi / 4, np.pi / 2)]
        else:
            narrow, long = (a, b) if extent[a] < extent[b] else (b, a)
            across = mat[:2, narrow] / max(np.linalg.norm(mat[:2, narrow]), 1e-9)
            along = mat[:2, long] / max(np.linalg.norm(mat[:2, long]), 1e-9)
            yaw = fold_yaw(float(np.arctan2(across[0], -across[1])))  # fingers along (sin yaw, -cos yaw)
            room = max(0.0, extent[long] - 0.015)
            shifts = sorted(np.linspace(-room, room, 7), key=abs) if room > 0 else [0.0]  # the centre first
            # slightly turned grasps still hold a box, and may clear a neighbour the square one hits
            whole = [
                (centre + s * along, fold_yaw(yaw + turn), 0.0) for s in shifts for turn in (0.0, 0.3, -0.3)
            ]
    return whole or _wall_candidates(scene, name)


def _wall_candidates(scene: Mapping[str, np.ndarray], name: str) -> list[tuple[np.ndarray, float, float]]:
    """Straddle one of the object's tallest walls: the fingers close across its thickness, one
    inside the object, one outside. Shorter plates (a mug's handle) are left alone."""
    plates = scene.get(f"scene/{name}/plates")
    if plates is None or len(plates) == 0:
        return []
    plates = np.asarray(plates, dtype=np.float64)
    # upright walls at least 2 cm tall (lying ones cannot be straddled from above)
    plates = plates[(plates[:, 8] > 0.9) & (plates[:, 10] >= 0.01)]
    if len(plates) == 0:
        return []
    top = float(scene_value(scene, name, "box")[5])
    tallest = plates[plates[:, 10] >= 0.8 * plates[:, 10].max()]
    out = []
    for row in tallest:
        normal = row[3:5] / max(np.linalg.norm(row[3:5]), 1e-9)
        plate_top = row[2] + row[10]
        out.append((row[:2].copy(), fold_yaw(float(np.arctan2(normal[0], -normal[1]))), top - plate_top))
    return out


def rect_distance(
    point: np.ndarray, axis: np.ndarray, half_length: float, half_width: float, box: np.ndarray
) -> float:
    """Horizontal distance between a rectangle (centre ``point``, long side along ``axis``) and a
    box's footprint, sampled along the rectangle's long side (0 when they overlap)."""
    normal = np.array([-axis[1], axis[0]])
    samples = [
        point + t * axis + u * normal
        for t in np.linspace(-half_length, half_length, 9)
        for u in (-half_width, 0.0, half_width)
    ]
    return min(box_distance(p, box) for p in samples)


def choose_grasp(
    scene: Mapping[str, np.ndarray],
    name: str,
    tip_z: float,
    ratio: float,
    avoid: Sequence[tuple[np.ndarray, float]] = (),
) -> tuple[np.ndarray, float, float]:
    """The candidate grasp (centre xy, yaw, depth of its part's top below the object's top) whose
    open fingertips (and hand, for taller neighbours) keep farthest from other objects (up to
    1.5 cm, enough), then the nearest to the robot's base, then the squarest and most central.
    Grasps in ``avoid`` (centre xy, yaw: ones that failed) come last: a retry tries another."""
    base = scene.get("scene/robot0_base/pos")
    base_xy = np.asarray(base, dtype=np.float64)[:2] if base is not None else None
    others = [scene_value(scene, other, "box") for other in scene_names(scene, "box") if other != name]
    finger_obstacles = [o for o in others if o[5] > tip_z + 0.005]
    hand_obstacles = [o for o in others if o[5] > tip_z + _HAND_ABOVE_TIP]
    candidates = grasp_candidates(scene, name, ratio)
    if not candidates:
        raise ValueError(f"no grasp for {name!r}: too wide for the hand and no wall to hold it by")
    best, best_score = candidates[0], -np.inf
    for centre, yaw, depth in candidates:
        axis = finger_axis(yaw)
        pads = [centre + sign * _FINGER_REACH * axis for sign in (-1.0, 1.0)]
        clearance = min(
            [box_distance(p, o) - _PAD_RADIUS for p in pads for o in finger_obstacles]
            + [rect_distance(centre, axis, _HAND_HALF_LENGTH, _HAND_HALF_WIDTH, o) for o in hand_obstacles],
            default=np.inf,
        )
        reach = float(np.linalg.norm(centre - base_xy)) if base_xy is not None else 0.0
        offset = float(np.linalg.norm(centre - candidates[0][0]))
        turn = abs(fold_yaw(yaw - candidates[0][1]))
        score = 10.0 * min(clearance, 0.015) - reach - 0.01 * turn - 0.1 * offset
        if any(np.linalg.norm(centre - c) < 0.01 and abs(fold_yaw(yaw - y)) < 0.2 for c, y in avoid):
            score -= 10.0
        if score > best_score:
            best, best_score = (centre, yaw, depth), score
    return best


def yaw_of(mat: np.ndarray) -> float:
    """An object's heading about world z (radians), from its rotation matrix ``(3, 3)``."""
    return float(np.arctan2(mat[1, 0], mat[0, 0]))


def corridor_top(
    scene: Mapping[str, np.ndarray], start: np.ndarray, end: np.ndarray, skip: set[str]
) -> float:
    """The highest top of any object or fixture box within 6 cm of the straight path start→end (xy)."""
    top = -np.inf
    points = np.linspace(start[:2], end[:2], 25)
    for name in scene_names(scene, "box"):
        if name in skip:
            continue
        box = scene_value(scene, name, "box")
        lo, hi = box[:2] - 0.06, box[3:5] + 0.06
        if np.any(np.all((points >= lo) & (points <= hi), axis=1)):
            top = max(top, float(box[5]))
    return top


def choose_place(
    scene: Mapping[str, np.ndarray], centre: np.ndarray, half: np.ndarray, carried: str, radius: float
) -> np.ndarray:
    """Where in a region (``centre`` xy, half sizes ``half`` xy, axis-aligned) to set down an object
    of footprint ``radius``: the point farthest from the objects already standing in it (enough:
    its radius plus 2 cm), then the most central; 1 cm inside the region's border."""
    margin = np.maximum(half - 0.01, 0.0)
    grid = [centre + np.array([u, v]) * margin for u in np.linspace(-1, 1, 9) for v in np.linspace(-1, 1, 9)]
    # objects standing in or near the region (not the carried one, not a fixture the region lies on)
    near = []
    for name in scene_names(scene, "box"):
        box = scene_value(scene, name, "box")
        if name == carried or (
            np.all(box[:2] <= centre) and np.all(box[3:5] >= centre) and box[3] - box[0] > 0.2
        ):
            continue
        if np.all(box[:2] < centre + half + radius) and np.all(box[3:5] > centre - half - radius):
            near.append(box)
    best, best_score = centre, -np.inf
    for point in grid:
        clearance = min((box_distance(point, box) for box in near), default=np.inf)
        score = 10.0 * min(clearance, radius + 0.02) - float(np.linalg.norm(point - centre))
        if score > best_score:
            best, best_score = point, score
    return np.asarray(best)
