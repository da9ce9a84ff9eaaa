"""Execution feedback: what the agent is told after each turn, in ONE format for real and predicted runs.

The real grader (``wmrl.autoresearch.grading``) and the world model both produce an
:class:`ExecutionFeedback`; :func:`format_feedback` turns either into the next user message.
Because the agent must not learn a different behaviour from predicted observations, the text has
no field only one side can fill:

* the position on the leaderboard is shown for every valid run, real or predicted (the world
  model predicts a position; the official release showed no score for predicted runs while the
  real environment printed one, a train-time observation shift);
* the raw metric value is *not* shown by default (the world model cannot predict it on the
  metric's scale); pass ``show_raw_score=True`` only where every feedback is real;
* nothing says whether the feedback was real or predicted.

Long outputs are capped in tokens, keeping the first 2/3 and the last 1/3 of each stream (a
traceback's exception line is at the end); the status, submission and position lines always stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from wmrl.autoresearch.agent.tokens import TokenCounter, as_token_counter, truncate_middle

__all__ = ["FEEDBACK_STATUSES", "STATUS_MEANING", "ExecutionFeedback", "format_feedback"]

#: What each status means, in the words the agent reads. The statuses are the grading ladder's
#: (``wmrl.autoresearch.grading.ladder.STATUSES``) plus ``malformed`` (no script in the reply).
STATUS_MEANING = {
    "valid": "the script ran and wrote a valid submission",
    "invalid_submission": "the script ran but its submission file failed validation",
    "no_submission": "the script ran to the end but wrote no submission file",
    "timeout": "the script was killed when it reached the time limit",
    "killed": "the script was killed for exceeding a resource limit (memory, processes or file size)",
    "runtime_error": "the script stopped with an error",
    "syntax_error": "the script does not compile, so it did not run",
    "malformed": "the reply contained no ```python code block, so nothing ran",
    "harness_error": "the environment failed to run the script (not the script's fault); treat this attempt as unjudged",
}
FEEDBACK_STATUSES = tuple(STATUS_MEANING)


@dataclass(frozen=True)
class ExecutionFeedback:
    """The outcome of one turn, as the agent will see it.

    Attributes:
        status: one of :data:`FEEDBACK_STATUSES`.
        stdout_tail: the end of what the script printed (already cut by the executor; cut again
            in tokens when formatted).
        stderr_tail: the end of its error stream (tracebacks).
        validation_error: why the submission was rejected (``invalid_submission``), else ``None``.
        score: the raw metric value of a valid submission (metric units), if known.
        position: leaderboard position score in [0, 1] of a valid submission (1 = beats every
            reference score), real or predicted.
        reward: the reward this outcome earned on the ladder, ``None`` when unknown.
    """

    status: str
    stdout_tail: str = ""
    stderr_tail: str = ""
    validation_error: str | None = None
    score: float | None = None
    position: float | None = None
    reward: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUS_MEANING:
            raise ValueError(
                f"ExecutionFeedback.status must be one of {FEEDBACK_STATUSES}; got {self.status!r}"
            )
        for name in ("stdout_tail", "stderr_tail"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"ExecutionFeedback.{name} must be a string")
        if self.position is not None and (not math.isfinite(self.position) or not 0 <= self.position <= 1):
            raise ValueError(f"ExecutionFeedback.position must be in [0, 1] or None; got {self.position!r}")
        if self.status == "valid" and self.position is None:
            raise ValueError("a valid ExecutionFeedback needs a position (real or predicted)")

    @classmethod
    def from_result(cls, result: Any) -> ExecutionFeedback:
        """Build from a grading result (``wmrl.autoresearch.grading.GradeResult`` or alike).

        The result's one-line ``reason`` becomes the validation error of a rejected submission;
        for other failures that printed nothing to stderr (a syntax error found before the run,
        a timeout) it stands in for the error stream, so the agent still reads what went wrong.
        """
        status = result.status
        reason = getattr(result, "reason", None)
        stderr = getattr(result, "stderr_tail", "") or ""
        if not stderr.strip() and reason and status not in ("valid", "invalid_submission", "no_submission"):
            stderr = str(reason)
        validation = None
        if status == "invalid_submission":
            validation = str(
                reason or getattr(result, "submission_error", None) or "the submission failed validation"
            )
        return cls(
            status=status,
            stdout_tail=getattr(result, "stdout_tail", "") or "",
            stderr_tail=stderr,
            validation_error=validation,
            score=getattr(result, "score", None),
            position=getattr(result, "position", None) if status == "valid" else None,
            reward=getattr(result, "reward", None),
        )


def format_feedback(
    feedback: ExecutionFeedback,
    max_tokens: int = 1000,
    tokens: TokenCounter | None = None,
    show_raw_score: bool = False,
) -> str:
    """The feedback text for the agent, at most ``max_tokens`` tokens.

    The status, submission and position lines are always kept; the error and output streams
    share the rest (stderr first: it holds the cause of a failure), each cut in the middle
    (its first 2/3 and last 1/3 kept) when too long.

    Args:
        feedback: the outcome to describe.
        max_tokens: cap on the whole text, in ``tokens`` units.
        tokens: token counter (default: approximate counts).
        show_raw_score: also print the raw metric value (only where all feedback is real).
    """
    counter = as_token_counter(tokens)
    head = [f"Execution status: {feedback.status} ({STATUS_MEANING[feedback.status]})"]
    tail: list[str] = []
    if feedback.status not in ("malformed", "syntax_error", "harness_error"):
        if feedback.status == "valid":
            tail.append("Submission: valid")
        elif feedback.validation_error:
            tail.append(f"Submission: rejected: {feedback.validation_error}")
        else:
            tail.append("Submission: none")
    if feedback.status == "valid":
        tail.append(
            f"Leaderboard position: {feedback.position:.3f} (fraction of reference entries beaten; 1.0 = best)"
        )
        if show_raw_score and feedback.score is not None:
            tail.append(f"Metric value: {feedback.score:.6g}")
    streams = [
        ("--- stderr (end) ---", feedback.stderr_tail.rstrip()),
        ("--- stdout (end) ---", feedback.stdout_tail.rstrip()),
    ]
    streams = [(title, body) for title, body in streams if body.strip()]
    fixed = "\n".join(head + [title for title, _ in streams] + tail)
    room = max_tokens - counter.count(fixed) - 2 * len(streams) - 2
    if streams and room < 8 * len(streams):
        raise ValueError(
            f"max_tokens={max_tokens} is too small for the feedback's fixed lines; use at least {counter.count(fixed) + 40}"
        )
    if len(streams) == 2:
        needs = [counter.count(body) for _, body in streams]
        first = min(needs[0], max(room * 2 // 3, room - needs[1]))
        budgets = [first, room - first]
    else:
        budgets = [room] * len(streams)
    lines = list(head)
    for (title, body), budget in zip(streams, budgets, strict=True):
        lines += [title, truncate_middle(body, max(budget, 1), counter)]
    text = "\n".join(lines + tail)
    return text if counter.count(text) <= max_tokens else truncate_middle(text, max_tokens, counter)
