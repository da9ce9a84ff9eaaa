"""GPUs for the agent's code: each concurrent sandbox execution gets its own device(s).

:class:`DeviceSlots` wraps a sandbox backend (below the pool, so every pool slot draws from it): an
execution takes a free device group, runs with ``Limits.gpu`` set to it (the backend exposes only
those device nodes: bubblewrap binds them, Docker requests them, the plain subprocess sets
``CUDA_VISIBLE_DEVICES``), and gives it back. So ``sandbox.workers=4 sandbox.gpus=[0,1,2,3]`` runs
four solutions at once, one GPU each, and two executions never share a device. The agent is told
(system prompt and overview: ``SandboxEnvironment.gpu``) how many GPUs its script sees.

On a Ray pool the slots own their GPUs (``sandbox.ray.gpus_per_slot``: Ray assigns them to each
worker); :class:`RequestGPU` makes every execution ask for one, and the worker's own ids replace
the request (``wmrl.autoresearch.sandbox.ray_pool``).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["DeviceSlots", "RequestGPU", "device_groups", "missing_gpus", "visible_gpus"]


def device_groups(gpus: Sequence[int], per_slot: int) -> list[tuple[int, ...]]:
    """``gpus`` cut into consecutive groups of ``per_slot`` devices (one group per concurrent execution).

    Raises:
        ValueError: the devices do not divide into whole groups.
    """
    if per_slot < 1 or len(gpus) % per_slot:
        raise ValueError(f"{len(gpus)} GPUs do not split into groups of {per_slot}")
    return [tuple(gpus[i : i + per_slot]) for i in range(0, len(gpus), per_slot)]


def visible_gpus() -> set[int]:
    """Indices of the NVIDIA GPUs this machine exposes (their ``/dev/nvidiaN`` device nodes, which is
    what the isolating backends hand to a sandbox); empty on a CPU-only machine."""
    import glob
    import re

    found = set()
    for path in glob.glob("/dev/nvidia*"):
        match = re.fullmatch(r"/dev/nvidia(\d+)", path)
        if match:
            found.add(int(match.group(1)))
    return found


def missing_gpus(gpus: Sequence[int], visible: set[int] | None = None) -> list[int]:
    """The requested device indices this machine does not have (``visible``: default :func:`visible_gpus`)."""
    have = visible_gpus() if visible is None else visible
    return [g for g in gpus if g not in have]


class DeviceSlots:
    """A sandbox that runs each execution on a free device group (see the module docstring).

    Args:
        sandbox: the backend (``run(code, data_dir, limits)``).
        groups: device groups, e.g. ``[(0,), (1,)]``; at most ``len(groups)`` executions run at once.

    Attributes:
        assignments: ``(device group, start, end)`` per execution (``time.perf_counter`` seconds).
    """

    def __init__(self, sandbox: Any, groups: Sequence[tuple[int, ...]]) -> None:
        if not groups:
            raise ValueError("DeviceSlots needs at least one device group")
        self.sandbox = sandbox
        self.name = getattr(sandbox, "name", "sandbox")
        self.problem = getattr(sandbox, "problem", None)
        self.groups = [tuple(g) for g in groups]
        self._free: queue.Queue[tuple[int, ...]] = queue.Queue()
        for group in self.groups:
            self._free.put(group)
        self._lock = threading.Lock()
        self.assignments: list[tuple[tuple[int, ...], float, float]] = []

    def run(self, code: str, data_dir: Any, limits: Any = None) -> Any:
        import time

        from wmrl.autoresearch.sandbox import Limits

        group = self._free.get()  # blocks while every device is busy
        start = time.perf_counter()
        try:
            return self.sandbox.run(code, data_dir, dataclasses.replace(limits or Limits(), gpu=group))
        finally:
            with self._lock:
                self.assignments.append((group, start, time.perf_counter()))
            self._free.put(group)

    def __getattr__(self, name: str) -> Any:  # everything else is the backend's (close, capabilities, ...)
        return getattr(self.sandbox, name)


class RequestGPU:
    """A sandbox whose every execution asks for a GPU (``Limits.gpu=True``): for a Ray pool, whose slots
    replace the request with the GPUs Ray assigned them (a slot without one reports a harness error)."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.name = getattr(sandbox, "name", "sandbox")

    def run(self, code: str, data_dir: Any, limits: Any = None, **kwargs: Any) -> Any:
        from wmrl.autoresearch.sandbox import Limits

        return self.sandbox.run(code, data_dir, dataclasses.replace(limits or Limits(), gpu=True), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sandbox, name)
