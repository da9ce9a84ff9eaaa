"""Resource limits for one sandboxed execution: a frozen, validated record.

Every backend reads the same :class:`Limits`. A limit a backend cannot enforce is reported in the
result's ``warnings`` (never silently dropped); ``docs/sandbox.md`` has the table of which backend
enforces what, and how.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["THREAD_ENV_VARS", "Limits"]

# Environment variables that size the thread pools of the numeric libraries a solution may use.
# All of them are set to ``Limits.threads`` inside the sandbox, so that a solution's BLAS/OpenMP
# pools match the CPUs it was given instead of the host's core count.
THREAD_ENV_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS",  # OpenMP: scikit-learn, LightGBM, XGBoost, libgomp users
    "OPENBLAS_NUM_THREADS",  # numpy/scipy wheels ship OpenBLAS
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "POLARS_MAX_THREADS",
    "RAYON_NUM_THREADS",
    "LOKY_MAX_CPU_COUNT",  # joblib / scikit-learn n_jobs=-1
    "TORCH_NUM_THREADS",
)

_MB = 1024 * 1024


def _positive_number(name: str, value: Any, *, integer: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Limits.{name} must be a number; got {type(value).__name__} {value!r}")
    if integer and not isinstance(value, int):
        raise TypeError(f"Limits.{name} must be an integer; got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"Limits.{name} must be a finite number > 0; got {value!r}")


@dataclass(frozen=True)
class Limits:
    """Resource limits for one execution. All fields are validated at construction.

    Attributes:
        wall_time_s: wall-clock limit in seconds. When it passes, the whole process tree is killed
            and the status is ``timeout``.
        memory_mb: memory limit in MiB for the whole execution (cgroup, when one is writable:
            processes + tmpfs + page cache), else per process (``RLIMIT_AS``, virtual memory)
            plus a polled tree-RSS watchdog.
        max_processes: tasks (processes *and* threads) the execution may hold at once.
        file_size_mb: largest file the solution may write (``RLIMIT_FSIZE``), MiB.
        submission_mb: largest submission copied out of the sandbox, MiB (at most
            ``file_size_mb``). A bigger one, or a sparse file, is refused *before* a byte of it is
            copied: the host never holds more than this per execution.
        disk_mb: total size of the writable scratch space (work dir + ``/tmp``), MiB, where the
            backend has a size-capped filesystem (bubblewrap: one tmpfs; Docker: tmpfs mounts).
        output_bytes: total bytes the solution may write to stdout + stderr; beyond this the
            execution is killed (status ``killed``).
        tail_bytes: how many trailing bytes of stdout and of stderr the result keeps.
        threads: value of every thread-count variable in :data:`THREAD_ENV_VARS`.
        cpus: CPU cores the execution is pinned to (``sched_setaffinity``); ``None`` means as many
            as ``threads`` (capped by the host's cores).
        gpu: ``False`` (no GPU visible), ``True`` (all GPUs), or a tuple of device indices.
        open_files: ``RLIMIT_NOFILE``.
    """

    wall_time_s: float = 600.0
    memory_mb: int = 4096
    max_processes: int = 256
    file_size_mb: int = 1024
    submission_mb: int = 256
    disk_mb: int = 2048
    output_bytes: int = 8 * _MB
    tail_bytes: int = 16384
    threads: int = 2
    cpus: int | None = None
    gpu: bool | tuple[int, ...] = False
    open_files: int = 4096

    def __post_init__(self) -> None:
        _positive_number("wall_time_s", self.wall_time_s, integer=False)
        for name in (
            "memory_mb",
            "max_processes",
            "file_size_mb",
            "submission_mb",
            "disk_mb",
            "output_bytes",
            "tail_bytes",
            "threads",
            "open_files",
        ):
            _positive_number(name, getattr(self, name), integer=True)
        if self.cpus is not None:
            _positive_number("cpus", self.cpus, integer=True)
        if self.max_processes < 4:
            # The launcher, the interpreter and its helper threads need a few tasks of their own.
            raise ValueError(f"Limits.max_processes must be >= 4; got {self.max_processes}")
        if self.memory_mb < 64:
            raise ValueError(
                f"Limits.memory_mb must be >= 64 (a Python interpreter needs ~30 MiB); got {self.memory_mb}"
            )
        gpu = self.gpu
        if isinstance(gpu, list):
            gpu = tuple(gpu)
            object.__setattr__(self, "gpu", gpu)
        if isinstance(gpu, tuple):
            if not gpu:
                raise ValueError("Limits.gpu: an empty device tuple is ambiguous; use False for no GPU")
            for d in gpu:
                if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                    raise ValueError(f"Limits.gpu device indices must be ints >= 0; got {gpu!r}")
            if len(set(gpu)) != len(gpu):
                raise ValueError(f"Limits.gpu has duplicate devices: {gpu!r}")
        elif not isinstance(gpu, bool):
            raise TypeError(f"Limits.gpu must be a bool or a tuple of device indices; got {gpu!r}")

    # -- construction and serialisation ------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limits:
        """Build from a mapping; unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Limits got unknown keys: {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``gpu`` tuples become lists)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(out["gpu"], tuple):
            out["gpu"] = list(out["gpu"])
        return out

    def replace(self, **changes: Any) -> Limits:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def key(self) -> str:
        """Canonical JSON text, used in cache keys: equal limits give equal keys."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    # -- derived values -------------------------------------------------------------------------
    def thread_env(self) -> dict[str, str]:
        """The thread-cap environment variables (name -> value)."""
        return dict.fromkeys(THREAD_ENV_VARS, str(self.threads))

    def effective_cpus(self, available: int) -> int:
        """Cores to pin to, given ``available`` host cores (at least 1)."""
        want = self.cpus if self.cpus is not None else self.threads
        return max(1, min(want, available))

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * _MB

    @property
    def file_size_bytes(self) -> int:
        return self.file_size_mb * _MB

    @property
    def submission_bytes(self) -> int:
        """The submission cap in bytes: ``submission_mb``, never above ``file_size_mb``."""
        return min(self.submission_mb, self.file_size_mb) * _MB

    @property
    def disk_bytes(self) -> int:
        return self.disk_mb * _MB
