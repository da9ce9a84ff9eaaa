"""LIBERO episodes on simulator workers on a real multi-raylet Ray cluster (``ray_cluster`` in conftest).

Nothing is mocked: three ``ray start`` raylets declaring a ``simulator`` resource join the session's
cluster, each simulator is a Ray actor holding a real LIBERO environment, and a lost node is a
raylet killed with SIGKILL in the middle of the batch. The records must be those of the same
episodes run in this process: the Ray option changes where the simulator runs, nothing else.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from wmrl.core.engines.ray.config import RayPoolConfig
from wmrl.embodied.env import LiberoEnvConfig
from wmrl.embodied.policy import ActionStep
from wmrl.embodied.rollout import EpisodeSpec, RolloutConfig, RolloutRunner, WorkerError, episode_seed

pytestmark = [pytest.mark.libero, pytest.mark.ray, pytest.mark.slow]

ENV = LiberoEnvConfig(task_id=0, cameras=(), max_steps=8)
SPECS = [EpisodeSpec(0, state, episode_seed(0, 0, state, 0), 0) for state in (0, 1, 2, 3)]


class StatePolicy:
    """Acts on the robot state alone (no memory, no randomness): the same episode wherever it runs."""

    def __init__(self, on_act=None):
        self.on_act = on_act
        self.calls = 0

    def reset(self, seed=None):
        pass

    def act(self, observation, instruction):
        self.calls += 1
        if self.on_act is not None:
            self.on_act(self.calls)
        state = np.asarray(observation["state"], dtype=np.float64)
        arm = np.tanh(5.0 * state[:6] + 0.3)
        grip = 1.0 if state[6] > state[7] else -1.0
        return ActionStep(action=np.append(arm, grip).astype(np.float32))


@pytest.fixture(scope="module")
def simulator_nodes(ray_cluster):
    """Three nodes that run simulators (each one at a time), named by a resource of their own."""
    nodes = {}
    try:
        for name in ("sim_a", "sim_b", "sim_c"):
            nodes[name] = ray_cluster.add_node(cpus=1, resources={"simulator": 1, name: 1})
        ray_cluster.wait_for_nodes()
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


def _node_ids() -> dict[str, str]:
    import ray

    out = {}
    for node in ray.nodes():
        for name in ("sim_a", "sim_b", "sim_c"):
            if node["Alive"] and name in node["Resources"]:
                out[node["NodeID"]] = name
    return out


def _lose(node) -> int:
    """The machine goes away: its raylet SIGKILLed, then every other process of the node (a raylet's
    workers outlive it for a while and would go on answering direct actor calls)."""
    pid = node.kill_raylet()
    node.stop(timeout_s=2.0)
    return pid


@pytest.fixture(scope="module")
def reference():
    with RolloutRunner(ENV, RolloutConfig(workers=0)) as runner:
        return runner.run(StatePolicy(), SPECS)


def _ray_config(ray_cluster, retries=2):
    return RolloutConfig(
        workers=2,
        on_error="retry",
        retries=retries,
        ray=RayPoolConfig(
            address=ray_cluster.address, slots=2, resources={"simulator": 1}, retries=retries, timeout_s=120
        ),
    )


def _same_episodes(records, reference):
    assert [r.spec for r in records] == SPECS
    for r, ref in zip(records, reference, strict=True):
        assert r.error is None
        assert (r.steps, r.success, r.truncated, r.instruction) == (
            ref.steps,
            ref.success,
            ref.truncated,
            ref.instruction,
        )
        np.testing.assert_array_equal(r.actions, ref.actions)
        np.testing.assert_array_equal(r.rewards, ref.rewards)


def test_episodes_on_ray_simulators_match_the_local_ones(ray_cluster, simulator_nodes, reference):
    assert not np.array_equal(reference[0].actions, reference[1].actions)  # the states differ: so do episodes
    with RolloutRunner(ENV, _ray_config(ray_cluster)) as runner:
        records = runner.run(StatePolicy(), SPECS)
        names = _node_ids()
        placed = [names.get(n) for n in runner.worker_nodes()]
    _same_episodes(records, reference)
    assert runner.failures == []
    assert len(set(placed)) == 2 and None not in placed  # one simulator per node, only on simulator nodes


def test_a_node_lost_mid_batch_moves_its_episodes_to_another(ray_cluster, simulator_nodes, reference):
    runner = RolloutRunner(ENV, _ray_config(ray_cluster))
    killed = {}

    def kill_a_node(calls):
        if calls == 11 and not killed:  # mid-episode on both simulators (8 steps each)
            name = _node_ids()[runner.worker_nodes()[0]]
            killed[name] = _lose(simulator_nodes[name])

    try:
        records = runner.run(StatePolicy(on_act=kill_a_node), SPECS)
        names = _node_ids()
        placed = [names.get(n) for n in runner.worker_nodes()]
    finally:
        runner.close()
    assert len(killed) == 1
    (lost,) = killed
    _same_episodes(records, reference)  # rerun from their reset elsewhere: the same episodes
    assert runner.failures, "no episode was moved: the node was not lost mid-batch"
    assert all("was lost" in reason for _, reason in runner.failures)
    assert lost not in placed and None not in placed


def _wait_until_ray_sees_only_live_nodes(simulator_nodes, timeout_s=90.0):
    """A node an earlier test stopped stays "alive" to Ray until its health checks fail; a simulator
    placed on it meanwhile never starts. Wait until Ray's view matches the nodes still running."""
    running = {name for name, node in simulator_nodes.items() if node.alive}
    deadline = time.monotonic() + timeout_s
    while set(_node_ids().values()) != running and time.monotonic() < deadline:
        time.sleep(0.5)
    assert set(_node_ids().values()) == running


def test_when_the_retries_run_out_the_run_fails_with_the_reason(ray_cluster, simulator_nodes):
    _wait_until_ray_sees_only_live_nodes(simulator_nodes)
    runner = RolloutRunner(ENV, _ray_config(ray_cluster, retries=0))
    killed = []

    def kill_a_node(calls):
        if calls == 3 and not killed:
            name = _node_ids()[runner.worker_nodes()[0]]
            killed.append(_lose(simulator_nodes[name]))

    try:
        with pytest.raises(WorkerError, match=r"failed on 1 simulators; the last: .*was lost"):
            runner.run(StatePolicy(on_act=kill_a_node), SPECS[:2])
    finally:
        runner.close()
    assert killed
