"""K-turn AutoResearch episodes for the core TRL trainer: the agent's :class:`Episode` as a ``TurnEpisode``.

The core rollout (:mod:`wmrl.core.engines.trl.multiturn`) generates, grades each turn through the
reward pipeline and appends each observation; what a reply and an outcome *mean* is the agent's:
the reply is parsed into plan + script, the outcome becomes the next user message through the same
:func:`~wmrl.autoresearch.agent.feedback.format_feedback` for real and predicted runs, and the
trajectory reward is the configured aggregation of the turn rewards (best turn by default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from wmrl.autoresearch.agent.episode import Episode, EpisodeConfig, trajectory_reward
from wmrl.autoresearch.agent.feedback import ExecutionFeedback
from wmrl.autoresearch.agent.tokens import HFTokens

__all__ = ["AgentEpisode", "episode_factory"]


class AgentEpisode:
    """One agent episode in the shape the core K-turn rollout drives (``TurnEpisode``)."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode

    def add_reply(self, text: str) -> Any:
        return self.episode.add_reply(text)

    def add_outcome(self, reward: float | None, feedback: Any, status: str | None) -> str | None:
        if not isinstance(feedback, ExecutionFeedback):
            # no stream produced an observation (a harness failure, an unparseable prediction)
            feedback = (
                ExecutionFeedback("harness_error", reward=None)
                if reward is None
                else ExecutionFeedback(status or "malformed", reward=reward)
            )
        return self.episode.add_feedback(feedback)

    def reward(self) -> float | None:
        return self.episode.reward()

    def aggregate(self, rewards: Sequence[float | None]) -> float | None:
        config = self.episode.config
        return trajectory_reward(list(rewards), config.aggregation, config.unknown)


def episode_factory(config: EpisodeConfig, tokenizer: Any):
    """``(prompt, row) -> AgentEpisode`` for conversational ``[system, user]`` prompts (the task overview)."""
    tokens = HFTokens(tokenizer)

    def make(prompt: Any, row: Mapping[str, Any]) -> AgentEpisode:
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
            raise TypeError(
                "K-turn rollouts need conversational prompts (a list of {'role', 'content'} messages)"
            )
        system = prompt[0]["content"] if prompt[0].get("role") == "system" else ""
        users = [m["content"] for m in prompt if m.get("role") == "user"]
        if len(users) != 1 or len(prompt) != (2 if system else 1):
            raise ValueError(
                "K-turn prompts must be [system, user] or [user] (the task overview as the one user message)"
            )
        return AgentEpisode(Episode(system, users[0], config, tokens=tokens))

    return make
