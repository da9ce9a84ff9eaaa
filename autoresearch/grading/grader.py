"""Grade a solution script end to end: compile, run in the sandbox, score, reward.

:class:`ExecutionGrader` is the anchor's engine. It never lets a failure of its own pass for a
failure of the solution: anything that goes wrong in the harness (the sandbox cannot start, the
answers file is missing, an unexpected exception) gives status ``harness_error`` and reward
``None`` with the reason.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wmrl.autoresearch.grading.ladder import RewardLadder
from wmrl.autoresearch.grading.scoring import SubmissionScore, score_submission
from wmrl.autoresearch.grading.staging import staged_public_dir
from wmrl.autoresearch.grading.validation import SubmissionError, read_answers, submission_byte_limit
from wmrl.autoresearch.tasks.model import Task
from wmrl.core.sources import Grade

__all__ = ["ExecutionGrader", "GradeResult", "check_syntax"]

_TAIL = 4000  # characters of stdout/stderr kept in a grade


@dataclass(frozen=True)
class GradeResult:
    """Everything known about one graded execution.

    Attributes:
        task_id: the task's id.
        status: one of ``wmrl.autoresearch.grading.ladder.STATUSES``.
        reward: the ladder's reward, or None for a harness error (unknown).
        score: the metric on the whole test set (None unless the submission was valid).
        board_scores: score per leaderboard (public rows / private rows on Kaggle-style tasks).
        position: mean position score in [0, 1] (None unless valid).
        positions: ``{board: {"position", "total", "position_score"}}``.
        medal: ``"gold"``, ``"silver"``, ``"bronze"``, ``"above_median"``, ``"none"`` or None.
        medal_thresholds: ``{"gold", "silver", "bronze", "median"}`` in metric units, or None.
        reason: why the outcome is not ``valid`` (validation message, error tail, harness reason).
        submission_error: the validation rule broken (``wrong_columns`` ...), if any.
        exit_code: the script's exit status (None if it never ran or was killed by a signal).
        resources: ``{"wall_s", "cpu_s", "peak_rss_mb"}`` as reported by the sandbox.
        isolated: whether the sandbox isolated the run (False for the plain-subprocess fallback).
        backend: the sandbox backend used.
        warnings: the sandbox's warnings (e.g. "not isolated").
        stdout_tail / stderr_tail: the last characters of the script's output.
        time_limit_s / memory_limit_mb: the limits the run had.
        cached: the execution result came from a sandbox pool's cache (the code was not re-run).
    """

    task_id: str
    status: str
    reward: float | None
    score: float | None = None
    board_scores: dict[str, float] = field(default_factory=dict)
    position: float | None = None
    positions: dict[str, dict[str, float]] = field(default_factory=dict)
    medal: str | None = None
    medal_thresholds: dict[str, float] | None = None
    reason: str | None = None
    submission_error: str | None = None
    exit_code: int | None = None
    resources: dict[str, float | None] = field(default_factory=dict)
    isolated: bool | None = None
    backend: str | None = None
    warnings: tuple[str, ...] = ()
    stdout_tail: str = ""
    stderr_tail: str = ""
    time_limit_s: float | None = None
    memory_limit_mb: int | None = None
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists instead of tuples)."""
        out = asdict(self)
        out["warnings"] = list(self.warnings)
        return out

    def to_grade(self) -> Grade:
        """The core contract's :class:`~wmrl.core.sources.Grade` (value = reward)."""
        info = self.to_dict()
        return Grade(value=self.reward, status=self.status, info=info)


def check_syntax(code: str) -> str | None:
    """None if ``code`` compiles as a Python module, else a one-line reason."""
    if not isinstance(code, str):
        return f"the solution must be Python source text, not {type(code).__name__}"
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as err:
        where = f" (line {err.lineno})" if err.lineno else ""
        return f"{type(err).__name__}: {err.msg}{where}"
    except (ValueError, TypeError) as err:  # e.g. source with NUL bytes
        return f"{type(err).__name__}: {err}"
    return None


def _limits(sandbox_module, task: Task, expected_rows: int):
    # The sandbox refuses a bigger submission before copying a byte of it: the host never holds
    # more of one rollout's submission than the grader would read.
    cap_mb = max(1, math.ceil(submission_byte_limit(task, expected_rows) / 2**20))
    return sandbox_module.Limits(
        wall_time_s=task.time_limit_s,
        memory_mb=task.memory_limit_mb,
        submission_mb=min(cap_mb, task.memory_limit_mb),
    )


class ExecutionGrader:
    """Grades solution scripts on tasks by real execution.

    Args:
        backend: sandbox backend (``"auto"``, ``"bwrap"``, ``"docker"``, ``"subprocess"``), used when
            ``sandbox`` is None.
        sandbox: an already-built sandbox (anything with ``run(code, data_dir, limits)``), e.g. a
            ``wmrl.autoresearch.sandbox.SandboxPool`` for concurrent slots and a result cache (it is
            then given the task id as its cache key).
        ladder: the reward ladder.
        time_limit_s / memory_limit_mb: override every task's limits (None keeps the task's).
    """

    def __init__(
        self,
        backend: str = "auto",
        sandbox: Any = None,
        ladder: RewardLadder | None = None,
        time_limit_s: float | None = None,
        memory_limit_mb: int | None = None,
    ) -> None:
        if time_limit_s is not None and (not math.isfinite(float(time_limit_s)) or time_limit_s <= 0):
            raise ValueError(f"time_limit_s must be a finite number > 0; got {time_limit_s!r}")
        if memory_limit_mb is not None and (not isinstance(memory_limit_mb, int) or memory_limit_mb <= 0):
            raise ValueError(f"memory_limit_mb must be an int > 0; got {memory_limit_mb!r}")
        self.backend = backend
        self._sandbox = sandbox
        self.ladder = ladder or RewardLadder()
        self.time_limit_s = time_limit_s
        self.memory_limit_mb = memory_limit_mb
        self._answers: dict[str, Any] = {}
        self._sane: dict[str, str | None] = {}

    @property
    def sandbox(self):
        """The sandbox, built on first use (so that building a grader never starts anything)."""
        if self._sandbox is None:
            from wmrl.autoresearch.sandbox import make_sandbox

            self._sandbox = make_sandbox(backend=self.backend)
        return self._sandbox

    def _task_limits(self, task: Task) -> Task:
        return task.with_limits(self.time_limit_s, self.memory_limit_mb)

    def _answers_for(self, task: Task):
        key = str(task.answers_path)
        if key not in self._answers:
            self._answers[key] = read_answers(task)
        return self._answers[key]

    def _harness_error(self, task: Task, reason: str, **extra) -> GradeResult:
        return GradeResult(
            task_id=task.id,
            status="harness_error",
            reward=None,
            reason=reason,
            time_limit_s=task.time_limit_s,
            memory_limit_mb=task.memory_limit_mb,
            **extra,
        )

    def _grader_problem(self, task: Task, answers) -> str | None:
        """Why grading itself is broken on ``task`` (``None`` when it grades its sample submission).

        Decides who is to blame when grading a submission raises something unexpected: if the
        task's own sample submission grades, the harness works and the submission broke it.
        """
        key = str(task.answers_path)
        if key not in self._sane:
            try:
                score_submission(task.sample_submission_path, task, answers)
                self._sane[key] = None
            except SubmissionError:
                self._sane[key] = None  # a refused sample is still a working grader
            except Exception as err:
                self._sane[key] = f"{type(err).__name__}: {err}"
        return self._sane[key]

    def grade(self, task: Task, code: str) -> GradeResult:
        """Compile, execute and grade ``code`` on ``task``. Never raises for a solution's fault.

        The sandbox's copy of the submission is deleted when grading ends; through a
        ``SandboxPool`` with a cache, an invalid submission's bytes are dropped from the cache
        (its verdict is kept instead).
        """
        result = None
        try:
            graded, result = self._grade(task, code)
        finally:
            path = getattr(result, "submission", None)
            if isinstance(path, Path):
                with contextlib.suppress(OSError):
                    path.unlink()
                with contextlib.suppress(OSError):
                    path.parent.rmdir()
        if (
            result is not None
            and graded.status == "invalid_submission"
            and not getattr(result, "submission_verdict", None)
        ):
            reject = getattr(self.sandbox, "reject_submission", None)
            if callable(reject):
                with contextlib.suppress(Exception):
                    reject(result, graded.submission_error or "invalid", graded.reason or "")
        return graded

    def _grade(self, task: Task, code: str) -> tuple[GradeResult, Any]:
        task = self._task_limits(task)
        base: dict[str, Any] = {
            "task_id": task.id,
            "time_limit_s": task.time_limit_s,
            "memory_limit_mb": task.memory_limit_mb,
        }
        problem = check_syntax(code)
        if problem is not None:
            return GradeResult(
                status="syntax_error", reward=self.ladder.reward("syntax_error"), reason=problem, **base
            ), None
        try:
            answers = self._answers_for(task)
        except (OSError, ValueError) as err:
            return self._harness_error(task, f"cannot read the task's answers: {err}"), None
        try:
            import wmrl.autoresearch.sandbox as sandbox_module

            data_dir = staged_public_dir(task.id, task.public_dir)
            extra = {"task_id": task.id} if _takes_task_id(self.sandbox) else {}
            result = self.sandbox.run(code, data_dir, _limits(sandbox_module, task, len(answers)), **extra)
        except Exception as err:  # the harness failed, not the solution: unknown, never 0
            return self._harness_error(task, f"sandbox failed: {type(err).__name__}: {err}"), None
        run = {
            "exit_code": getattr(result, "exit_code", None),
            "resources": _resources(getattr(result, "resources", None)),
            "isolated": getattr(result, "isolated", None),
            "backend": getattr(result, "backend", None)
            or getattr(self.sandbox, "name", None)
            or self.backend,
            "warnings": tuple(getattr(result, "warnings", ()) or ()),
            "stdout_tail": (getattr(result, "stdout_tail", "") or "")[-_TAIL:],
            "stderr_tail": (getattr(result, "stderr_tail", "") or "")[-_TAIL:],
            "cached": bool(getattr(result, "cached", False)),
        }
        return self._judge(task, result, answers, base, run), result

    def _judge(self, task: Task, result, answers, base: dict, run: dict) -> GradeResult:
        """The grade of a finished execution (status, then the submission)."""
        status = getattr(result, "status", None)
        reason = getattr(result, "reason", None)
        if status == "harness_error":
            return GradeResult(
                status="harness_error", reward=None, reason=reason or "sandbox harness error", **base, **run
            )
        if status in ("timeout", "killed"):
            default = (
                "time limit exceeded" if status == "timeout" else "killed for exceeding a resource limit"
            )
            return GradeResult(
                status=status, reward=self.ladder.reward(status), reason=reason or default, **base, **run
            )
        if status == "error":
            tail = run["stderr_tail"].strip().splitlines()
            why = reason or (tail[-1] if tail else f"exit code {run['exit_code']}")
            return GradeResult(
                status="runtime_error", reward=self.ladder.reward("runtime_error"), reason=why, **base, **run
            )
        if status != "ok":
            return GradeResult(
                status="harness_error",
                reward=None,
                reason=f"unknown sandbox status {status!r}",
                **base,
                **run,
            )
        verdict = getattr(result, "submission_verdict", None)
        if verdict:
            # A cache hit for a submission graded invalid before: its bytes were not kept.
            return GradeResult(
                status="invalid_submission",
                reward=self.ladder.reward("invalid_submission"),
                reason=verdict.get("reason"),
                submission_error=verdict.get("code"),
                **base,
                **run,
            )
        submission = getattr(result, "submission", None)
        refused = getattr(result, "submission_error", None)
        if submission is None and refused:
            # A file existed but the sandbox would not copy it out (a symlink, sparse, too big...).
            return GradeResult(
                status="invalid_submission",
                reward=self.ladder.reward("invalid_submission"),
                reason=f"the submission file was refused: {refused}",
                submission_error="refused",
                **base,
                **run,
            )
        try:
            scored = score_submission(submission, task, answers)
        except SubmissionError as err:
            rung = "no_submission" if err.code == "no_file" else "invalid_submission"
            return GradeResult(
                status=rung,
                reward=self.ladder.reward(rung),
                reason=err.reason,
                submission_error=err.code,
                **base,
                **run,
            )
        except Exception as err:
            broken = self._grader_problem(task, answers)
            if broken is None:
                # The grader grades this task's sample submission, so this submission broke it:
                # its fault, never "unknown" (which would mask it out of training).
                return GradeResult(
                    status="invalid_submission",
                    reward=self.ladder.reward("invalid_submission"),
                    reason=f"the submission could not be graded: {type(err).__name__}: {err}",
                    submission_error="ungradable",
                    **base,
                    **run,
                )
            return GradeResult(
                status="harness_error",
                reward=None,
                reason=f"grading failed: {type(err).__name__}: {err} (the sample submission fails too: {broken})",
                **base,
                **run,
            )
        return _valid(scored, self.ladder, base, run)

    def grade_submission(self, task: Task, submission: str | Path | None) -> GradeResult:
        """Grade a submission file that already exists (no execution); status is ``valid``,
        ``no_submission``, ``invalid_submission`` or ``harness_error``."""
        base: dict[str, Any] = {"task_id": task.id, "time_limit_s": None, "memory_limit_mb": None}
        try:
            answers = self._answers_for(task)
            scored = score_submission(submission, task, answers)
        except SubmissionError as err:
            rung = "no_submission" if err.code == "no_file" else "invalid_submission"
            return GradeResult(
                status=rung,
                reward=self.ladder.reward(rung),
                reason=err.reason,
                submission_error=err.code,
                **base,
            )
        except (OSError, ValueError) as err:
            return GradeResult(status="harness_error", reward=None, reason=f"grading failed: {err}", **base)
        return _valid(scored, self.ladder, base, {})


def _takes_task_id(sandbox) -> bool:
    """Whether ``sandbox.run`` keys its cache by task id (``SandboxPool.run`` does)."""
    import inspect

    try:
        return "task_id" in inspect.signature(sandbox.run).parameters
    except (TypeError, ValueError):
        return False


def _resources(value) -> dict[str, float | None]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return {k: getattr(value, k) for k in ("wall_s", "cpu_s", "peak_rss_mb") if hasattr(value, k)}


def _valid(scored: SubmissionScore, ladder: RewardLadder, base: dict, run: dict) -> GradeResult:
    medal = scored.medal
    return GradeResult(
        status="valid",
        reward=ladder.reward("valid", scored.position),
        score=scored.score,
        board_scores=dict(scored.board_scores),
        position=scored.position,
        positions={k: asdict(v) for k, v in scored.positions.items()},
        medal=medal.label if medal is not None else None,
        medal_thresholds=None
        if medal is None
        else {
            "gold": medal.gold_threshold,
            "silver": medal.silver_threshold,
            "bronze": medal.bronze_threshold,
            "median": medal.median_threshold,
        },
        **base,
        **run,
    )
