"""The demonstrations of a behaviour-cloning run: load, replay, orient, tokenise.

1. :func:`load_demos` reads the configured files (LIBERO HDF5 or a LeRobot dataset) and, for HDF5
   with ``data.replay``, replays each demonstration's actions in our simulator from its first MuJoCo
   state, regenerating its frames in the training orientation and resolution (what the official SFT
   does with ``demo_0``); replays that do not reach the goal are dropped unless
   ``data.keep_failed_replays``. The result is cached in the run directory (``RUN/demos/``) with a
   per-demonstration report, so a resumed run does not replay again.
2. :func:`action_statistics` computes Prismatic's ``dataset_statistics.json`` entry (q01/q99 of the
   demonstrations' actions, gripper unnormalised) under which actions are tokenised and the trained
   policy un-normalises.
3. :func:`action_tokens` maps LIBERO actions (gripper -1 = open, +1 = close) to the 7 action tokens
   of the policy (RLDS gripper 1 = open, 0 = close; q01/q99 normalisation; 256 bins).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.embodied.demos.types import Demo

__all__ = ["SFTSamples", "action_statistics", "action_tokens", "libero_to_rlds_gripper", "load_demos"]


def libero_to_rlds_gripper(actions: np.ndarray) -> np.ndarray:
    """LIBERO's gripper (-1 = open, +1 = close) -> the RLDS/OpenVLA convention (1 = open, 0 = close).

    The inverse of the policy's decoding (``gripper_to_libero``: ``g -> -sign(2g - 1)``) on {-1, +1}.
    """
    out = np.array(actions, dtype=np.float64, copy=True)
    out[..., -1] = (1.0 - np.sign(out[..., -1])) / 2.0
    return out


def action_statistics(demos: Sequence[Demo]) -> dict[str, Any]:
    """Prismatic's per-dataset action statistics of ``demos`` (RLDS gripper), as ``dataset_statistics.json``.

    q01/q99 bound the normalisation of the six arm dimensions; the gripper is not normalised (mask
    false), as in OpenVLA's statistics of the LIBERO datasets.
    """
    actions = libero_to_rlds_gripper(np.concatenate([d.actions for d in demos]))
    mask = [True] * 6 + [False]
    return {
        "action": {
            "mean": actions.mean(0).tolist(),
            "std": actions.std(0).tolist(),
            "max": actions.max(0).tolist(),
            "min": actions.min(0).tolist(),
            "q01": np.quantile(actions, 0.01, axis=0).tolist(),
            "q99": np.quantile(actions, 0.99, axis=0).tolist(),
            "mask": mask,
        },
        "num_transitions": int(actions.shape[0]),
        "num_trajectories": len(demos),
    }


def action_tokens(policy: Any, actions: np.ndarray) -> np.ndarray:
    """``float (T, 7)`` LIBERO actions -> ``int64 (T, 7)`` token ids of ``policy`` (its statistics and bins)."""
    normalized = policy.normalizer.normalize(libero_to_rlds_gripper(actions))
    # the gripper is not normalised: map RLDS {0, 1} onto the [-1, 1] bins as OpenVLA's tokenizer sees it
    normalized[..., -1] = 2.0 * normalized[..., -1] - 1.0
    return policy.action_tokenizer.encode(normalized)


@dataclass
class SFTSamples:
    """Every (demonstration, timestep) pair of the training set.

    Attributes:
        frames: camera -> ``uint8 (N, H, W, 3)``: what each camera showed when each action was chosen.
        instructions: ``N`` instructions.
        tokens: ``int64 (N, 7)`` the target action tokens.
        demo_index: ``int64 (N,)`` which demonstration each sample came from.
    """

    frames: dict[str, np.ndarray]
    instructions: list[str]
    tokens: np.ndarray
    demo_index: np.ndarray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def make_samples(policy: Any, demos: Sequence[Demo], cameras: Sequence[str]) -> SFTSamples:
    """Every (demonstration, timestep) pair with the frames of ``cameras`` (the policy's, in its order)."""
    frames: dict[str, list[np.ndarray]] = {c: [] for c in cameras}
    instructions, tokens, index = [], [], []
    for i, d in enumerate(demos):
        for camera in cameras:
            if camera not in d.frames:
                raise KeyError(f"{d.name} has no frames of camera {camera!r} (it has {sorted(d.frames)})")
            frames[camera].append(d.frames[camera])
        instructions.extend([d.instruction] * d.length)
        tokens.append(action_tokens(policy, d.actions))
        index.append(np.full(d.length, i, dtype=np.int64))
    return SFTSamples(
        {c: np.concatenate(f) for c, f in frames.items()},
        instructions,
        np.concatenate(tokens),
        np.concatenate(index),
    )


def find_files(
    paths: Sequence[str], pattern: str, setting: str = "data.paths", recursive: bool = False
) -> list[Path]:
    """The files ``paths`` names: each file itself, each folder's files matching ``pattern`` (sorted;
    in sub-folders too when ``recursive``).

    Raises:
        FileNotFoundError: a path does not exist, or a folder holds no matching file.
    """
    out = []
    for p in paths:
        path = Path(p).expanduser()
        if path.is_dir():
            found = sorted(path.rglob(pattern) if recursive else path.glob(pattern))
            if not found:
                raise FileNotFoundError(f"{path} holds no {pattern} files")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise FileNotFoundError(f"{setting}: {path} does not exist")
    return out


def _task_of(demo: Demo, suite: str) -> int | None:
    if demo.task_id is not None:
        return demo.task_id
    from wmrl.embodied.env.suites import SUITE_NUM_TASKS, get_task

    by_text = {get_task(suite, t).instruction.lower(): t for t in range(SUITE_NUM_TASKS[suite])}
    return by_text.get(demo.instruction.lower())


def load_demos(
    data: Any, cache: Path | None = None, *, progress: bool = False, cameras: Sequence[str] | None = None
) -> tuple[list[Demo], dict]:
    """The training demonstrations for ``data`` (an ``SFTDataConfig``) and a report of how they were made.

    Args:
        cameras: the cameras the policy reads (default ``(data.camera,)``; a wrist-camera policy adds
            its wrist camera).

    Returns:
        ``(demos, report)``; every demo has the frames of ``cameras`` in ``data.orientation`` at
        ``data.image_size`` pixels.
    """
    from wmrl.embodied.demos.libero_hdf5 import read_libero_hdf5, write_libero_hdf5

    cameras = tuple(cameras or (data.camera,))

    if cache is not None and (cache / "demos.hdf5").is_file():
        report: dict[str, Any] = json.loads((cache / "report.json").read_text())
        cached = read_libero_hdf5(cache / "demos.hdf5", cameras=cameras)
        return [d.oriented(data.orientation) for d in cached], report | {"cached": True}
    if data.format == "libero_hdf5":
        demos = []
        for f in find_files(data.paths, "*.hdf5"):
            demos.extend(read_libero_hdf5(f, demos=data.demos, cameras=cameras))
    else:
        from wmrl.embodied.demos.lerobot_format import read_lerobot_dataset

        demos = []
        for root in data.paths:
            demos.extend(
                read_lerobot_dataset(
                    root,
                    episodes=data.demos,
                    cameras=_lerobot_cameras(data, cameras),
                    orientation=data.stored_orientation,
                    suite=data.suite,
                )
            )
    if data.stored_orientation is not None and data.format == "libero_hdf5":
        for d in demos:
            d.orientation = data.stored_orientation
    for d in demos:
        d.suite = data.suite
        d.task_id = _task_of(d, data.suite)
    if data.tasks is not None:
        demos = [d for d in demos if d.task_id in data.tasks]
    if not demos:
        raise ValueError(f"no demonstrations of tasks {data.tasks} in {list(data.paths)}")
    report = {"source": [d.name for d in demos], "replayed": bool(data.replay)}
    if data.replay:
        demos, report["replays"] = _replay_all(demos, data, progress, cameras)
    else:
        demos = [_prepare(d, data) for d in demos]
    if not demos:
        raise ValueError("no demonstration is left: every replay failed (data.keep_failed_replays=false)")
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        write_libero_hdf5(cache / "demos.hdf5", demos, many_tasks=True)
        (cache / "report.json").write_text(json.dumps(report, indent=2))
    return demos, report


def _prepare(demo: Demo, data: Any) -> Demo:
    demo = demo.oriented(data.orientation)
    sizes = {tuple(f.shape[1:3]) for f in demo.frames.values()}
    if len(sizes) > 1:
        raise ValueError(
            f"{demo.name}: its cameras' frames differ in size ({sorted(sizes)}); the policy renders one size"
        )
    size = demo.frames[data.camera].shape[1:3]
    if data.image_size is not None and tuple(size) != (data.image_size, data.image_size):
        raise ValueError(
            f"{demo.name}: frames are {size[0]}x{size[1]} but data.image_size is {data.image_size}; "
            "set data.image_size to the stored size, or replay the demonstrations (data.replay=true) to "
            "render them at the size you want"
        )
    return demo


def _lerobot_cameras(data: Any, cameras: Sequence[str]) -> dict[str, str]:
    """Our camera names -> the dataset's image features (``data.camera_key`` for the main camera)."""
    from wmrl.embodied.demos.lerobot_format import LIBERO_CAMERA_KEYS

    out = {}
    for camera in cameras:
        key = data.camera_key if camera == data.camera and data.camera_key else LIBERO_CAMERA_KEYS.get(camera)
        out[camera] = key or f"observation.images.{camera}"
    return out


def _replay_all(
    demos: Sequence[Demo], data: Any, progress: bool, cameras: Sequence[str]
) -> tuple[list[Demo], list[dict]]:
    from wmrl.embodied.demos.replay import replay_demo
    from wmrl.embodied.env import LiberoEnv, LiberoEnvConfig

    size = data.image_size or 256
    first_task = next((d.task_id for d in demos if d.task_id is not None), 0)
    env = LiberoEnv(
        LiberoEnvConfig(
            suite=data.suite,
            task_id=first_task,
            cameras=tuple(cameras),
            image_height=size,
            image_width=size,
            orientation=data.orientation,
            settle_steps=data.settle_steps,
            max_steps=100_000,
        )
    )
    kept, rows = [], []
    try:
        for d in demos:
            if d.task_id is None:
                raise ValueError(f"{d.name}: its instruction {d.instruction!r} is not a task of {data.suite}")
            result = replay_demo(env, d, skip_noops=data.skip_noops)
            rows.append(
                {
                    "demo": d.name,
                    "task_id": d.task_id,
                    "success": result.success,
                    "success_step": result.success_step,
                    "steps": result.demo.length,
                    "skipped_noops": result.skipped_noops,
                    "max_state_error": result.max_state_error,
                    "kept": bool(result.success or data.keep_failed_replays),
                }
            )
            if progress:
                print(f"replayed {d.name}: success={result.success}, {result.demo.length} steps", flush=True)
            if rows[-1]["kept"]:
                kept.append(result.demo)
    finally:
        env.close()
    return kept, rows
