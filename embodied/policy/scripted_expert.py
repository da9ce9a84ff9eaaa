"""The scripted expert as a policy: ``wmrl eval libero --policy scripted``.

A privileged policy: it reads the simulator's scene (object poses and collision boxes, region
sites; the environment adds them to the observation when ``LiberoEnvConfig.scene_state`` is on,
which :attr:`ScriptedExpert.observation_contract` asks for) and the task's BDDL goal, found from
the instruction, and drives :class:`~wmrl.embodied.policy.scripted_control.ScriptedController`.
Its actions follow the VLA convention (7-D deltas in [-1, 1], gripper -1 open / +1 close), so its
episodes are demonstrations a VLA can be trained on. It carries no weights and is not trainable.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.embodied.policy.base import ActionStep
from wmrl.embodied.policy.scripted_control import ExpertConfig, ScriptedController, config_from_dict

__all__ = ["ScriptedExpert", "load_scripted_policy", "task_goal"]


@functools.cache
def _goals(suite: str) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Instruction -> goal predicates of every task of ``suite`` (LIBERO's own BDDL parser)."""
    from wmrl.embodied.env.libero_setup import prepare_libero
    from wmrl.embodied.env.suites import list_tasks

    prepare_libero()
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    goals: dict[str, tuple[tuple[str, ...], ...]] = {}
    for task in list_tasks(suite):
        parsed = robosuite_parse_problem(str(task.bddl_file))
        goals[task.instruction] = tuple(tuple(str(x) for x in p) for p in parsed["goal_state"])
    return goals


def task_goal(suite: str, instruction: str) -> tuple[tuple[str, ...], ...]:
    """The BDDL goal predicates of the task of ``suite`` whose instruction is ``instruction``."""
    goals = _goals(suite)
    if instruction not in goals:
        raise ValueError(
            f"no task of {suite} has the instruction {instruction!r}; the scripted expert solves the "
            f"suite's own tasks ({len(goals)} instructions)"
        )
    return goals[instruction]


class ScriptedExpert:
    """A privileged closed-loop expert for LIBERO tasks (pick-and-place goals; see ``scripted_control``).

    Args:
        suite: the suite whose tasks it is asked to solve (instructions are looked up there).
        **settings: :class:`~wmrl.embodied.policy.scripted_control.ExpertConfig` fields.
    """

    observation_contract: Mapping[str, Any] = {"scene_state": True}

    def __init__(self, suite: str = "libero_10", **settings: Any) -> None:
        from wmrl.embodied.env.suites import check_suite

        self.suite = check_suite(suite)
        self.config: ExpertConfig = config_from_dict(settings)
        self._controller: ScriptedController | None = None
        self._instruction: str | None = None

    def reset(self) -> None:
        """Forget the episode (the next ``act`` plans from its observation)."""
        self._controller = None
        self._instruction = None

    def act(self, observation: Mapping[str, np.ndarray], instruction: str) -> ActionStep:
        """The next action, from the observation's proprioception and scene."""
        if not any(k.startswith("scene/") for k in observation):
            raise ValueError(
                "the scripted expert needs the privileged scene in its observations: build the "
                "environment with scene_state=True (wmrl eval does so for --policy scripted)"
            )
        if self._controller is None or instruction != self._instruction:
            self._controller = ScriptedController(task_goal(self.suite, instruction), self.config)
            self._instruction = instruction
        action = self._controller.act(observation, observation)
        return ActionStep(
            action=action, info={"phase": self._controller.phase, "gave_up": self._controller.gave_up}
        )

    @property
    def unsupported(self) -> list[tuple[str, ...]]:
        """Goal predicates of the current task that the expert cannot bring about (articulation)."""
        return [] if self._controller is None else list(self._controller.unsupported)

    def save(self, path: str | Path) -> Path:
        """Write ``policy.json`` (suite and settings) into the folder ``path``."""
        import dataclasses

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        spec = {"type": "scripted", "kwargs": {"suite": self.suite, **dataclasses.asdict(self.config)}}
        (folder / "policy.json").write_text(json.dumps(spec, indent=2) + "\n")
        return folder

    def __repr__(self) -> str:
        return f"ScriptedExpert(suite={self.suite!r}, config={self.config})"


def load_scripted_policy(path: str | Path | None = None, **kwargs: Any) -> ScriptedExpert:
    """Policy-loader factory for ``{"type": "scripted"}`` folders and the ``"scripted"`` spec."""
    return ScriptedExpert(**kwargs)
