"""Multi-turn episodes: K attempts, each graded, each result the next observation.

An :class:`Episode` holds the chat so far and the per-turn rewards::

    ep = Episode(system_prompt(env, turns=3), first_user_message(overview), EpisodeConfig(turns=3))
    while not ep.done:
        action = ep.add_reply(policy(ep.messages))      # parse the reply (malformed -> no code)
        feedback = grade(action)                          # real run or world model -> ExecutionFeedback
        ep.add_feedback(feedback)                         # appends the next user message if turns remain
    ep.reward()                                           # best turn by default

A malformed reply is a graded outcome (its ladder reward, 0 by default) and is shown to the agent
like any other result. An unknown reward (``None``: harness failure, unparseable world-model
output) stays unknown: by default the trajectory's reward is then unknown too, since the unknown
turn might have been the best (``unknown="ignore"`` takes the best of the known turns instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from wmrl.autoresearch.agent.actions import Action, parse_action
from wmrl.autoresearch.agent.feedback import ExecutionFeedback, format_feedback
from wmrl.autoresearch.agent.prompts import next_user_message
from wmrl.autoresearch.agent.tokens import TokenCounter

__all__ = ["Episode", "EpisodeConfig", "trajectory_reward"]

_AGGREGATIONS = ("best", "last", "mean")
_UNKNOWN = ("propagate", "ignore")


@dataclass(frozen=True)
class EpisodeConfig:
    """Episode settings.

    Attributes:
        turns: attempts per episode (K >= 1); 1 = single-turn GRPO.
        aggregation: trajectory reward from turn rewards: ``best`` (max), ``last`` or ``mean``.
        unknown: ``propagate`` (any unknown turn makes the trajectory unknown) or ``ignore``
            (aggregate the known turns; unknown only if all are).
        feedback_max_tokens: cap on each feedback message (head 2/3 + tail 1/3).
    """

    turns: int = 1
    aggregation: Literal["best", "last", "mean"] = "best"
    unknown: Literal["propagate", "ignore"] = "propagate"
    feedback_max_tokens: int = 300

    def __post_init__(self) -> None:
        if isinstance(self.turns, bool) or not isinstance(self.turns, int) or self.turns < 1:
            raise ValueError(f"EpisodeConfig.turns must be an int >= 1; got {self.turns!r}")
        if self.aggregation not in _AGGREGATIONS:
            raise ValueError(
                f"EpisodeConfig.aggregation must be one of {_AGGREGATIONS}; got {self.aggregation!r}"
            )
        if self.unknown not in _UNKNOWN:
            raise ValueError(f"EpisodeConfig.unknown must be one of {_UNKNOWN}; got {self.unknown!r}")
        if (
            isinstance(self.feedback_max_tokens, bool)
            or not isinstance(self.feedback_max_tokens, int)
            or self.feedback_max_tokens < 64
        ):
            raise ValueError(
                f"EpisodeConfig.feedback_max_tokens must be an int >= 64; got {self.feedback_max_tokens!r}"
            )


def trajectory_reward(
    rewards: Sequence[float | None], aggregation: str = "best", unknown: str = "propagate"
) -> float | None:
    """Aggregate per-turn rewards (``None`` = unknown) into the trajectory's reward."""
    if aggregation not in _AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {_AGGREGATIONS}; got {aggregation!r}")
    if unknown not in _UNKNOWN:
        raise ValueError(f"unknown must be one of {_UNKNOWN}; got {unknown!r}")
    if not rewards:
        return None
    known = [float(r) for r in rewards if r is not None]
    if not known or (unknown == "propagate" and len(known) < len(rewards)):
        return None
    if aggregation == "best":
        return max(known)
    if aggregation == "last":
        return float(rewards[-1]) if rewards[-1] is not None else None
    return sum(known) / len(known)


@dataclass
class Episode:
    """One K-turn episode's chat and outcomes (see the module docstring)."""

    system: str
    first_user: str
    config: EpisodeConfig = field(default_factory=EpisodeConfig)
    tokens: TokenCounter | None = None
    messages: list[dict[str, str]] = field(init=False)
    actions: list[Action] = field(init=False, default_factory=list)
    feedbacks: list[ExecutionFeedback] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.first_user},
        ]

    @property
    def turn(self) -> int:
        """Attempts made so far."""
        return len(self.actions)

    @property
    def done(self) -> bool:
        return len(self.feedbacks) >= self.config.turns

    @property
    def awaiting_feedback(self) -> bool:
        return len(self.actions) > len(self.feedbacks)

    def add_reply(self, text: str) -> Action:
        """Record the agent's reply to the current observation and parse it."""
        if self.done:
            raise RuntimeError(f"the episode is over ({self.config.turns} turns); no more replies")
        if self.awaiting_feedback:
            raise RuntimeError("the last reply has no feedback yet; call add_feedback first")
        action = parse_action(text)
        self.messages.append({"role": "assistant", "content": text})
        self.actions.append(action)
        return action

    def add_feedback(self, feedback: ExecutionFeedback) -> str | None:
        """Record the outcome of the last reply; returns the next user message (None when done)."""
        if not self.awaiting_feedback:
            raise RuntimeError("there is no reply awaiting feedback")
        if not isinstance(feedback, ExecutionFeedback):
            raise TypeError(f"feedback must be an ExecutionFeedback; got {type(feedback).__name__}")
        self.feedbacks.append(feedback)
        if self.done:
            return None
        text = format_feedback(feedback, self.config.feedback_max_tokens, self.tokens)
        message = next_user_message(text, self.turn, self.config.turns)
        self.messages.append({"role": "user", "content": message})
        return message

    @property
    def rewards(self) -> list[float | None]:
        return [f.reward for f in self.feedbacks]

    def reward(self) -> float | None:
        """The trajectory's reward under the configured aggregation."""
        return trajectory_reward(self.rewards, self.config.aggregation, self.config.unknown)
