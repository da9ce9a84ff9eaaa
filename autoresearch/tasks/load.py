"""``load_task``: one entry point for a bundled task id or a task folder in any supported format."""

from __future__ import annotations

import os
from pathlib import Path

from wmrl.autoresearch.tasks.dsbench import dsbench_root_for, is_dsbench_task_dir, load_dsbench
from wmrl.autoresearch.tasks.mlebench import is_mlebench_dir, load_mlebench
from wmrl.autoresearch.tasks.mledojo import is_mledojo_dir, load_mledojo
from wmrl.autoresearch.tasks.model import Task, TaskError
from wmrl.autoresearch.tasks.suite import (
    HEAVY_TASKS,
    SUITE_DIR,
    is_bundled_dir,
    list_suite,
    load_bundled,
    load_bundled_dir,
)

__all__ = ["FORMATS", "detect_format", "load_task"]

FORMATS = ("bundled", "mlebench", "mledojo", "dsbench")


def detect_format(path: str | os.PathLike) -> str:
    """Which task format the folder ``path`` is in (one of :data:`FORMATS`).

    Raises:
        TaskError: none matches (the message says what each format needs).
    """
    path = Path(path)
    if not path.is_dir():
        raise TaskError(f"{path} is not a folder")
    if is_bundled_dir(path):
        return "bundled"
    if is_mlebench_dir(path):
        return "mlebench"
    if is_mledojo_dir(path):
        return "mledojo"
    if is_dsbench_task_dir(path):
        return "dsbench"
    raise TaskError(
        f"{path} is not a task folder in a known format: bundled (task.json, public/, private/), MLE-bench "
        "(config.yaml with dataset and grader), MLE-Dojo (public/description.txt, public/sample_submission.csv, "
        "private/test_answer.csv, optionally under data/), or DSBench (data_resplit/<name> next to "
        "answers/<name>/test_answer.csv and task/<name>.txt)"
    )


def load_task(
    task: str | os.PathLike | Task,
    *,
    metric: str | None = None,
    data_dir: str | os.PathLike | None = None,
    mledojo_root: str | os.PathLike | None = None,
    time_limit_s: float | None = None,
    memory_limit_mb: int | None = None,
) -> Task:
    """Load a task from a bundled id or a folder in any supported format.

    Args:
        task: a bundled task id (``"wine-cultivar"``), a folder path, or a :class:`Task` (returned
            as is, with the limits applied).
        metric: metric-registry name overriding the detected one (external formats only).
        data_dir: MLE-bench's data dir.
        mledojo_root: an MLE-Dojo checkout (metric sources; leaderboards for DSBench tasks).
        time_limit_s / memory_limit_mb: override the task's execution limits.
    """
    if isinstance(task, Task):
        loaded = task
    else:
        text = os.fspath(task)
        path = Path(text).expanduser()
        looks_like_id = "/" not in text and os.sep not in text and not path.exists()
        if looks_like_id:
            if text in list_suite(SUITE_DIR) or text in HEAVY_TASKS:
                loaded = load_bundled(text)
            else:
                known = ", ".join([*list_suite(SUITE_DIR), *HEAVY_TASKS]) or "none"
                raise TaskError(
                    f"{text!r} is neither a bundled task id nor an existing folder; bundled tasks: {known}"
                )
        else:
            fmt = detect_format(path)
            if fmt == "bundled":
                loaded = load_bundled_dir(path)
            elif fmt == "mlebench":
                loaded = load_mlebench(path, data_dir=data_dir, metric=metric)
            elif fmt == "mledojo":
                loaded = load_mledojo(path, metric=metric, mledojo_root=mledojo_root)
            else:
                root, name = dsbench_root_for(path)  # type: ignore[misc]
                loaded = load_dsbench(root, name, metric=metric, mledojo_root=mledojo_root)
    if time_limit_s is not None or memory_limit_mb is not None:
        loaded = loaded.with_limits(time_limit_s, memory_limit_mb)
    return loaded
