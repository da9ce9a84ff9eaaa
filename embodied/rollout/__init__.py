"""Vectorised LIBERO rollouts: a policy in this process, one simulator per worker process."""

from wmrl.embodied.rollout.records import EpisodeRecord, EpisodeSpec, episode_seed
from wmrl.embodied.rollout.runner import RolloutConfig, RolloutRunner, WorkerError, run_episodes

__all__ = [
    "EpisodeRecord",
    "EpisodeSpec",
    "RolloutConfig",
    "RolloutRunner",
    "WorkerError",
    "episode_seed",
    "run_episodes",
]
