"""LIBERO's HDF5 demonstration files (``<task>_demo.hdf5``), read and written with h5py.

The layout LIBERO's ``scripts/create_dataset.py`` writes (and ``yifengzhu-hf/LIBERO-datasets`` holds)::

    data.attrs: problem_info (JSON: problem_name, domain_name, language_instruction),
                bddl_file_name, env_name, env_args (JSON), macros_image_convention ("opengl" | "opencv"),
                num_demos, total
    data/demo_<i>/actions          (T, 7)   float64
    data/demo_<i>/states           (T, D)   flattened MuJoCo states
    data/demo_<i>/obs/agentview_rgb, eye_in_hand_rgb   (T, H, W, 3) uint8 (128 px upstream)
    data/demo_<i>/obs/ee_states, gripper_states, joint_states   proprioception
    data/demo_<i>/rewards, dones   (T,)
    data/demo_<i>.attrs: num_samples, init_state, model_file

Two properties of these files matter for behaviour cloning, and this reader reports both instead
of hiding them: the images are in robosuite's OpenGL convention (``macros_image_convention``
"opengl" = our ``raw``: upside down), and ``obs[t]`` is the observation *after* ``actions[t]``
(``create_dataset.py`` appends ``env.step(action)``'s observation), so ``Demo.frames_after_action``
is set. Replaying the actions in our simulator (:mod:`.replay`) regenerates correctly paired frames
in our orientation and resolution, as the official code does with ``demo_0``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from wmrl.embodied.demos.types import Demo

__all__ = ["LIBERO_CAMERAS", "read_libero_hdf5", "write_libero_hdf5"]

#: LIBERO's HDF5 image keys by our camera names.
LIBERO_CAMERAS = {"agentview": "agentview_rgb", "robot0_eye_in_hand": "eye_in_hand_rgb"}
_CONVENTION_TO_ORIENTATION = {"opengl": "raw", "opencv": "upright"}
_DEMO = re.compile(r"^demo_(\d+)$")


def _attr(attrs, key: str, default=None):
    value = attrs.get(key, default)
    return value.decode() if isinstance(value, bytes) else value


def read_libero_hdf5(
    path: str | Path, demos: Sequence[int] | None = None, cameras: Sequence[str] = ("agentview",)
) -> list[Demo]:
    """Read demonstrations from one LIBERO HDF5 file.

    Args:
        path: the ``.hdf5`` file.
        demos: which ``demo_<i>`` to read (``None``: all, in index order; the official SFT uses ``[0]``).
        cameras: cameras to load (our names: ``agentview``, ``robot0_eye_in_hand``).

    Raises:
        FileNotFoundError, KeyError: the file or a demonstration/camera is missing (named).
    """
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no LIBERO demonstration file {path}")
    out = []
    with h5py.File(path, "r") as f:
        if "data" not in f:
            raise KeyError(f"{path} has no 'data' group: not a LIBERO demonstration file")
        data = f["data"]
        problem = json.loads(_attr(data.attrs, "problem_info", "{}") or "{}")
        instruction = problem.get("language_instruction", "")
        if isinstance(instruction, list):  # some files store it as a list of words
            instruction = " ".join(instruction)
        convention = _attr(data.attrs, "macros_image_convention", "opengl")
        if convention not in _CONVENTION_TO_ORIENTATION:
            raise ValueError(f"{path}: unknown macros_image_convention {convention!r}")
        orientation = _CONVENTION_TO_ORIENTATION[convention]
        wmrl_meta = json.loads(_attr(data.attrs, "wmrl", "{}") or "{}")
        present = sorted(int(m.group(1)) for k in data if (m := _DEMO.match(k)))
        wanted = present if demos is None else list(demos)
        missing = sorted(set(wanted) - set(present))
        if missing:
            raise KeyError(f"{path} has no demo_{missing[0]} (it has demo_{present[0]}..demo_{present[-1]})")
        for i in wanted:
            grp = data[f"demo_{i}"]
            frames = {}
            for camera in cameras:
                key = LIBERO_CAMERAS.get(camera, f"{camera}_rgb")
                if key not in grp["obs"]:
                    raise KeyError(f"{path}:demo_{i} has no obs/{key} (camera {camera!r})")
                frames[camera] = np.asarray(grp["obs"][key][()], dtype=np.uint8)
            demo_meta = json.loads(_attr(grp.attrs, "wmrl", "{}") or "{}")
            rewards = np.asarray(grp["rewards"][()]) if "rewards" in grp else None
            out.append(
                Demo(
                    instruction=str(demo_meta.get("instruction") or instruction),
                    actions=np.asarray(grp["actions"][()], dtype=np.float32),
                    frames=frames,
                    orientation=orientation,
                    suite=demo_meta.get("suite", wmrl_meta.get("suite")),
                    task_id=demo_meta.get("task_id", wmrl_meta.get("task_id")),
                    states=np.asarray(grp["states"][()], dtype=np.float64) if "states" in grp else None,
                    success=demo_meta.get("success", None if rewards is None else bool(rewards.max() > 0)),
                    name=f"{path.name}:demo_{i}",
                    init_state=demo_meta.get("init_state"),
                    frames_after_action=bool(demo_meta.get("frames_after_action", True)),
                    labelled_by=demo_meta.get("labelled_by"),
                )
            )
    return out


def write_libero_hdf5(
    path: str | Path,
    demos: Sequence[Demo],
    *,
    bddl_file: str | Path | None = None,
    problem_name: str = "",
    many_tasks: bool = False,
) -> Path:
    """Write demonstrations of one task in LIBERO's HDF5 layout (images in the OpenGL convention).

    Frames are converted to ``raw`` (LIBERO's ``opengl`` convention). A demo whose frames are paired
    with the action that follows them (ours) is recorded as such in a ``wmrl`` attribute, which
    upstream readers ignore; ``rewards``/``dones`` mark the last step as LIBERO's files do.
    """
    import h5py

    if not demos:
        raise ValueError("no demonstrations to write")
    instructions = {d.instruction for d in demos}
    if len(instructions) != 1 and not many_tasks:
        raise ValueError(
            f"one LIBERO file holds one task; got instructions {sorted(instructions)} (many_tasks=True "
            "writes them anyway, each demo's task in its 'wmrl' attribute, which only this reader reads)"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    first = demos[0]
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps(
            {
                "problem_name": problem_name,
                "domain_name": "robosuite",
                "language_instruction": first.instruction,
            }
        )
        data.attrs["bddl_file_name"] = str(bddl_file or "")
        data.attrs["env_name"] = "Libero"
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero", "env_kwargs": {}})
        data.attrs["macros_image_convention"] = "opengl"
        data.attrs["wmrl"] = json.dumps({"suite": first.suite, "task_id": first.task_id})
        total = 0
        for i, demo in enumerate(demos):
            raw = demo.oriented("raw")
            grp = data.create_group(f"demo_{i}")
            obs = grp.create_group("obs")
            for camera, stack in raw.frames.items():
                obs.create_dataset(
                    LIBERO_CAMERAS.get(camera, f"{camera}_rgb"), data=stack, compression="gzip"
                )
            grp.create_dataset("actions", data=demo.actions.astype(np.float64))
            if demo.states is not None:
                grp.create_dataset("states", data=demo.states)
            rewards = np.zeros(demo.length, dtype=np.uint8)
            dones = np.zeros(demo.length, dtype=np.uint8)
            dones[-1] = 1
            if demo.success:
                rewards[-1] = 1
            grp.create_dataset("rewards", data=rewards)
            grp.create_dataset("dones", data=dones)
            grp.attrs["num_samples"] = demo.length
            if demo.states is not None:
                grp.attrs["init_state"] = demo.states[0]
            grp.attrs["wmrl"] = json.dumps(
                {
                    "success": demo.success,
                    "init_state": demo.init_state,
                    "frames_after_action": demo.frames_after_action,
                    "instruction": demo.instruction,
                    "suite": demo.suite,
                    "task_id": demo.task_id,
                    "labelled_by": demo.labelled_by,
                }
            )
            total += demo.length
        data.attrs["num_demos"] = len(demos)
        data.attrs["total"] = total
    return path
