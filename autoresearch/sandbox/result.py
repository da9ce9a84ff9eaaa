"""The outcome of one sandboxed execution.

Status mapping (the same for every backend):

``ok``
    The solution exited with code 0 within its limits.
``error``
    The solution exited with a non-zero code (an uncaught exception, ``sys.exit(3)``...).
``timeout``
    The wall-time limit passed; the whole process tree was killed.
``killed``
    The solution was stopped by a limit or a signal: memory (cgroup OOM kill, ``MemoryError``
    under ``RLIMIT_AS``, or the tree-RSS watchdog), output (stdout + stderr over
    ``Limits.output_bytes``), file size (``EFBIG`` under ``RLIMIT_FSIZE``), disk (``ENOSPC`` on
    the size-capped scratch filesystem), process count (watchdog), or death by a signal
    (``SIGSEGV``, ``SIGKILL``...). ``reason`` says which.
``harness_error``
    Our fault, not the solution's: the sandbox could not be started (bubblewrap missing, spawn
    failure, a broken launcher). The grade for such a result is unknown (``None``), never 0.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .limits import Limits

__all__ = ["STATUSES", "ExecutionResult", "Resources"]

STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "killed", "harness_error")


@dataclass
class Resources:
    """Resources one execution used.

    Attributes:
        wall_s: wall-clock seconds from spawn to the end of the last process (host clock).
        cpu_s: CPU seconds (user + system) of the execution: the cgroup's counter where one is
            used (every process, including ones killed at a timeout), else the ``rusage`` of the
            solution's reaped process tree as the launcher measured it.
        peak_rss_mb: the largest resident set of any single process of the solution's tree, MiB
            (``ru_maxrss``, as the launcher measured it); ``None`` when the host had to kill the
            execution before the launcher reported (output flood, process limit, host deadline).
        peak_memory_mb: peak memory of the whole execution charged to its cgroup (processes,
            tmpfs scratch files, page cache), MiB; ``None`` without a cgroup.
        max_tasks: the most tasks (processes + threads) seen at once, where measured (cgroup
            ``pids.peak`` or the watchdog); ``None`` otherwise.
    """

    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float | None = 0.0
    peak_memory_mb: float | None = None
    max_tasks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Resources:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Resources got unknown keys: {unknown}")
        return cls(**data)


@dataclass
class ExecutionResult:
    """What happened when a solution ran.

    Attributes:
        status: one of :data:`STATUSES` (see the module docstring for the mapping).
        exit_code: the solution's exit code; ``-N`` when it died of signal N; ``None`` when it never
            ran or its status could not be collected (harness error, host-side kill).
        stdout_tail, stderr_tail: the last ``Limits.tail_bytes`` bytes of each stream, decoded as
            UTF-8 with replacement characters.
        submission: path of a *copy* of the submission file, outside the sandbox, or ``None`` when
            the solution wrote none (or it was not a regular file, or over the size limit).
        resources: see :class:`Resources`.
        isolated: ``True`` when the backend isolates the filesystem, network and processes
            (bubblewrap, Docker); ``False`` for the plain-subprocess fallback.
        warnings: anything the caller should know (no isolation, a limit not enforced, public
            data modified, a stray process killed...).
        reason: why, for ``killed``, ``timeout`` and ``harness_error``; ``None`` otherwise.
        backend: the backend's name.
        signal: the signal number that ended the solution, if one did.
        stdout_bytes, stderr_bytes: total bytes the solution wrote to each stream (the tails are
            the end of these).
        submission_error: why no submission was copied although a file existed (symlink, too big...).
        limits: the limits the execution ran under.
        cached: ``True`` when the result came from a :class:`~.pool.SandboxPool` cache.
        execution_id: unique id of the execution (names its output folder).
        cache_key: the :class:`~.pool.SandboxPool` cache key of the execution, when it has one.
        submission_verdict: ``{"code", "reason"}`` when a grader found this execution's
            submission invalid and the cache kept that verdict instead of the bytes
            (:meth:`~.pool.SandboxPool.reject_submission`); ``submission`` is then ``None``.
    """

    status: str
    exit_code: int | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    submission: Path | None = None
    resources: Resources = field(default_factory=Resources)
    isolated: bool = False
    warnings: list[str] = field(default_factory=list)
    reason: str | None = None
    backend: str = ""
    signal: int | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    submission_error: str | None = None
    limits: Limits | None = None
    cached: bool = False
    execution_id: str = ""
    cache_key: str | None = None
    submission_verdict: dict | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"ExecutionResult.status must be one of {STATUSES}; got {self.status!r}")
        if self.submission is not None and not isinstance(self.submission, Path):
            self.submission = Path(self.submission)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def copy(self) -> ExecutionResult:
        """A deep copy (the submission *path* is shared; :class:`SandboxPool` copies the file)."""
        return copy.deepcopy(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (paths as strings, limits as a dict)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["submission"] = str(self.submission) if self.submission is not None else None
        out["resources"] = self.resources.to_dict()
        out["warnings"] = list(self.warnings)
        out["limits"] = self.limits.to_dict() if self.limits is not None else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionResult:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ExecutionResult got unknown keys: {unknown}")
        data = dict(data)
        data["resources"] = Resources.from_dict(data.get("resources") or {})
        if data.get("limits") is not None:
            data["limits"] = Limits.from_dict(data["limits"])
        if data.get("submission") is not None:
            data["submission"] = Path(data["submission"])
        data["warnings"] = list(data.get("warnings") or [])
        return cls(**data)
