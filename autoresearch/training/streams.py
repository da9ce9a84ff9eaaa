"""From a completion to what the two reward streams grade: the AutoResearch item function.

The core TRL trainer (:class:`wmrl.core.engines.trl.WMRLGRPOTrainer`) is generic over reward
sources; an *item function* turns one completion (text + its dataset row) into the item both
sources grade. Here the item is a :class:`~wmrl.autoresearch.tasks.Solution` (task + script parsed
from the reply). A reply with no script is ``malformed``: its reward is the ladder's syntax-error
rung, known exactly without asking either source (:class:`~wmrl.core.rollouts.Exact`), identically
in both streams. (The real grader would otherwise *run* an empty script and call it "no submission".)
With the ``model`` action the row carries the fixed pipeline (``slot_head``, ``slot_tail``) and the
item is the assembled script (:func:`~wmrl.autoresearch.training.model_slot.assemble`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wmrl.autoresearch.agent.actions import parse_action
from wmrl.autoresearch.agent.feedback import ExecutionFeedback
from wmrl.autoresearch.grading.ladder import RewardLadder
from wmrl.autoresearch.tasks.model import Solution
from wmrl.autoresearch.tasks.normalised import normalised_code, solution_key
from wmrl.autoresearch.training.model_slot import assemble
from wmrl.core.rollouts import Exact

__all__ = [
    "EXECUTION_METRICS",
    "ItemFn",
    "execution_metrics",
    "normalised_code",
    "solution_items",
    "solution_key",
]

#: What :func:`execution_metrics` logs each step, over the step's real executions.
EXECUTION_METRICS = {
    "executed/valid_rate": "share of executed rollouts with a valid submission",
    "executed/position": "mean leaderboard position score of executed rollouts (0 when not valid): avg@k's formula",
    "executed/valid_position": "mean position of the valid executed rollouts",
}

#: ``(completion text, dataset row) -> item or Exact``.
ItemFn = Callable[[str, Mapping[str, Any]], Any]


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
        code = action.code or ""
        if row.get("slot_head") is not None:  # the model action: the reply is the block of a fixed pipeline
            code = assemble(row["slot_head"], code, row.get("slot_tail") or "")
        return Solution(str(row[task_column]), code)

    return item


def execution_metrics(grades: Sequence[Any]) -> dict[str, float | None]:
    """Each step's measured outcome of the rollouts really executed (see :data:`EXECUTION_METRICS`).

    ``grades``: the step's real-execution :class:`~wmrl.core.sources.Grade` s (``info`` is the grading
    result's dict). Harness failures (value ``None``) are left out; with none left every value is ``None``.
    """
    known = [g for g in grades if g.value is not None]
    if not known:
        return dict.fromkeys(EXECUTION_METRICS)
    positions = [float(g.info.get("position") or 0.0) if g.status == "valid" else 0.0 for g in known]
    valid = [p for g, p in zip(known, positions, strict=True) if g.status == "valid"]
    return {
        "executed/valid_rate": len(valid) / len(known),
        "executed/position": sum(positions) / len(known),
        "executed/valid_position": sum(valid) / len(valid) if valid else None,
    }
