"""What a reward source reads from a rollout, and rollouts whose reward is known without grading.

A trainer keeps, for each rollout, only what its two sources read: an LLM world model reads the
generated text, a video reward model reads camera frames, and a multi-turn episode needs each turn's
*feedback* (the execution log the agent sees next, real or predicted). A source declares this with
an optional ``needs`` attribute holding a :class:`RolloutNeeds`; :func:`needs_of` reads it (a source
without one needs nothing beyond the item it is given). Trainers decide from it what to record (a
VLA rollout keeps the frames only when a source watches them) and refuse a configuration that cannot
work (K-turn episodes with a source that gives no feedback) before anything runs.

:class:`Exact` is an item an *item function* may return instead of a rollout to grade: its reward is
known exactly without asking either source (a reply with no program in it), identically in both
streams. The pipeline books it as a free item in both streams and never calls a source for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wmrl.core.config import require

__all__ = ["Exact", "Group", "RolloutNeeds", "needs_of"]


@dataclass(frozen=True)
class RolloutNeeds:
    """What a reward source reads from each rollout it grades.

    Attributes:
        text: the generated text (an agent's reply, a program).
        frames: camera frames per episode the source reads (0: none); the trainer records at least
            this many, uniformly spread over the episode, from ``camera``.
        camera: the camera those frames come from (``None``: the trainer's only camera).
        feedback: the source's ``grade()`` fills ``Grade.feedback``, the outcome the policy observes in
            its next turn; K-turn episodes need it from both sources.
    """

    text: bool = False
    frames: int = 0
    camera: str | None = None
    feedback: bool = False

    def __post_init__(self) -> None:
        require(
            isinstance(self.frames, int) and not isinstance(self.frames, bool) and self.frames >= 0,
            f"RolloutNeeds.frames must be an integer >= 0; got {self.frames!r}",
        )
        require(self.camera is None or bool(self.camera), "RolloutNeeds.camera must be None or a camera name")


def needs_of(source: Any) -> RolloutNeeds:
    """The :class:`RolloutNeeds` a source declares (``RolloutNeeds()`` when it declares none)."""
    if source is None:
        return RolloutNeeds()
    needs = getattr(source, "needs", None)
    if needs is None:
        return RolloutNeeds()
    if not isinstance(needs, RolloutNeeds):
        name = getattr(source, "name", type(source).__name__)
        raise TypeError(f"source {name!r}: `needs` must be a RolloutNeeds; got {type(needs).__name__}")
    return needs


@dataclass(frozen=True)
class Exact:
    """A rollout whose reward is known without grading (the same in both streams).

    Attributes:
        value: the reward (``None``: unknown).
        status: the outcome label (``"malformed"``).
        feedback: what the policy is shown for it in a multi-turn episode.
    """

    value: float | None
    status: str
    feedback: Any = None


@dataclass
class Group:
    """One GRPO group: G rollouts of one prompt or initial state.

    Attributes:
        key: unique within the step (anchor selection hashes it; make it stable across ranks).
        items: the G rollouts, in the order their advantages come back.
        task: the task the group belongs to (anchors are stratified by task; ``None``: one task).
    """

    key: str
    items: Sequence[Any]
    task: str | None = None
