"""Record demonstrations in our simulator and replay a demonstration's actions to regenerate its frames.

Replay is what the official SFT does with each task's ``demo_0`` (and what OpenVLA's
``regenerate_libero_dataset.py`` does for its training data): place the demonstration's first
MuJoCo state, let the scene settle with the no-op action for ``settle_steps`` (10, as our episodes
do), then step the recorded actions, recording the observation *before* each action in our
orientation and resolution. Optionally, no-op actions are skipped as OpenVLA does (``|a[:6]| < 1e-4``
and the gripper command unchanged), which leaves the regenerated episode shorter. The result says
whether the replayed actions still reach the goal in this simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np

from wmrl.embodied.demos.types import Demo

__all__ = ["LabelledAction", "NothingRecorded", "ReplayResult", "is_noop", "record_demo", "replay_demo"]

NOOP_THRESHOLD = 1e-4


def is_noop(action: np.ndarray, previous: np.ndarray | None, threshold: float = NOOP_THRESHOLD) -> bool:
    """OpenVLA's no-op rule: arm command below ``threshold`` and the gripper command unchanged."""
    if previous is None:
        return bool(np.linalg.norm(action[:-1]) < threshold)
    return bool(np.linalg.norm(action[:-1]) < threshold and action[-1] == previous[-1])


class NothingRecorded(ValueError):
    """The labeller had no action for the episode's first step: there is no demonstration."""


class LabelledAction(NamedTuple):
    """What a step executes and what it records in its place (DAgger: the learner drives, the expert labels).

    Attributes:
        executed: ``(7,)`` the action stepped in the simulator.
        label: ``(7,)`` the action recorded for this step's frame; ``None`` = the labeller has no
            action worth learning here (the scripted expert gave up), which ends the recording.
    """

    executed: np.ndarray
    label: np.ndarray | None


@dataclass
class ReplayResult:
    """A replayed demonstration and what happened.

    Attributes:
        demo: the regenerated demonstration (frames paired with the actions that follow them).
        success: whether the goal held when the actions ran out (or earlier: replay stops there).
        success_step: index of the action after which the goal first held, or ``None``.
        skipped_noops: actions dropped as no-ops.
        max_state_error: largest distance between a recorded state and the replayed one before the
            same action (``None`` when the source has no states); how far the simulators diverge.
    """

    demo: Demo
    success: bool
    success_step: int | None
    skipped_noops: int
    max_state_error: float | None


def _frames_of(obs, cameras) -> dict[str, np.ndarray]:
    return {c: obs[f"{c}_image"] for c in cameras}


def replay_demo(env, demo: Demo, *, skip_noops: bool = False, stop_at_success: bool = True) -> ReplayResult:
    """Replay ``demo.actions`` from ``demo.states[0]`` (or ``demo.init_state``) in ``env`` and record.

    Args:
        env: a :class:`~wmrl.embodied.env.LiberoEnv` of the demonstration's suite, rendering the
            cameras (orientation, size) the regenerated frames should have; its task is switched to
            ``demo.task_id`` when known.
        demo: the demonstration (its own frames are not used).
        skip_noops: drop OpenVLA's no-op actions.
        stop_at_success: stop at the first step where the goal holds (the episode ends there).
    """
    if demo.labelled_by is not None:
        raise ValueError(
            f"{demo.name}: its actions are {demo.labelled_by!r}'s labels, not what was executed, so a "
            "replay would not reproduce its frames; train on its stored frames (data.replay=false)"
        )
    if demo.states is not None:
        options = {"state": demo.states[0]}
    elif demo.init_state is not None:
        options = {"init_state": demo.init_state}
    else:
        raise ValueError(f"{demo.name}: a replay needs the demonstration's states or its init_state")
    if demo.task_id is not None:
        options["task_id"] = demo.task_id
    obs, info = env.reset(seed=0, options=options)
    cameras = env.config.cameras
    frames: dict[str, list[np.ndarray]] = {c: [] for c in cameras}
    actions, states = [], []
    previous = None
    skipped = 0
    success, success_step, error = bool(info["success"]), None, None
    for t, action in enumerate(demo.actions):
        if skip_noops and is_noop(action, previous):
            skipped += 1
            continue
        previous = action
        state = env.sim_state()
        if demo.states is not None and not skip_noops:
            gap = float(np.linalg.norm(demo.states[t] - state)) if t > 0 else 0.0
            error = gap if error is None else max(error, gap)
        states.append(state)
        for c in cameras:
            frames[c].append(obs[f"{c}_image"])
        actions.append(np.asarray(action, dtype=np.float32))
        obs, _, terminated, truncated, info = env.step(action)
        if info["success"] and success_step is None:
            success_step = len(actions) - 1
        success = bool(info["success"])
        if (terminated and stop_at_success) or truncated:
            break
    if not actions:
        raise ValueError(f"{demo.name}: every action was a no-op")
    regenerated = Demo(
        instruction=env.instruction,
        actions=np.stack(actions),
        frames={c: np.stack(f) for c, f in frames.items()},
        orientation=env.config.orientation,
        suite=env.config.suite,
        task_id=env.task.task_id,
        states=np.stack(states),
        success=success,
        name=f"{demo.name} (replayed)",
        init_state=demo.init_state,
    )
    return ReplayResult(regenerated, success, success_step, skipped, error)


def record_demo(
    env,
    act: Callable[[dict, int], np.ndarray | LabelledAction] | Sequence[np.ndarray],
    *,
    init_state: int,
    task_id: int | None = None,
    steps: int | None = None,
    name: str = "",
    labelled_by: str | None = None,
) -> Demo:
    """Run an episode in ``env`` and keep it as a demonstration (frames before each action, states).

    Args:
        env: a :class:`~wmrl.embodied.env.LiberoEnv` rendering the cameras to record.
        act: ``act(observation, t) -> action`` (a scripted controller) or a sequence of actions.
            With ``labelled_by``, ``act`` returns a :class:`LabelledAction` instead: its ``executed``
            action is stepped and its ``label`` recorded; the episode ends at the first ``None`` label.
        init_state: the task's fixed initial state to start from.
        task_id: switch the environment to this task first.
        steps: at most this many actions (default: the sequence's length or the episode limit).
        labelled_by: the labelling policy's name, recorded in the demonstration (``Demo.labelled_by``).

    Raises:
        ValueError: ``act`` returned a :class:`LabelledAction` without ``labelled_by``, or the other
            way round (a demonstration must say whose actions it holds).
        NothingRecorded: the first label was ``None``.
    """
    options = {"init_state": init_state} | ({} if task_id is None else {"task_id": task_id})
    obs, info = env.reset(seed=0, options=options)
    sequence = None if callable(act) else [np.asarray(a, dtype=np.float32) for a in act]
    limit = steps if steps is not None else (len(sequence) if sequence is not None else env.max_steps)
    cameras = env.config.cameras
    frames: dict[str, list[np.ndarray]] = {c: [] for c in cameras}
    actions, states = [], []
    success = bool(info["success"])
    for t in range(limit):
        # no sequence: act is the callable (callable(act) above)
        chosen = sequence[t] if sequence is not None else cast(Callable[[dict, int], np.ndarray], act)(obs, t)
        if isinstance(chosen, LabelledAction) != (labelled_by is not None):
            raise ValueError(
                "act must return a LabelledAction exactly when labelled_by names the labeller; got "
                f"{type(chosen).__name__} with labelled_by={labelled_by!r}"
            )
        executed, label = chosen if isinstance(chosen, LabelledAction) else (chosen, chosen)
        if label is None:  # the labeller has nothing worth learning from here on
            break
        states.append(env.sim_state())
        for c in cameras:
            frames[c].append(obs[f"{c}_image"])
        actions.append(np.clip(np.asarray(label, dtype=np.float32), -1.0, 1.0))
        obs, _, terminated, truncated, info = env.step(
            np.clip(np.asarray(executed, dtype=np.float32), -1.0, 1.0)
        )
        success = bool(info["success"])
        if terminated or truncated:
            break
    if not actions:
        raise NothingRecorded(f"{labelled_by} had no action for the first step of state {init_state}")
    return Demo(
        instruction=env.instruction,
        actions=np.stack(actions),
        frames={c: np.stack(f) for c, f in frames.items()},
        orientation=env.config.orientation,
        suite=env.config.suite,
        task_id=env.task.task_id,
        states=np.stack(states),
        success=success,
        name=name or f"{env.config.suite}_task{env.task.task_id}_state{init_state}",
        init_state=init_state,
        labelled_by=labelled_by,
    )
