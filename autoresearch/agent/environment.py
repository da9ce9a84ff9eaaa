"""What the agent is told about the machine its script runs on: limits and libraries.

The same record feeds the agent's system prompt and the task overview (which the world model
also reads), so both describe the sandbox identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["DEFAULT_LIBRARIES", "SandboxEnvironment", "detect_libraries"]

#: Distributions worth naming to an ML agent, in the order they are listed.
DEFAULT_LIBRARIES = (
    "numpy",
    "pandas",
    "scipy",
    "scikit-learn",
    "lightgbm",
    "xgboost",
    "catboost",
    "statsmodels",
    "torch",
    "pyarrow",
    "joblib",
)


def detect_libraries(names: tuple[str, ...] = DEFAULT_LIBRARIES) -> tuple[str, ...]:
    """``"name version"`` for each distribution installed in *this* interpreter.

    The sandbox backends run solutions with the interpreter that runs WMRL, so this is what a
    solution can import there. Missing distributions are left out rather than guessed.
    """
    out = []
    for name in names:
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return tuple(out)


@dataclass(frozen=True)
class SandboxEnvironment:
    """Limits and libraries of the sandbox, as told to the agent and the world model.

    Attributes:
        time_limit_s: wall-clock seconds one run may take (> 0).
        memory_mb: memory one run may use, MiB (> 0).
        cpus: CPU cores available (``None``: unspecified).
        gpu: whether a GPU is visible: ``False``, ``True``, or the number of GPUs one run sees.
        network: whether the network is reachable (never, in the WMRL sandboxes).
        libraries: ``"name version"`` strings of the importable third-party libraries.
    """

    time_limit_s: float = 600.0
    memory_mb: int = 4096
    cpus: int | None = None
    gpu: bool | int = False
    network: bool = False
    libraries: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (
            not isinstance(self.time_limit_s, (int, float))
            or not math.isfinite(self.time_limit_s)
            or self.time_limit_s <= 0
        ):
            raise ValueError(f"time_limit_s must be a finite number > 0; got {self.time_limit_s!r}")
        if isinstance(self.memory_mb, bool) or not isinstance(self.memory_mb, int) or self.memory_mb <= 0:
            raise ValueError(f"memory_mb must be an int > 0 (MiB); got {self.memory_mb!r}")
        if self.cpus is not None and (
            isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus <= 0
        ):
            raise ValueError(f"cpus must be None or an int > 0; got {self.cpus!r}")
        if not isinstance(self.gpu, (bool, int)) or self.gpu < 0:
            raise ValueError(f"gpu must be a bool or a GPU count >= 0; got {self.gpu!r}")
        object.__setattr__(self, "libraries", tuple(self.libraries))
        if not all(isinstance(x, str) and x for x in self.libraries):
            raise ValueError("libraries must be non-empty strings such as 'numpy 1.26.4'")

    @classmethod
    def detect(
        cls, time_limit_s: float = 600.0, memory_mb: int = 4096, cpus: int | None = None
    ) -> SandboxEnvironment:
        """An environment with the libraries installed in this interpreter."""
        return cls(time_limit_s=time_limit_s, memory_mb=memory_mb, cpus=cpus, libraries=detect_libraries())

    @classmethod
    def from_task(
        cls, task: Any, limits: Any = None, libraries: tuple[str, ...] | None = None, gpus: int = 0
    ) -> SandboxEnvironment:
        """Limits from a task (``time_limit_s``, ``memory_limit_mb``) and optionally a sandbox
        ``Limits`` record (``cpus``/``threads``, ``gpu``), which overrides CPU and GPU; ``gpus``: the
        GPUs each run is assigned (``sandbox.gpus_per_slot``)."""
        cpus = None
        gpu: bool | int = gpus if gpus else False
        if limits is not None:
            cpus = getattr(limits, "cpus", None) or getattr(limits, "threads", None)
            value = getattr(limits, "gpu", False)
            gpu = len(value) if isinstance(value, tuple) else bool(value) or gpu
        return cls(
            time_limit_s=float(task.time_limit_s),
            memory_mb=int(task.memory_limit_mb),
            cpus=cpus,
            gpu=gpu,
            libraries=detect_libraries() if libraries is None else tuple(libraries),
        )

    def limits_line(self) -> str:
        """One line: time, memory, CPUs, GPU, network."""
        minutes = self.time_limit_s / 60
        time_text = f"{minutes:g} min" if self.time_limit_s >= 60 else f"{self.time_limit_s:g} s"
        memory = f"{self.memory_mb / 1024:g} GiB" if self.memory_mb >= 1024 else f"{self.memory_mb} MiB"
        parts = [f"time limit {time_text} (wall clock)", f"memory {memory}"]
        if self.cpus:
            parts.append(f"{self.cpus} CPU core{'s' if self.cpus > 1 else ''}")
        if self.gpu is True or self.gpu == 1:
            parts.append("a GPU (CUDA)")
        elif self.gpu:
            parts.append(f"{int(self.gpu)} GPUs (CUDA)")
        else:
            parts.append("no GPU")
        parts.append("network access" if self.network else "no network (no downloads, no pip install)")
        return ", ".join(parts)

    def libraries_line(self) -> str:
        names = ", ".join(self.libraries) if self.libraries else "(third-party libraries not listed)"
        return f"{names}; plus the Python standard library"
