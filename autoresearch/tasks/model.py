"""The task model every AutoResearch harness shares.

A :class:`Task` describes one Kaggle-style machine-learning task the way MLE-bench, MLE-Dojo and
DSBench all do: a description, a *public* data folder the solution may read (train file(s), a
test file without the target, a sample submission), a *private* answers file it must never see,
the id and target columns of a submission, a metric with its direction, and leaderboards of
reference scores against which a submission's score is ranked.

The model is a frozen dataclass validated at construction, so a task that cannot be graded
(no leaderboard direction, an unknown category, a non-positive limit) is rejected when it is
loaded, not when the first rollout is graded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from wmrl.core.errors import UserError

__all__ = ["CATEGORIES", "MODALITIES", "SOURCES", "Solution", "Task", "TaskError"]

#: What kind of prediction the task asks for. ``other`` covers formats we load but do not classify
#: (ranking, segmentation, multi-label, ...).
CATEGORIES = ("binary", "multiclass", "regression", "multilabel", "other")
#: What the inputs are.
MODALITIES = ("tabular", "text", "image", "audio", "time_series", "mixed", "other")
#: Where the task came from (the loader that built it).
SOURCES = ("bundled", "mlebench", "mledojo", "dsbench", "custom")


class TaskError(UserError, ValueError):
    """A task definition (or a task folder on disk) breaks a rule of the task model."""


def _as_str_tuple(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    try:
        out = tuple(value)
    except TypeError:
        raise TaskError(f"{name} must be a sequence of column names; got {value!r}") from None
    if not out or not all(isinstance(v, str) and v for v in out):
        raise TaskError(f"{name} must hold at least one non-empty column name; got {value!r}")
    if len(set(out)) != len(out):
        raise TaskError(f"{name} has duplicate column names: {out!r}")
    return out


def _as_scores(name: str, value: Any) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise TaskError(f"{name} must be a sequence of numbers; got {value!r}") from None
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise TaskError(f"{name} holds non-finite scores {bad[:3]}: a leaderboard lists finite metric values")
    return out


@dataclass(frozen=True)
class Task:
    """One gradeable task.

    Attributes:
        id: unique, filesystem-safe name (``"spaceship-titanic"``, ``"wine-quality"``).
        description: the task statement shown to the agent (markdown; includes an Evaluation
            section that names the metric and the submission format).
        public_dir: folder the solution sees read-only as ``DATA_DIR``: training data, the test
            inputs without targets, ``sample_submission`` and usually a copy of the description.
        answers_path: the private answers file (CSV, rows keyed by ``id_columns``, holding
            ``target_columns``). Never mounted into the sandbox.
        sample_submission: the sample submission's file name inside ``public_dir``; its header is
            the required header of a submission.
        id_columns: column(s) that key a submission row (usually one, e.g. ``("id",)``).
        target_columns: column(s) a submission predicts (several for per-class probabilities).
        metric: name in the metric registry (``wmrl.autoresearch.grading.metrics``), e.g.
            ``"roc_auc"``, ``"rmse"`` (with ``grade_fn``: the grader's name, shown to the agent).
        lower_is_better: the metric's direction (True for errors and losses). Stored explicitly,
            never inferred from a leaderboard (a synthetic leaderboard may be flat).
        public_leaderboard: reference scores (metric units) on the public part of the test set;
            any order; may be empty when the source has only one board.
        private_leaderboard: reference scores on the private part (or the whole test set).
        category: one of :data:`CATEGORIES`.
        modality: one of :data:`MODALITIES`.
        time_limit_s: wall-clock seconds one execution of a solution may take (> 0).
        memory_limit_mb: memory one execution may use, in MiB (> 0).
        source: which loader built the task (one of :data:`SOURCES`).
        train_files: file names (relative to ``public_dir``) of the training data, for prompts.
        test_files: file names (relative to ``public_dir``) of the test inputs, for prompts.
        baseline_score: DSBench's trivial-baseline score ``b`` (metric units), or None.
        oracle_score: DSBench's ground-truth-against-itself score ``g``, or None. With both set,
            the relative performance gap ``max(0, (s - b) / (g - b))`` is defined; a task with no
            leaderboard uses it as its position score.
        grade_fn: the task's own grading function, ``module:function`` or ``file.py:function``
            (MLE-bench's ``grader.grade_fn``; see :mod:`wmrl.autoresearch.grading.grade_fn`), used
            instead of the registry metric; ``metric`` then only names it. None: the registry metric.
        metadata: free-form provenance (licence, original dataset, grader name, ...); not part of
            equality or hashing.
    """

    id: str
    description: str
    public_dir: Path
    answers_path: Path
    sample_submission: str
    id_columns: tuple[str, ...]
    target_columns: tuple[str, ...]
    metric: str
    lower_is_better: bool
    public_leaderboard: tuple[float, ...]
    private_leaderboard: tuple[float, ...]
    category: str
    modality: str
    time_limit_s: float = 600.0
    memory_limit_mb: int = 4096
    source: str = "custom"
    train_files: tuple[str, ...] = ()
    test_files: tuple[str, ...] = ()
    baseline_score: float | None = None
    oracle_score: float | None = None
    grade_fn: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
        set_ = object.__setattr__  # frozen: normalise fields in place once, at construction
        if not isinstance(self.id, str) or not self.id or "/" in self.id or self.id.strip() != self.id:
            raise TaskError(
                f"task id must be a non-empty string without '/' or surrounding spaces; got {self.id!r}"
            )
        if not isinstance(self.description, str):
            raise TaskError(f"task {self.id!r}: description must be a string")
        set_(self, "public_dir", Path(self.public_dir))
        set_(self, "answers_path", Path(self.answers_path))
        public, answers = self.public_dir.resolve(), self.answers_path.resolve()
        if answers == public or public in answers.parents:
            raise TaskError(
                f"task {self.id!r}: the answers file {self.answers_path} lies inside the public folder "
                f"{self.public_dir}; a solution could read it"
            )
        if not isinstance(self.sample_submission, str) or not self.sample_submission:
            raise TaskError(f"task {self.id!r}: sample_submission must be a file name inside public_dir")
        set_(self, "id_columns", _as_str_tuple(f"task {self.id!r}: id_columns", self.id_columns))
        set_(self, "target_columns", _as_str_tuple(f"task {self.id!r}: target_columns", self.target_columns))
        overlap = set(self.id_columns) & set(self.target_columns)
        if overlap:
            raise TaskError(f"task {self.id!r}: columns {sorted(overlap)} are both id and target columns")
        if not isinstance(self.metric, str) or not self.metric:
            raise TaskError(f"task {self.id!r}: metric must be a metric-registry name")
        if self.grade_fn is not None:
            from wmrl.autoresearch.grading.grade_fn import parse_grade_fn_spec

            try:
                parse_grade_fn_spec(self.grade_fn)
            except ValueError as err:
                raise TaskError(f"task {self.id!r}: {err}") from None
        if not isinstance(self.lower_is_better, bool):
            raise TaskError(f"task {self.id!r}: lower_is_better must be a bool; got {self.lower_is_better!r}")
        set_(
            self,
            "public_leaderboard",
            _as_scores(f"task {self.id!r}: public_leaderboard", self.public_leaderboard),
        )
        set_(
            self,
            "private_leaderboard",
            _as_scores(f"task {self.id!r}: private_leaderboard", self.private_leaderboard),
        )
        for name in ("baseline_score", "oracle_score"):
            value = getattr(self, name)
            if value is not None:
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    number = math.nan
                if not math.isfinite(number):
                    raise TaskError(
                        f"task {self.id!r}: {name} must be a finite number or None; got {value!r}"
                    )
                set_(self, name, number)
        if (self.baseline_score is None) != (self.oracle_score is None):
            raise TaskError(
                f"task {self.id!r}: baseline_score and oracle_score must be given together (both or neither)"
            )
        if self.baseline_score is not None and self.baseline_score == self.oracle_score:
            raise TaskError(
                f"task {self.id!r}: baseline_score equals oracle_score; the relative gap would divide by 0"
            )
        if not self.public_leaderboard and not self.private_leaderboard and self.baseline_score is None:
            raise TaskError(
                f"task {self.id!r}: a task needs a reference to rank against: a non-empty public or private "
                "leaderboard, or baseline_score and oracle_score"
            )
        if self.category not in CATEGORIES:
            raise TaskError(f"task {self.id!r}: category must be one of {CATEGORIES}; got {self.category!r}")
        if self.modality not in MODALITIES:
            raise TaskError(f"task {self.id!r}: modality must be one of {MODALITIES}; got {self.modality!r}")
        if self.source not in SOURCES:
            raise TaskError(f"task {self.id!r}: source must be one of {SOURCES}; got {self.source!r}")
        try:
            limit = float(self.time_limit_s)
        except (TypeError, ValueError):
            limit = math.nan
        if not math.isfinite(limit) or limit <= 0:
            raise TaskError(
                f"task {self.id!r}: time_limit_s must be a finite number > 0; got {self.time_limit_s!r}"
            )
        set_(self, "time_limit_s", limit)
        if (
            isinstance(self.memory_limit_mb, bool)
            or not isinstance(self.memory_limit_mb, int)
            or self.memory_limit_mb <= 0
        ):
            raise TaskError(
                f"task {self.id!r}: memory_limit_mb must be an int > 0 (MiB); got {self.memory_limit_mb!r}"
            )
        set_(self, "train_files", tuple(self.train_files))
        set_(self, "test_files", tuple(self.test_files))
        set_(self, "metadata", MappingProxyType(dict(self.metadata)))

    @property
    def sample_submission_path(self) -> Path:
        """Absolute path of the sample submission (inside the public folder)."""
        return self.public_dir / self.sample_submission

    @property
    def leaderboards(self) -> dict[str, tuple[float, ...]]:
        """The non-empty leaderboards by name (``"public"``, ``"private"``)."""
        boards = {"public": self.public_leaderboard, "private": self.private_leaderboard}
        return {k: v for k, v in boards.items() if v}

    def with_limits(self, time_limit_s: float | None = None, memory_limit_mb: int | None = None) -> Task:
        """A copy with other execution limits (None keeps the current value)."""
        from dataclasses import replace

        return replace(
            self,
            time_limit_s=self.time_limit_s if time_limit_s is None else time_limit_s,
            memory_limit_mb=self.memory_limit_mb if memory_limit_mb is None else memory_limit_mb,
        )


@dataclass(frozen=True)
class Solution:
    """One rollout to grade: a complete Python script written for a task.

    This is the item type of the AutoResearch reward sources: the anchor (real execution,
    ``wmrl.autoresearch.grading.ExecutionGrader``) and the world model both score sequences of
    ``Solution``.

    Attributes:
        task_id: a bundled task id or a path to a task folder (anything :func:`load_task` accepts).
        code: the full script. Contract: read inputs from ``os.environ["DATA_DIR"]``, write the
            CSV to ``os.environ["SUBMISSION_PATH"]``; the working directory is a fresh scratch folder.
    """

    task_id: str
    code: str

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, str) or not self.task_id:
            raise TaskError(f"Solution.task_id must be a non-empty string; got {self.task_id!r}")
        if not isinstance(self.code, str):
            raise TaskError(f"Solution.code must be a string (the script); got {type(self.code).__name__}")
