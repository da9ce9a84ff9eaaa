"""What a rollout is asked to do (:class:`EpisodeSpec`) and what it brings back (:class:`EpisodeRecord`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["EpisodeRecord", "EpisodeSpec", "episode_seed"]


def episode_seed(base_seed: int, task_id: int, init_state: int, rollout: int) -> int:
    """A 31-bit seed for one episode, a pure function of its coordinates.

    Derived with numpy's ``SeedSequence`` so nearby coordinates give unrelated seeds, and the
    same (base seed, task, initial state, rollout) always gives the same seed, whatever order or
    worker runs the episode in.
    """
    for name, value in (
        ("base_seed", base_seed),
        ("task_id", task_id),
        ("init_state", init_state),
        ("rollout", rollout),
    ):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
    seq = np.random.SeedSequence([int(base_seed), int(task_id), int(init_state), int(rollout)])
    return int(seq.generate_state(1, dtype=np.uint32)[0] >> 1)


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run.

    Attributes:
        task_id: task index in the runner's suite.
        init_state: index of the task's fixed initial state.
        seed: episode seed, given to the environment's ``reset`` and to ``policy.reset(seed=...)``
            when the policy's ``reset`` accepts a ``seed`` argument.
        rollout: index of this rollout among those from the same (task, initial state).
        record_frames: keep the camera frames of this episode (videos, world-model scoring).
    """

    task_id: int
    init_state: int
    seed: int
    rollout: int = 0
    record_frames: bool = False

    def __post_init__(self) -> None:
        for name in ("task_id", "init_state", "seed", "rollout"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"EpisodeSpec.{name} must be a non-negative integer; got {value!r}")
            object.__setattr__(self, name, int(value))


@dataclass
class EpisodeRecord:
    """The outcome and trace of one episode. ``T`` = number of policy steps taken.

    Attributes:
        spec: the episode that was asked for.
        instruction: the language instruction the policy received.
        success: whether the task's goal held at the end (LIBERO's sparse success).
        steps: ``T``.
        terminated: ended by success.
        truncated: ended by the step limit.
        actions: ``(T, 7)`` float32, the actions sent to the simulator.
        rewards: ``(T,)`` float32, the simulator's sparse rewards.
        token_ids: ``(T, A)`` int64, the policy's action tokens, or ``None`` if it gave none.
        log_probs: ``(T,)`` float64, the policy's log-probability of each step's tokens (nats),
            or ``None`` if it gave none.
        step_info: ``T`` dicts, the ``ActionStep.info`` of each step.
        frames: camera name -> ``(N, H, W, 3)`` uint8 oriented frames, when the spec asked for
            them; frame ``i`` was observed after ``frame_steps[i]`` policy steps (0 = after settling).
        frame_steps: ``(N,)`` int, see ``frames``.
        observations: the ``T`` observations the policy acted on, when the runner keeps them
            (RL needs them to re-score tokens); else ``None``.
        wall_s: seconds from the episode's reset request to its last step.
        reset_s: seconds from the reset request to the settled first observation (includes
            rebuilding the scene on a task switch and the settle steps).
        policy_s: seconds spent in the policy for this episode.
        error: ``None``, or why the simulator failed in this episode (one line); such an episode
            counts as a failure (``RolloutConfig.on_error="record"``).
        error_details: the simulator's traceback for ``error``.
    """

    spec: EpisodeSpec
    instruction: str
    success: bool
    steps: int
    terminated: bool
    truncated: bool
    actions: np.ndarray
    rewards: np.ndarray
    token_ids: np.ndarray | None
    log_probs: np.ndarray | None
    step_info: list[dict[str, Any]] = field(default_factory=list)
    frames: dict[str, np.ndarray] = field(default_factory=dict)
    frame_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    observations: list[dict[str, np.ndarray]] | None = None
    wall_s: float = 0.0
    reset_s: float = 0.0
    policy_s: float = 0.0
    error: str | None = None
    error_details: str | None = None

    @property
    def sum_reward(self) -> float:
        """Sum of the sparse rewards (lerobot's ``sum_reward``)."""
        return float(np.sum(self.rewards)) if self.rewards.size else 0.0

    @property
    def max_reward(self) -> float:
        """Maximum sparse reward (lerobot's ``max_reward``); 0.0 for an episode with no step."""
        return float(np.max(self.rewards)) if self.rewards.size else 0.0
