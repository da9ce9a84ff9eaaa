"""Vectorised rollouts against the real LIBERO simulator, in-process and in worker processes."""

from __future__ import annotations

import numpy as np
import pytest

from wmrl.embodied.env import LiberoEnvConfig
from wmrl.embodied.policy import ActionStep, RandomPolicy
from wmrl.embodied.rollout import (
    EpisodeSpec,
    RolloutConfig,
    RolloutRunner,
    WorkerError,
    episode_seed,
    run_episodes,
)

pytestmark = pytest.mark.libero


def _specs(pairs, record_frames=False):
    return [
        EpisodeSpec(task, state, episode_seed(0, task, state, r), r, record_frames=record_frames)
        for task, state, r in pairs
    ]


class NoTokenPolicy:
    """A deterministic policy without tokens: opens and closes the gripper in turn, arm still."""

    def __init__(self):
        self.t = 0
        self.resets = 0

    def reset(self):
        self.t = 0
        self.resets += 1

    def act(self, observation, instruction):
        assert isinstance(instruction, str) and instruction
        self.t += 1
        return ActionStep(action=np.array([0, 0, 0, 0, 0, 0, 1.0 if self.t % 2 else -1.0], dtype=np.float32))


def test_episode_seed_is_a_pure_function_of_coordinates():
    assert episode_seed(0, 1, 2, 3) == episode_seed(0, 1, 2, 3)
    seeds = {episode_seed(0, t, s, r) for t in range(10) for s in range(50) for r in range(4)}
    assert len(seeds) == 2000
    assert all(0 <= x < 2**31 for x in seeds)
    with pytest.raises(ValueError, match="non-negative integer"):
        episode_seed(0, -1, 0, 0)


def test_in_process_rollouts_record_actions_tokens_and_log_probs():
    cfg = LiberoEnvConfig(task_id=0, cameras=(), max_steps=4)
    specs = _specs([(0, 0, 0), (0, 1, 0), (0, 0, 1)])
    seen = []
    with RolloutRunner(cfg, RolloutConfig(workers=0, keep_observations=True)) as runner:
        records = runner.run(RandomPolicy(seed=0, n_bins=256), specs, progress=seen.append)
        again = runner.run(RandomPolicy(seed=99), specs)  # reset(seed=...) makes the policy seed irrelevant
        no_tokens = runner.run(NoTokenPolicy(), specs[:1])
        with pytest.raises(WorkerError, match="init_state must be an integer"):
            runner.run(RandomPolicy(), _specs([(0, 50, 0)]))
    assert [r.spec for r in records] == specs
    assert sorted(id(r) for r in seen) == sorted(id(r) for r in records)
    for r in records:
        assert r.steps == 4 and r.truncated and not r.terminated and not r.success
        assert r.actions.shape == (4, 7) and r.actions.dtype == np.float32
        assert r.token_ids.shape == (4, 7) and r.token_ids.dtype == np.int64
        np.testing.assert_allclose(r.log_probs, -7 * np.log(256))
        assert r.rewards.shape == (4,) and r.sum_reward == 0.0
        assert r.instruction == "put both the alphabet soup and the tomato sauce in the basket"
        assert len(r.observations) == 4 and r.observations[0]["state"].shape == (8,)
        assert r.frames == {}
        # Bins map to bin centres; the gripper dimension is binary.
        np.testing.assert_allclose(r.actions[:, :6], -1 + (2 * r.token_ids[:, :6] + 1) / 256, atol=1e-6)
        assert set(np.unique(r.actions[:, 6])) <= {-1.0, 1.0}
    for a, b in zip(records, again, strict=True):
        np.testing.assert_array_equal(a.actions, b.actions)
    # Different episodes (state, rollout) get different seeds, hence different actions.
    assert not np.array_equal(records[0].actions, records[2].actions)
    assert no_tokens[0].token_ids is None and no_tokens[0].log_probs is None
    np.testing.assert_array_equal(no_tokens[0].actions[:, 6], [1, -1, 1, -1])


class BatchPolicy:
    """Counts batched calls; arm still, gripper open."""

    def __init__(self):
        self.calls = []

    def reset(self, seed=None):
        pass

    def act(self, observation, instruction):  # pragma: no cover - act_batch must be preferred
        raise AssertionError("act() called although act_batch() exists")

    def act_batch(self, observations, instructions):
        self.calls.append(len(observations))
        return [ActionStep(action=np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)) for _ in observations]


@pytest.mark.slow
def test_two_worker_processes_match_in_process_and_keep_frames():
    """Two simulator processes, two tasks, frames for video: same actions and outcomes as in-process."""
    cfg = LiberoEnvConfig(task_id=0, cameras=("agentview",), image_height=32, image_width=32, max_steps=6)
    specs = _specs([(0, 0, 0), (1, 2, 0), (0, 5, 0)], record_frames=True)
    rollout_cfg = RolloutConfig(workers=2, frame_stride=2)
    with RolloutRunner(cfg, rollout_cfg) as runner:
        parallel = runner.run([RandomPolicy(), RandomPolicy()], specs)
        batch_policy = BatchPolicy()
        batched = runner.run(batch_policy, specs[:2])
    serial = run_episodes(cfg, RandomPolicy(), specs, RolloutConfig(workers=0, frame_stride=2))
    assert [r.spec for r in parallel] == specs
    for p, s in zip(parallel, serial, strict=True):
        np.testing.assert_array_equal(p.actions, s.actions)
        assert p.success == s.success and p.steps == s.steps == 6
        # Frames after settling (step 0), every 2nd step, and the last: steps 0, 2, 4, 6.
        np.testing.assert_array_equal(p.frame_steps, [0, 2, 4, 6])
        assert p.frames["agentview"].shape == (4, 32, 32, 3)
        np.testing.assert_array_equal(p.frames["agentview"], s.frames["agentview"])
    assert parallel[1].instruction != parallel[0].instruction  # task 1 ran in a worker
    assert max(batch_policy.calls) == 2  # both workers served in one batched call
    assert all(len(r.actions) == 6 for r in batched)
