"""The privileged scene of a LIBERO episode as plain arrays: what a scripted expert reads.

This module imports only numpy (and reads a LIBERO problem environment by duck typing), so the
same file runs on our robosuite-1.5 port and on upstream robosuite-1.4 LIBERO, where no ``wmrl``
is installed (``benchmarks/embodied_expert_parity.py`` loads it by path there).

Keys of :func:`read_scene`'s dict (all ``float64``, metres and rotation matrices in the world frame):

* ``scene/<object>/pos`` ``(3,)``: the body origin of each object and fixture, the point LIBERO's
  ``In``/``On`` predicates test;
* ``scene/<object>/mat`` ``(9,)``: its rotation matrix, row-major;
* ``scene/<object>/box`` ``(6,)``: the world-frame axis-aligned box (min xyz, max xyz) around its
  collision geoms (child bodies included: a drawer moves with its joint);
* ``scene/<object>/extent`` ``(3,)``: the half sizes of the same geoms' box in the object's own
  frame (a box-shaped object's narrow side is its smallest horizontal half size);
* ``scene/<object>/plates`` ``(P, 11)``: the thin box geoms among those (a mug's walls, a handle),
  each as centre xyz (3), the unit normal of its thin side (3), the unit axis of its other two
  closest to vertical (3, pointing up), its half thickness and its half size along that axis:
  where fingers can straddle a wall (omitted for objects without any; ``P`` is fixed per object);
* ``scene/<object>/joints`` ``(J,)``: joint positions of an articulated object (radians or metres);
* ``scene/<object>/joint_frames`` ``(J, 6)``: each such joint's anchor (3) and unit axis (3);
* ``scene/<object>/joint_boxes`` ``(J, 6)``: the box around the part each joint moves (a knob, a drawer);
* ``scene/robot0_base/pos`` ``(3,)``: the robot's base;
* ``scene/<site>/pos``, ``scene/<site>/mat``, ``scene/<site>/size`` ``(3,)``: every region site
  (LIBERO's ``SiteObject``/``TargetZone``: ``basket_1_contain_region``, ``flat_stove_1_cook_region``),
  with the half sizes its ``in_box``/``under`` checks use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SCENE_PREFIX", "read_scene"]

SCENE_PREFIX = "scene/"

# The 8 corners of a unit box, as signs of its half sizes.
_CORNERS = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=np.float64)


def _raw_model_data(sim: Any) -> tuple[Any, Any]:
    """The raw ``mujoco.MjModel``/``MjData`` behind robosuite's binding wrappers (both versions)."""
    model = getattr(sim.model, "_model", sim.model)
    data = getattr(sim.data, "_data", sim.data)
    return model, data


def _collision_geoms(model: Any, root_body: int) -> np.ndarray:
    """Indices of the collision geoms of every body under ``root_body`` (robosuite: group 0, contype set)."""
    geom_body = np.asarray(model.geom_bodyid)
    bodies = np.flatnonzero(_descends_from(model, root_body))
    in_object = np.isin(geom_body, bodies)
    collides = (np.asarray(model.geom_contype) != 0) | (np.asarray(model.geom_conaffinity) != 0)
    return np.flatnonzero(in_object & collides)


def _descends_from(model: Any, root_body: int) -> np.ndarray:
    """Boolean mask ``(nbody,)`` of the bodies in ``root_body``'s subtree (itself included)."""
    parent = np.asarray(model.body_parentid)
    mask = np.zeros(len(parent), dtype=bool)
    mask[root_body] = True
    # Bodies are numbered so that a parent precedes its children (MuJoCo's tree order).
    for body in range(root_body + 1, len(parent)):
        mask[body] = mask[parent[body]]
    return mask


def _geom_corners(model: Any, data: Any, geoms: np.ndarray) -> np.ndarray:
    """World positions ``(8 * G, 3)`` of the corners of each geom's local bounding box."""
    aabb = np.asarray(model.geom_aabb)[geoms]  # (G, 6): centre (3) and half sizes (3), geom frame
    centre, half = aabb[:, None, :3], aabb[:, None, 3:]
    local = centre + _CORNERS[None] * half  # (G, 8, 3)
    rot = np.asarray(data.geom_xmat)[geoms].reshape(-1, 3, 3)
    pos = np.asarray(data.geom_xpos)[geoms]
    world = np.einsum("gij,gkj->gki", rot, local) + pos[:, None, :]
    return world.reshape(-1, 3)


# A plate: a box geom at most this thick (half size, metres).
_PLATE_HALF_THICKNESS = 0.006
_BOX_GEOM = 6  # mujoco.mjtGeom.mjGEOM_BOX


def _plates(model: Any, data: Any, geoms: np.ndarray) -> np.ndarray:
    """The thin box geoms among ``geoms`` as rows: centre (3), the unit normal of the thin side (3),
    the unit axis of the other two that is closest to vertical now (3), half thickness, half size
    along that axis. Which geoms are plates depends on their sizes only, so an object has the same
    number of rows in every pose; ``(0, 11)`` when it has none."""
    rows = []
    for g in geoms:
        if int(model.geom_type[g]) != _BOX_GEOM:
            continue
        size = np.asarray(model.geom_size[g], dtype=np.float64)
        thin = int(np.argmin(size))
        if size[thin] > _PLATE_HALF_THICKNESS:
            continue
        rot = np.asarray(data.geom_xmat[g], dtype=np.float64).reshape(3, 3)
        up = max((a for a in range(3) if a != thin), key=lambda a: abs(rot[2, a]))
        axis = rot[:, up] * np.sign(rot[2, up] or 1.0)
        rows.append([*data.geom_xpos[g], *rot[:, thin], *axis, size[thin], size[up]])
    return np.array(rows, dtype=np.float64).reshape(-1, 11)


def _is_scalar_joint(problem_env: Any, joint: str) -> bool:
    """A hinge or a slide (one coordinate), not a free joint."""
    return not isinstance(problem_env.sim.model.get_joint_qpos_addr(joint), tuple)


def read_scene(problem_env: Any) -> dict[str, np.ndarray]:
    """Every object's, fixture's and region's pose and extent now (see the module docstring for keys).

    Args:
        problem_env: LIBERO's problem environment (``ControlEnv.env``: it has ``sim``,
            ``objects_dict``, ``fixtures_dict``, ``obj_body_id`` and ``object_sites_dict``).
    """
    model, data = _raw_model_data(problem_env.sim)
    out: dict[str, np.ndarray] = {}
    names = list(problem_env.objects_dict) + list(problem_env.fixtures_dict)
    for name in names:
        body = int(problem_env.obj_body_id[name])
        pos = np.array(data.xpos[body], dtype=np.float64)
        mat = np.array(data.xmat[body], dtype=np.float64).reshape(3, 3)
        geoms = _collision_geoms(model, body)
        if len(geoms):
            corners = _geom_corners(model, data, geoms)
            box = np.concatenate([corners.min(0), corners.max(0)])
            local = (corners - pos) @ mat  # corners in the object's frame
            extent = (local.max(0) - local.min(0)) / 2.0
        else:
            box = np.concatenate([pos, pos])
            extent = np.zeros(3)
        out[f"{SCENE_PREFIX}{name}/pos"] = pos
        out[f"{SCENE_PREFIX}{name}/mat"] = mat.reshape(9)
        out[f"{SCENE_PREFIX}{name}/box"] = box
        out[f"{SCENE_PREFIX}{name}/extent"] = extent
        plates = _plates(model, data, geoms)
        if len(plates):
            out[f"{SCENE_PREFIX}{name}/plates"] = plates
        obj = problem_env.get_object(name)
        # Hinges and slides only: a free joint (a movable object's 7-D pose) is the pose above.
        joints = [j for j in getattr(obj, "joints", None) or [] if _is_scalar_joint(problem_env, j)]
        if joints:
            ids = [problem_env.sim.model.joint_name2id(j) for j in joints]
            out[f"{SCENE_PREFIX}{name}/joints"] = np.array(
                [problem_env.sim.data.qpos[problem_env.sim.model.get_joint_qpos_addr(j)] for j in joints],
                dtype=np.float64,
            )
            out[f"{SCENE_PREFIX}{name}/joint_frames"] = np.array(
                [[*data.xanchor[i], *data.xaxis[i]] for i in ids], dtype=np.float64
            )
            boxes = []
            for i in ids:
                part = _collision_geoms(model, int(model.jnt_bodyid[i]))
                corners = (
                    _geom_corners(model, data, part) if len(part) else np.repeat(data.xanchor[i][None], 2, 0)
                )
                boxes.append(np.concatenate([corners.min(0), corners.max(0)]))
            out[f"{SCENE_PREFIX}{name}/joint_boxes"] = np.array(boxes, dtype=np.float64)
    try:  # the robot's base: how far a grasp must reach
        base = problem_env.sim.model.body_name2id("robot0_base")
        out[f"{SCENE_PREFIX}robot0_base/pos"] = np.array(data.xpos[base], dtype=np.float64)
    except ValueError:
        pass
    for site_name, site in problem_env.object_sites_dict.items():
        out[f"{SCENE_PREFIX}{site_name}/pos"] = np.array(
            problem_env.sim.data.get_site_xpos(site_name), dtype=np.float64
        )
        out[f"{SCENE_PREFIX}{site_name}/mat"] = np.array(
            problem_env.sim.data.get_site_xmat(site_name), dtype=np.float64
        ).reshape(9)
        out[f"{SCENE_PREFIX}{site_name}/size"] = np.asarray(site.size, dtype=np.float64).reshape(3)
    return out
