"""Record a policy's LIBERO episodes as demonstrations: ``wmrl embodied record-demos``.

The scripted expert (``--policy scripted``, the default) is what makes this useful: its successful
episodes are demonstrations a VLA can be cloned from, at the camera, render size and orientation
the VLA will be trained and evaluated with. Each episode keeps the frames the policy's camera
showed before each action, the actions, and the MuJoCo states (so SFT may replay them), and is
written in LIBERO's HDF5 layout (one ``<TASK>_demo.hdf5`` per task, what ``wmrl train
embodied-sft data.format=libero_hdf5`` reads) and/or as a LeRobot v3.0 dataset (``data.format=
lerobot``). Frames are stored as rendered: the JPEG round trip a policy trains with is applied by
the SFT stage (``policy.jpeg_quality``), not baked into the files.

With ``label_policy`` (``--label-with scripted``) a learned policy drives and the expert labels
every state the learner visits (DAgger, Ross et al. 2011): behaviour cloning then sees the states its
own mistakes lead to, with the expert's way back, which demonstrations alone never show it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from wmrl.embodied.demos.replay import LabelledAction
from wmrl.embodied.env.images import check_orientation
from wmrl.embodied.env.suites import DEFAULT_SUITE, SUITE_NUM_TASKS, check_suite

if TYPE_CHECKING:
    from wmrl.embodied.demos.types import Demo

__all__ = ["FORMATS", "RecordConfig", "labelled", "record_demonstrations"]

FORMATS = ("libero_hdf5", "lerobot")
SUMMARY_FILE = "record.json"


@dataclass(frozen=True)
class RecordConfig:
    """What to record and how.

    Attributes:
        policy: ``scripted`` (the privileged expert), ``random``, or a saved-policy folder.
        suite: the LIBERO suite.
        tasks: task ids.
        states: fixed initial states to start from (one episode each).
        camera: the camera recorded (the one the VLA sees).
        wrist_camera: a second camera recorded with it (``robot0_eye_in_hand``), for a wrist-camera VLA
            (openvla-mini's ``-wrist`` variant); ``None`` = none. A policy that reads a wrist camera
            gets it rendered, and recorded, whatever this says.
        image_size: square render side in pixels.
        orientation: orientation of the stored frames (``upright``, ``rotate180``, ``raw``).
        formats: ``libero_hdf5`` and/or ``lerobot``.
        keep_failures: also keep episodes that did not reach the goal (marked ``success=False``).
        max_steps: policy steps per episode (``None``: the suite's).
        action_noise: standard deviation of Gaussian noise added to the six arm dimensions of every
            action (in action units, clipped back to [-1, 1]; the gripper is left alone); 0 = none.
            Perturbed expert runs, some of which fail, are what a world model learns failure from.
            The noisy action is the one executed and recorded.
        noise_seed: seeds the noise and the label mix; each (task, state) episode draws from its own
            streams, so an episode does not depend on which others are recorded.
        label_policy: ``None`` records the driving policy's own actions. Else a policy (``scripted``,
            or a saved-policy folder) asked at every visited state; its action is recorded in place of
            the executed one (DAgger: ``policy`` is the learner that drives, this the expert that
            labels; ``Demo.labelled_by`` says so). An episode's recording ends where the labeller
            gives up (the scripted expert after every grasp of an object failed).
        label_mix: probability that a step executes the labeller's action instead of the driving
            policy's (DAgger's beta; drawn per step). Needs ``label_policy``.
        out_dir: the folder written (``libero_hdf5/``, ``lerobot/``, ``record.json``).
    """

    policy: str = "scripted"
    suite: str = DEFAULT_SUITE
    tasks: tuple[int, ...] = (0,)
    states: tuple[int, ...] = tuple(range(16))
    camera: str = "agentview"
    wrist_camera: str | None = None
    image_size: int = 128
    orientation: str = "upright"
    formats: tuple[str, ...] = FORMATS
    keep_failures: bool = False
    max_steps: int | None = None
    action_noise: float = 0.0
    noise_seed: int = 0
    label_policy: str | None = None
    label_mix: float = 0.0
    out_dir: str = "runs/demos"

    def __post_init__(self) -> None:
        check_suite(self.suite)
        n = SUITE_NUM_TASKS[self.suite]
        if not self.tasks or any(not isinstance(t, int) or not 0 <= t < n for t in self.tasks):
            raise ValueError(f"tasks must be task ids of {self.suite} (0-{n - 1}); got {self.tasks!r}")
        if not self.states or any(not isinstance(s, int) or s < 0 for s in self.states):
            raise ValueError(f"states must be initial-state indices >= 0; got {self.states!r}")
        if len(set(self.states)) != len(self.states) or len(set(self.tasks)) != len(self.tasks):
            raise ValueError("tasks and states must not repeat")
        if not self.camera:
            raise ValueError("camera must name the camera to record")
        if self.wrist_camera is not None and (not self.wrist_camera or self.wrist_camera == self.camera):
            raise ValueError(f"wrist_camera must be None or another camera than {self.camera!r}")
        if not isinstance(self.image_size, int) or not 8 <= self.image_size <= 2048:
            raise ValueError(f"image_size must be an integer in [8, 2048]; got {self.image_size!r}")
        check_orientation(self.orientation)
        unknown = set(self.formats) - set(FORMATS)
        if not self.formats or unknown:
            raise ValueError(f"formats must be some of {list(FORMATS)}; got {list(self.formats)}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise ValueError(f"max_steps must be a positive integer or None; got {self.max_steps!r}")
        if not (isinstance(self.action_noise, (int, float)) and 0.0 <= self.action_noise <= 2.0):
            raise ValueError(
                f"action_noise must be a standard deviation in [0, 2]; got {self.action_noise!r}"
            )
        if not isinstance(self.noise_seed, int) or self.noise_seed < 0:
            raise ValueError(f"noise_seed must be an integer >= 0; got {self.noise_seed!r}")
        if self.label_policy is not None and (
            not isinstance(self.label_policy, str) or not self.label_policy
        ):
            raise ValueError(
                f"label_policy must be None or a policy name or folder; got {self.label_policy!r}"
            )
        if not (isinstance(self.label_mix, (int, float)) and 0.0 <= self.label_mix <= 1.0):
            raise ValueError(f"label_mix must be a probability in [0, 1]; got {self.label_mix!r}")
        if self.label_mix > 0 and self.label_policy is None:
            raise ValueError("label_mix mixes in the labeller's actions: it needs label_policy")


def recorded_cameras(config: RecordConfig, contract: Mapping[str, Any]) -> tuple[str, ...]:
    """The cameras rendered and recorded: ``config.camera``, then the wrist camera if one is asked for.

    Raises:
        ValueError: the policy reads a camera other than ``config.camera`` as its main one, or a wrist
            camera other than ``config.wrist_camera``.
    """
    main, wrist = contract.get("camera"), contract.get("wrist_camera")
    if main is not None and main != config.camera:
        raise ValueError(f"the policy reads camera {main!r}; record it with --camera {main}")
    if wrist is not None and config.wrist_camera not in (None, wrist):
        raise ValueError(f"the policy reads wrist camera {wrist!r}, not {config.wrist_camera!r}")
    wrist = wrist or config.wrist_camera
    return (config.camera,) if wrist is None else (config.camera, wrist)


def perturbed(
    act: Callable[[Any], np.ndarray], sigma: float, rng: np.random.Generator
) -> Callable[[Any], np.ndarray]:
    """``act`` with ``N(0, sigma)`` added to the arm dimensions (0-5) of each ``(7,)`` action, clipped to [-1, 1]."""
    if sigma == 0:
        return act

    def noisy(obs: Any) -> np.ndarray:
        action = np.array(act(obs), dtype=np.float64)
        action[:6] = np.clip(action[:6] + rng.normal(0.0, sigma, size=6), -1.0, 1.0)
        return action

    return noisy


def labelled(
    act: Callable[[Any], np.ndarray],
    label: Callable[[Any], Any],
    mix: float,
    rng: np.random.Generator,
) -> Callable[[Any], LabelledAction]:
    """DAgger's step: ``act`` drives, ``label`` (returning an ``ActionStep``) labels every visited state.

    Both are asked at every step (a stateful labeller such as the scripted expert must see the whole
    episode to know its phase). The labeller's action is executed instead of ``act``'s with
    probability ``mix``; a labeller whose step says ``gave_up`` labels ``None`` (the recording ends).
    """

    def step(obs: Any) -> LabelledAction:
        driven = np.asarray(act(obs), dtype=np.float32)
        expert = label(obs)
        if expert.info.get("gave_up", False):
            return LabelledAction(driven, None)
        target = np.asarray(expert.action, dtype=np.float32)
        return LabelledAction(target if rng.random() < mix else driven, target)

    return step


def _record_episode(
    env: Any, policy: Any, labeller: Any, config: RecordConfig, task_id: int, state: int
) -> Demo | None:
    """One episode from ``state``: ``policy`` drives (with ``config``'s noise), ``labeller`` labels if any.

    Returns ``None`` when the labeller had no action for the first step.
    """
    from wmrl.embodied.demos.replay import NothingRecorded, record_demo

    policy.reset()
    driven = perturbed(
        lambda obs: policy.act(obs, env.instruction).action,
        float(config.action_noise),
        np.random.default_rng([config.noise_seed, task_id, state]),
    )
    act: Callable[[Any], np.ndarray | LabelledAction] = driven
    if labeller is not None:
        labeller.reset()
        act = labelled(
            driven, lambda obs: labeller.act(obs, env.instruction), config.label_mix,
            np.random.default_rng([config.noise_seed, task_id, state, 1]),
        )  # fmt: skip
    try:
        return record_demo(
            env,
            # record_demo's controller (obs, t) -> action; cast: mypy infers no lambda against a union
            cast(Callable[[dict, int], np.ndarray], lambda obs, _t: act(obs)),
            init_state=state,
            task_id=task_id,
            labelled_by=config.label_policy,
        )
    except NothingRecorded:
        return None


def _load(policy: str, suite: str) -> Any:
    from wmrl.embodied.eval.policy_loader import load_policy

    return load_policy(policy, suite=suite) if policy == "scripted" else load_policy(policy)


def record_demonstrations(
    config: RecordConfig, *, progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Run one episode per (task, state), keep the successful ones, write them; returns the summary.

    Raises:
        FileExistsError: ``out_dir`` already holds a recording.
        RuntimeError: no episode was kept (nothing to write).
    """
    from wmrl.core.runlog import write_json_atomic
    from wmrl.embodied.demos.lerobot_format import write_lerobot_dataset
    from wmrl.embodied.demos.libero_hdf5 import write_libero_hdf5
    from wmrl.embodied.env import LiberoEnv, LiberoEnvConfig
    from wmrl.embodied.env.suites import get_task

    out = Path(config.out_dir)
    if (out / SUMMARY_FILE).exists():
        raise FileExistsError(f"{out} already holds a recording ({SUMMARY_FILE}); choose another out_dir")
    policy = _load(config.policy, config.suite)
    labeller = None if config.label_policy is None else _load(config.label_policy, config.suite)
    contract = getattr(policy, "observation_contract", None) or {}
    label_contract = getattr(labeller, "observation_contract", None) or {}
    cameras = recorded_cameras(config, contract)
    if not {c for c in (label_contract.get("camera"), label_contract.get("wrist_camera")) if c} <= set(
        cameras
    ):
        raise ValueError(f"the label policy reads a camera other than the recorded {list(cameras)}")
    env = LiberoEnv(
        LiberoEnvConfig(
            suite=config.suite, task_id=config.tasks[0], cameras=cameras, image_height=config.image_size,
            image_width=config.image_size, orientation=config.orientation, max_steps=config.max_steps,
            scene_state=bool(contract.get("scene_state", False) or label_contract.get("scene_state", False)),
        )
    )  # fmt: skip
    episodes: list[dict[str, Any]] = []
    kept: dict[int, list[Demo]] = {t: [] for t in config.tasks}
    start = time.perf_counter()
    try:
        for task_id in config.tasks:
            for state in config.states:
                t0 = time.perf_counter()
                demo = _record_episode(env, policy, labeller, config, task_id, state)
                row = {"task": task_id, "state": state, "success": bool(demo and demo.success),
                       "steps": demo.length if demo else 0, "wall_s": round(time.perf_counter() - t0, 3)}  # fmt: skip
                episodes.append(row)
                if demo is not None and (demo.success or config.keep_failures):
                    kept[task_id].append(demo)
                if progress is not None:
                    progress(row)
    finally:
        env.close()
    if not any(kept.values()):
        raise RuntimeError(f"no episode of {config.policy!r} reached the goal: nothing to write ({episodes})")
    files = []
    if "libero_hdf5" in config.formats:
        for task_id, demos in kept.items():
            if demos:
                task = get_task(config.suite, task_id)
                path = out / "libero_hdf5" / f"{task.name}_demo.hdf5"
                files.append(
                    str(write_libero_hdf5(path, demos, bddl_file=task.bddl_file, problem_name=task.name))
                )
    if "lerobot" in config.formats:
        files.append(str(write_lerobot_dataset(out / "lerobot", [d for ds in kept.values() for d in ds])))
    summary = {
        "config": dataclasses.asdict(config),
        "episodes": episodes,
        "kept": sum(len(d) for d in kept.values()),
        "success_rate": sum(e["success"] for e in episodes) / len(episodes),
        "files": files,
        "record_s": round(time.perf_counter() - start, 1),
    }
    write_json_atomic(out / SUMMARY_FILE, json.loads(json.dumps(summary)))
    return summary
