"""A gymnasium environment for one LIBERO task at a time.

Episode protocol (the one the VLA literature and the WMRL paper use):

1. ``reset(options={"init_state": k})`` places fixed initial state ``k`` of the task (a flattened
   MuJoCo state from the task's ``.pruned_init`` file), then runs ``settle_steps`` (10) no-op steps
   with the arm still and the gripper open, so objects come to rest. Settle steps are not policy
   steps. ``options={"task_id": t}`` switches task (the simulator is rebuilt for the new scene).
2. ``step(action)`` applies one 7-D action (20 Hz control, robosuite's OSC_POSE controller) and
   reports ``info["success"]`` from LIBERO's BDDL goal check. The reward is sparse: 1.0 on a step
   where the goal holds, else 0.0. ``terminated`` is True on success; ``truncated`` is True when
   ``max_steps`` policy steps (520 for LIBERO-Long) pass without success.

Action ``(7,)`` float in [-1, 1] (clipped): end-effector position delta (x, y, z; scaled by the
controller to at most 5 cm per step), rotation delta as axis-angle (at most 0.5 rad per step),
both in the robot base frame, which is aligned with the world frame in every LIBERO scene; and the
gripper command, **-1 = open, +1 = close**. Tested: closing brings the two finger joints
together (``robot0_gripper_qpos`` goes from about (+0.04, -0.04) to about (0, 0)).

Observation (a dict of numpy arrays):
    ``"<camera>_image"``: ``uint8 (H, W, 3)`` per configured camera, oriented per the config
        (``"upright"`` by default: table at the bottom, not mirrored);
    ``"robot0_eef_pos"`` ``(3,)`` metres, ``"robot0_eef_quat"`` ``(4,)`` (x, y, z, w),
    ``"robot0_gripper_qpos"`` ``(2,)`` metres, ``"robot0_joint_pos"`` ``(7,)`` radians,
    ``"state"`` ``(8,)``: eef position + eef axis-angle + gripper qpos (the lerobot/OpenVLA
    8-D state), all ``float32``; ``"object-state"`` when ``object_state=True``; the privileged
    ``"scene/<name>/<field>"`` arrays (``float64``, ``wmrl.embodied.env.scene_state``) when
    ``scene_state=True``.

The language instruction is ``env.instruction`` and ``info["instruction"]``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from wmrl.embodied.env.config import LiberoEnvConfig
from wmrl.embodied.env.images import orient_image
from wmrl.embodied.env.libero_setup import prepare_libero
from wmrl.embodied.env.scene_state import read_scene
from wmrl.embodied.env.suites import TaskInfo, get_task, load_init_states

__all__ = ["NOOP_ACTION", "LiberoEnv", "quat_to_axis_angle"]

NOOP_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
"""Hold still with the gripper open: the settle-step action."""

_RESET_OPTIONS = frozenset({"init_state", "task_id", "state"})
_CONTROL_FREQ = 20


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """Axis-angle vector ``(3,)`` (axis times angle in radians, angle in [0, pi]) of an (x, y, z, w) quaternion."""
    q = np.asarray(quat, dtype=np.float64)
    x, y, z, w = q / np.linalg.norm(q)
    if w < 0:  # q and -q are the same rotation; pick the one with angle <= pi
        x, y, z, w = -x, -y, -z, -w
    sin_half = np.sqrt(max(0.0, 1.0 - w * w))
    if sin_half < 1e-9:
        return np.zeros(3)
    angle = 2.0 * np.arctan2(sin_half, w)
    return np.array([x, y, z]) / sin_half * angle


class LiberoEnv(gym.Env):
    """One LIBERO task in a gymnasium interface; the simulator is built lazily at the first reset.

    Args:
        config: the environment configuration (suite, task, cameras, limits).
        render_mode: ``"rgb_array"`` (the first camera's oriented frame) or ``None``.
        **overrides: field overrides applied to ``config`` (``LiberoEnv(task_id=3, cameras=())``).
    """

    # gymnasium annotates Env.metadata as an instance variable, though it is read from the class
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": _CONTROL_FREQ}  # type: ignore[misc]
    observation_space: spaces.Dict  # _make_observation_space; gymnasium declares Space

    def __init__(
        self, config: LiberoEnvConfig | None = None, render_mode: str | None = None, **overrides: Any
    ):
        config = config or LiberoEnvConfig()
        if overrides:
            config = LiberoEnvConfig.from_dict({**config.to_dict(), **overrides})
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array'; got {render_mode!r}")
        if render_mode == "rgb_array" and not config.cameras:
            raise ValueError("render_mode='rgb_array' needs at least one camera")
        self.config = config
        self.render_mode = render_mode
        self._task: TaskInfo = get_task(config.suite, config.task_id)
        self._sim: Any = None  # libero ControlEnv, built at the first reset
        self._sim_task_id: int | None = None
        self._init_state: int | None = None
        self._seed: int | None = None
        self._steps = 0
        self._done = True
        self._last_obs: dict[str, np.ndarray] | None = None
        self.action_space = spaces.Box(-1.0, 1.0, shape=(7,), dtype=np.float32)
        self.observation_space = self._make_observation_space()

    # -- public properties -------------------------------------------------------------------
    @property
    def task(self) -> TaskInfo:
        """The current task."""
        return self._task

    @property
    def instruction(self) -> str:
        """The current task's language instruction."""
        return self._task.instruction

    @property
    def num_init_states(self) -> int:
        """How many fixed initial states the current task has (50 in LIBERO)."""
        return int(load_init_states(self._task).shape[0])

    @property
    def max_steps(self) -> int:
        """Policy steps before truncation."""
        return self.config.episode_max_steps

    def sim_state(self) -> np.ndarray:
        """The flattened MuJoCo state now (``float64 (D,)``): what LIBERO's demonstration files store."""
        if self._sim is None:
            raise RuntimeError("call reset() first")
        return np.asarray(self._sim.get_sim_state(), dtype=np.float64).copy()

    @property
    def libero_env(self):
        """The underlying LIBERO ``ControlEnv`` (``None`` before the first reset). For tests and diagnostics."""
        return self._sim

    # -- gymnasium API -----------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Place an initial state and settle.

        Args:
            seed: seeds the placement of the scene at this reset (robosuite's generator, and
                numpy's global one, from which LIBERO's region samplers draw, as upstream LIBERO's
                ``env.seed`` seeds it; restored afterwards) and ``self.np_random``. A fixed initial
                state overwrites every object the samplers placed, but not the *fixtures* (objects
                without a free joint, e.g. task 5's desk caddy), which are placed anew at every
                reset within their region: with ``seed=None`` that placement is random, with a
                seed it is that seed's. Recorded in ``info["seed"]``.
            options: ``{"init_state": k}`` (default 0) or ``{"state": flattened MuJoCo state}`` (a
                demonstration's first state), and optionally ``{"task_id": t}``.

        Returns:
            ``(observation, info)`` after the settle steps.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - _RESET_OPTIONS
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; allowed: {sorted(_RESET_OPTIONS)}")
        if "task_id" in options and options["task_id"] != self._task.task_id:
            self._task = get_task(self.config.suite, options["task_id"])
        states = load_init_states(self._task)
        if "state" in options:
            # an arbitrary flattened MuJoCo state (a demonstration's first state), not a fixed initial state
            if "init_state" in options:
                raise ValueError("give reset option 'init_state' or 'state', not both")
            start = np.asarray(options["state"], dtype=np.float64)
            if start.shape != states.shape[1:]:
                raise ValueError(
                    f"state must be a flattened MuJoCo state of shape {states.shape[1:]} for "
                    f"{self._task.name}; got {start.shape}"
                )
            k = None
        else:
            k = options.get("init_state", 0)
            if (
                not isinstance(k, (int, np.integer))
                or isinstance(k, bool)
                or not 0 <= int(k) < states.shape[0]
            ):
                raise ValueError(f"init_state must be an integer in [0, {states.shape[0] - 1}]; got {k!r}")
            k = int(k)
            start = states[k]
        # LIBERO's region samplers place the fixtures from numpy's global generator: seed it for this
        # reset (after building, which draws from it too), and give the caller's back afterwards
        with _numpy_global_restored(seed is not None):
            if self._sim is None or self._sim_task_id != self._task.task_id:
                self._build_sim()
            sim = self._sim
            self._seed = seed
            if seed is not None:
                sim.seed(int(seed))
                np.random.seed(int(seed) % 2**32)
            sim.reset()
        # Nobody looks at the frames of the settle steps: switch the cameras off while placing the
        # initial state and settling, then render once. Physics does not depend on rendering, so the
        # episode is unchanged; a reset costs one render instead of twelve.
        self._set_cameras_enabled(False)
        try:
            sim.set_init_state(start)
            for _ in range(self.config.settle_steps):
                sim.step(NOOP_ACTION)
        finally:
            self._set_cameras_enabled(True)
        raw = sim.env._get_observations(force_update=True)
        self._init_state = k
        self._steps = 0
        self._done = False
        success = bool(sim.check_success())
        obs = self._observation(raw)
        return obs, self._info(success)

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply one action; see the module docstring for the action and the outcome semantics."""
        if self._sim is None or self._done:
            raise RuntimeError("call reset() before step(): the episode has not started or has ended")
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (7,):
            raise ValueError(f"action must have shape (7,); got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"action must be finite; got {a}")
        raw, _, _, _ = self._sim.step(np.clip(a, -1.0, 1.0))
        self._steps += 1
        success = bool(self._sim.check_success())
        terminated = success
        truncated = (not success) and self._steps >= self.max_steps
        self._done = terminated or truncated
        return self._observation(raw), float(success), terminated, truncated, self._info(success)

    def render(self) -> np.ndarray | None:
        """The first camera's latest frame (oriented as configured) when ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array":
            return None
        if self._last_obs is None:
            raise RuntimeError("call reset() before render()")
        return self._last_obs[self.config.image_keys[0]].copy()

    def close(self) -> None:
        """Free the simulator and its renderer."""
        if self._sim is not None:
            with contextlib.suppress(Exception):
                self._sim.close()
        self._sim = None
        self._sim_task_id = None
        self._done = True

    # -- internals ---------------------------------------------------------------------------
    def _make_observation_space(self) -> spaces.Dict:
        cfg = self.config
        inf = np.inf
        entries: dict[str, spaces.Space] = {
            key: spaces.Box(0, 255, shape=(cfg.image_height, cfg.image_width, 3), dtype=np.uint8)
            for key in cfg.image_keys
        }
        for key, dim in (
            ("robot0_eef_pos", 3),
            ("robot0_eef_quat", 4),
            ("robot0_gripper_qpos", 2),
            ("robot0_joint_pos", 7),
            ("state", 8),
        ):
            entries[key] = spaces.Box(-inf, inf, shape=(dim,), dtype=np.float32)
        if cfg.object_state:
            # Its length depends on the scene; the space is fixed when the simulator is built.
            entries["object-state"] = spaces.Box(-inf, inf, shape=(0,), dtype=np.float32)
        return spaces.Dict(entries)

    def _build_sim(self) -> None:
        self.close()
        prepare_libero()
        from libero.libero.envs.env_wrapper import ControlEnv

        cfg = self.config
        use_camera = bool(cfg.cameras)
        kwargs: dict[str, Any] = {
            "bddl_file_name": str(self._task.bddl_file),
            "use_camera_obs": use_camera,
            "has_renderer": False,
            "has_offscreen_renderer": use_camera,
            "camera_names": list(cfg.cameras) if use_camera else [],
            "camera_heights": cfg.image_height,
            "camera_widths": cfg.image_width,
            "control_freq": _CONTROL_FREQ,
            "hard_reset": cfg.hard_reset,
            # We end episodes ourselves; robosuite's own horizon must never interrupt one.
            "ignore_done": True,
            "horizon": cfg.settle_steps + cfg.episode_max_steps + 1000,
        }
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                sim = ControlEnv(**kwargs)
            except Exception as exc:
                if use_camera and "camera" in str(exc).lower():
                    raise ValueError(
                        f"camera not available in {self._task.name}: {cfg.cameras!r} ({exc})"
                    ) from exc
                raise
        self._sim = sim
        self._sim_task_id = self._task.task_id
        if cfg.object_state:
            sim.reset()
            dim = int(np.asarray(sim.env._get_observations()["object-state"]).shape[0])
            self.observation_space.spaces["object-state"] = spaces.Box(
                -np.inf, np.inf, shape=(dim,), dtype=np.float32
            )
        if cfg.scene_state:
            # The scene's keys depend on the task: declare them once the scene exists.
            for key in [k for k in self.observation_space.spaces if k.startswith("scene/")]:
                del self.observation_space.spaces[key]
            for key, value in read_scene(sim.env).items():
                self.observation_space.spaces[key] = spaces.Box(
                    -np.inf, np.inf, shape=value.shape, dtype=np.float64
                )

    def _set_cameras_enabled(self, enabled: bool) -> None:
        for key in self.config.image_keys:
            self._sim.env.modify_observable(key, "enabled", enabled)

    def _observation(self, raw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        cfg = self.config
        obs: dict[str, np.ndarray] = {}
        for key in cfg.image_keys:
            frame = np.asarray(raw[key])
            if frame.dtype != np.uint8:
                frame = np.clip(frame, 0, 255).astype(np.uint8)
            obs[key] = orient_image(frame, cfg.orientation)
        eef_pos = np.asarray(raw["robot0_eef_pos"], dtype=np.float64)
        eef_quat = np.asarray(raw["robot0_eef_quat"], dtype=np.float64)
        gripper = np.asarray(raw["robot0_gripper_qpos"], dtype=np.float64)
        obs["robot0_eef_pos"] = eef_pos.astype(np.float32)
        obs["robot0_eef_quat"] = eef_quat.astype(np.float32)
        obs["robot0_gripper_qpos"] = gripper.astype(np.float32)
        obs["robot0_joint_pos"] = np.asarray(raw["robot0_joint_pos"], dtype=np.float32)
        obs["state"] = np.concatenate([eef_pos, quat_to_axis_angle(eef_quat), gripper]).astype(np.float32)
        if cfg.object_state:
            obs["object-state"] = np.asarray(raw["object-state"], dtype=np.float32)
        if cfg.scene_state:
            obs.update(read_scene(self._sim.env))
        self._last_obs = obs
        return obs

    def _info(self, success: bool) -> dict[str, Any]:
        return {
            "success": success,
            "is_success": success,  # the key lerobot and gymnasium-robotics read
            "instruction": self._task.instruction,
            "suite": self._task.suite,
            "task_id": self._task.task_id,
            "task_name": self._task.name,
            "init_state": self._init_state,
            "steps": self._steps,
            "seed": self._seed,
        }


@contextlib.contextmanager
def _numpy_global_restored(restore: bool) -> Iterator[None]:
    """Give numpy's global generator the state it had before the block (``restore`` false: leave it).

    LIBERO's region samplers (fixture placement) draw from ``np.random``; its ``env.seed`` seeds that
    generator, but under robosuite 1.5 the method is shadowed by robosuite's ``seed`` attribute, so a
    seeded reset seeds it itself, and must not leave the caller's generator seeded.
    """
    saved = np.random.get_state() if restore else None
    try:
        yield
    finally:
        if saved is not None:
            np.random.set_state(saved)
