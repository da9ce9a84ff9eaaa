"""GRPO groups for VLA policies: G rollouts from ONE (task, initial state).

Within-group normalisation subtracts the group's mean reward, so the group mean is the baseline. A
group must therefore hold rollouts that differ *only* by the policy's sampling: same task, same
initial state. The official WMRL trainer keyed its groups by task and spread a group over 16
initial states (``init_state = g mod 16``), so its baseline mixed the policy's luck with how hard
each initial state is. Here a group is one (task, initial state) pair, and the initial states come
from the in-domain split only (:mod:`wmrl.embodied.env.splits`); held-out states stay unseen.

Which groups a step runs is a pure function of ``(seed, step)``: tasks in rotation (every task gets
its share of groups, and the scheduler's per-task stratification sees every task), initial states
drawn without replacement per task and step. A resumed run therefore picks the same groups as an
uninterrupted one without saving any sampler state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wmrl.embodied.env.splits import IN_DOMAIN_STATES
from wmrl.embodied.rollout.records import EpisodeSpec, episode_seed

__all__ = ["GroupSpec", "choose_groups", "episode_specs", "group_records"]

_STREAM = 0x67_72_6F_75  # separates the group-choice random stream from every other use of the seed


@dataclass(frozen=True)
class GroupSpec:
    """One GRPO group: G rollouts of task ``task_id`` from initial state ``init_state``."""

    task_id: int
    init_state: int

    @property
    def key(self) -> str:
        """The group key the anchor scheduler hashes (unique within a step)."""
        return f"task{self.task_id}/state{self.init_state}"

    @property
    def task_key(self) -> str:
        """The stratum of the scheduler and of per-task calibration."""
        return f"task{self.task_id}"


def choose_groups(
    step: int, tasks: Sequence[int], states: Sequence[int], n_groups: int, seed: int
) -> list[GroupSpec]:
    """The ``n_groups`` distinct (task, initial state) groups of training step ``step``.

    Group ``j`` of step ``s`` trains task ``tasks[(s * n_groups + j) % len(tasks)]``; each task's initial
    states are drawn without replacement from ``states`` with a generator seeded by ``(seed, step)``.

    Raises:
        ValueError: a held-out initial state, or more groups of one task than it has states.
    """
    tasks, states = list(tasks), list(states)
    if not tasks or not states:
        raise ValueError("choose_groups needs at least one task and one initial state")
    held_out = [s for s in states if s not in IN_DOMAIN_STATES]
    if held_out:
        raise ValueError(
            f"initial states {held_out} are held out for evaluation; training uses in-domain states only"
        )
    if step < 0 or n_groups < 1:
        raise ValueError(f"step must be >= 0 and n_groups >= 1; got step={step}, n_groups={n_groups}")
    task_of = [tasks[(step * n_groups + j) % len(tasks)] for j in range(n_groups)]
    need = {t: task_of.count(t) for t in set(task_of)}
    if max(need.values()) > len(states):
        raise ValueError(
            f"{n_groups} groups over {len(tasks)} tasks need {max(need.values())} distinct initial states per "
            f"task; only {len(states)} are trained on"
        )
    rng = np.random.default_rng([int(seed), int(step), _STREAM])
    drawn = {t: [states[i] for i in rng.permutation(len(states))[: need[t]]] for t in sorted(need)}
    groups = []
    for t in task_of:
        groups.append(GroupSpec(int(t), int(drawn[t].pop(0))))
    return groups


def episode_specs(
    groups: Sequence[GroupSpec], group_size: int, step: int, seed: int, record_frames: bool
) -> list[EpisodeSpec]:
    """Group-major episode specs: ``group_size`` rollouts per group, each with its own seed.

    Rollout ``i`` of a group at step ``s`` gets ``episode_seed(seed, task, state, s * G + i)``: distinct
    across rollouts and steps, identical on a resumed run.
    """
    return [
        EpisodeSpec(
            g.task_id,
            g.init_state,
            episode_seed(seed, g.task_id, g.init_state, step * group_size + i),
            rollout=i,
            record_frames=record_frames,
        )
        for g in groups
        for i in range(group_size)
    ]


def group_records(records: Sequence, groups: Sequence[GroupSpec], group_size: int) -> list[list]:
    """Split group-major ``records`` back into groups, checking each holds its group's (task, state)."""
    if len(records) != len(groups) * group_size:
        raise ValueError(f"{len(records)} records for {len(groups)} groups of {group_size}")
    out = []
    for j, g in enumerate(groups):
        members = list(records[j * group_size : (j + 1) * group_size])
        for r in members:
            if (r.spec.task_id, r.spec.init_state) != (g.task_id, g.init_state):
                raise ValueError(
                    f"record of task {r.spec.task_id} state {r.spec.init_state} found in group {g.key}"
                )
        out.append(members)
    return out
