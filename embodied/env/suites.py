"""LIBERO suites, their tasks, their per-suite step limits, and their fixed initial states.

Step limits are the OpenVLA / openvla-mini ``run_libero_eval.py`` values (longest demonstration
plus a margin), which the VLA literature and the WMRL paper (520 for LIBERO-Long) use. lerobot
differs only for ``libero_spatial`` (280); pass ``max_steps`` explicitly to reproduce it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.embodied.env.libero_setup import prepare_libero

__all__ = [
    "DEFAULT_SUITE",
    "SUITES",
    "SUITE_MAX_STEPS",
    "SUITE_NUM_TASKS",
    "TaskInfo",
    "check_suite",
    "get_task",
    "list_tasks",
    "load_init_states",
]

DEFAULT_SUITE = "libero_10"
"""LIBERO-Long: ten long-horizon, two-stage tasks."""

# Maximum number of *policy* steps per episode (after the settle steps), per suite.
SUITE_MAX_STEPS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}

SUITE_NUM_TASKS: dict[str, int] = {
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}

SUITES: tuple[str, ...] = tuple(SUITE_MAX_STEPS)


def check_suite(suite: str) -> str:
    """Return ``suite`` if it is a known suite name, else raise ``ValueError`` listing the names."""
    if suite not in SUITE_MAX_STEPS:
        raise ValueError(f"suite must be one of {', '.join(SUITES)}; got {suite!r}")
    return suite


@dataclass(frozen=True)
class TaskInfo:
    """One LIBERO task.

    Attributes:
        suite: suite name (``libero_10``...).
        task_id: index of the task in the suite's default task order (0-based).
        name: the BDDL problem name, e.g. ``LIVING_ROOM_SCENE2_put_both_...``.
        instruction: the natural-language instruction the policy receives.
        bddl_file: path of the task's BDDL file.
        init_states_file: path of the task's ``.pruned_init`` file (the fixed initial states).
    """

    suite: str
    task_id: int
    name: str
    instruction: str
    bddl_file: Path
    init_states_file: Path


@functools.cache
def list_tasks(suite: str = DEFAULT_SUITE) -> tuple[TaskInfo, ...]:
    """All tasks of a suite in LIBERO's default task order (order index 0, the identity)."""
    check_suite(suite)
    prepare_libero()
    from libero.libero import benchmark, get_libero_path

    # The Benchmark constructor prints "[info] using task orders ..." on stdout.
    with contextlib.redirect_stdout(io.StringIO()):
        bench = benchmark.get_benchmark_dict()[suite](task_order_index=0)
    bddl_root = Path(get_libero_path("bddl_files"))
    init_root = Path(get_libero_path("init_states"))
    tasks = []
    for i in range(bench.n_tasks):
        task = bench.get_task(i)
        tasks.append(
            TaskInfo(
                suite=suite,
                task_id=i,
                name=task.name,
                instruction=task.language,
                bddl_file=bddl_root / task.problem_folder / task.bddl_file,
                init_states_file=init_root / task.problem_folder / task.init_states_file,
            )
        )
    return tuple(tasks)


def get_task(suite: str, task_id: int) -> TaskInfo:
    """One task of a suite; ``ValueError`` when ``task_id`` is out of range."""
    tasks = list_tasks(suite)
    if not isinstance(task_id, int) or isinstance(task_id, bool) or not 0 <= task_id < len(tasks):
        raise ValueError(f"task_id must be an integer in [0, {len(tasks) - 1}] for {suite}; got {task_id!r}")
    return tasks[task_id]


def _numpy_safe_globals() -> list:
    # The .pruned_init files are torch-pickled numpy arrays. torch>=2.6 loads with weights_only=True
    # by default and refuses them; instead of switching the safety off (weights_only=False lets a
    # pickle run arbitrary code) we allow exactly the numpy reconstruction globals these files use.
    import numpy.core.multiarray as multiarray

    allowed: list = [
        # numpy's stubs do not declare this private pickle helper
        (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),  # type: ignore[attr-defined]
        np.ndarray,
        np.dtype,
    ]
    for name in ("float64", "float32", "int64"):
        allowed.append(type(np.dtype(name)))
    return allowed


@functools.lru_cache(maxsize=64)
def _load_init_states_cached(path: str, mtime: float) -> np.ndarray:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy.core alias on numpy>=2
        allowed = _numpy_safe_globals()
    try:
        with torch.serialization.safe_globals(allowed):
            states = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise ValueError(
            f"cannot load LIBERO initial states from {path} with weights_only=True (only numpy arrays "
            f"are allowed in these files): {exc}"
        ) from exc
    states = np.asarray(states, dtype=np.float64)
    if states.ndim != 2:
        raise ValueError(
            f"LIBERO initial states in {path} must be a 2-D array (states, dims); got {states.shape}"
        )
    states.setflags(write=False)
    return states


def load_init_states(task: TaskInfo | str | os.PathLike) -> np.ndarray:
    """The fixed initial states of a task: a read-only ``float64`` array of shape ``(n_states, state_dim)``.

    Each row is a flattened MuJoCo state (time, qpos, qvel); ``libero_10`` tasks have 50 rows.
    Loaded with ``torch.load(weights_only=True)`` and an allow-list of numpy globals.
    """
    path = Path(task.init_states_file if isinstance(task, TaskInfo) else task)
    if not path.is_file():
        raise FileNotFoundError(f"LIBERO initial-state file not found: {path}")
    return _load_init_states_cached(str(path), path.stat().st_mtime)
