"""From a completion to what the two reward streams grade, and per-turn outcomes for K-turn episodes.

The trainer is generic over core :class:`~wmrl.core.sources.RewardSource` pairs: an *item
function* turns one completion (text + its dataset row) into the item both sources grade. For
AutoResearch the item is a :class:`~wmrl.autoresearch.tasks.Solution` (task + script parsed from
the reply). A reply with no script is ``malformed``: its reward is the ladder's syntax-error rung,
known exactly without asking either source (:class:`Exact`), identically in both streams. (The
real grader would otherwise *run* an empty script and call it "no submission".)

For K > 1 the trainer also needs each turn's feedback: :func:`execution_turns` (real runs, the
grader's own result) and :func:`world_model_turns` (the world model's predicted run, in the same
:class:`~wmrl.autoresearch.agent.feedback.ExecutionFeedback` format) turn a batch of items into
:class:`TurnOutcome` records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wmrl.autoresearch.agent.actions import parse_action
from wmrl.autoresearch.agent.feedback import ExecutionFeedback
from wmrl.autoresearch.grading.ladder import RewardLadder
from wmrl.autoresearch.tasks.model import Solution

__all__ = [
    "Exact",
    "ItemFn",
    "TurnGrader",
    "TurnOutcome",
    "completion_text",
    "execution_turns",
    "solution_items",
    "world_model_turns",
]


@dataclass(frozen=True)
class Exact:
    """A rollout whose reward is known without grading (the same in both streams).

    Attributes:
        value: the reward (``None``: unknown).
        status: the outcome label (``"malformed"``).
        feedback: what the agent is shown for it in a K-turn episode.
    """

    value: float | None
    status: str
    feedback: ExecutionFeedback | None = None


#: ``(completion text, dataset row) -> item or Exact``.
ItemFn = Callable[[str, Mapping[str, Any]], Any]


def completion_text(completion: Any) -> str:
    """The generated text of a TRL completion (a string, or a list of chat messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        content = completion[-1].get("content", "")
        if isinstance(content, str):
            return content
        # typed content blocks: keep the text parts
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise TypeError(f"cannot read the text of a completion of type {type(completion).__name__}")


def solution_items(task_column: str = "task_ref", ladder: RewardLadder | None = None) -> ItemFn:
    """The AutoResearch item function: the reply's script as a ``Solution`` on the row's task.

    A reply without a script becomes ``Exact(ladder.syntax_error, "malformed")``.
    """
    rung = (ladder or RewardLadder()).reward("syntax_error")

    def item(text: str, row: Mapping[str, Any]) -> Solution | Exact:
        if task_column not in row:
            raise KeyError(
                f"the training dataset needs a {task_column!r} column (a task reference per prompt)"
            )
        action = parse_action(text)
        if action.malformed:
            return Exact(rung, "malformed", ExecutionFeedback("malformed", reward=rung))
        return Solution(str(row[task_column]), action.code or "")

    return item


@dataclass(frozen=True)
class TurnOutcome:
    """One graded turn: its reward (``None`` = unknown) and the feedback the agent reads next."""

    reward: float | None
    feedback: ExecutionFeedback


#: ``items -> one TurnOutcome per item``.
TurnGrader = Callable[[Sequence[Any]], list[TurnOutcome]]


def _harness_feedback(reason: str) -> ExecutionFeedback:
    return ExecutionFeedback("harness_error", stderr_tail=reason, reward=None)


def execution_turns(source: Any) -> TurnGrader:
    """Per-turn outcomes from real execution (an ``ExecutionRewardSource``: ``grade_results``)."""
    grade_results = getattr(source, "grade_results", None)
    if not callable(grade_results):
        raise TypeError(
            "K-turn episodes need the anchor's execution feedback: the anchor must be an "
            f"ExecutionRewardSource (with grade_results); got {type(source).__name__}"
        )

    def grade(items: Sequence[Any]) -> list[TurnOutcome]:
        return [TurnOutcome(r.reward, ExecutionFeedback.from_result(r)) for r in grade_results(list(items))]

    return grade


def world_model_turns(world_model: Any) -> TurnGrader:
    """Per-turn outcomes predicted by the world model (a ``WorldModel``: ``predict``)."""
    predict = getattr(world_model, "predict", None)
    if not callable(predict):
        raise TypeError(
            "K-turn episodes need the world model's predicted feedback: the world model must be a "
            f"wmrl.autoresearch.worldmodel.WorldModel (with predict); got {type(world_model).__name__}"
        )

    def grade(items: Sequence[Any]) -> list[TurnOutcome]:
        out = []
        for outcome in predict(list(items)):
            feedback = outcome.feedback
            if feedback is None or outcome.grade.value is None:
                reason = str(outcome.grade.info.get("reason", "the world model gave no prediction"))
                out.append(TurnOutcome(None, _harness_feedback(reason)))
            else:
                out.append(TurnOutcome(outcome.grade.value, feedback))
        return out

    return grade
