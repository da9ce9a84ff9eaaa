"""AutoResearch tasks: the shared task model, loaders for MLE-bench / MLE-Dojo / DSBench folders, and
the bundled offline suite."""

from wmrl.autoresearch.tasks.load import FORMATS, detect_format, load_task
from wmrl.autoresearch.tasks.model import CATEGORIES, MODALITIES, SOURCES, Solution, Task, TaskError
from wmrl.autoresearch.tasks.suite import (
    EVAL_TASKS,
    SUITE_DIR,
    TRAIN_TASKS,
    list_suite,
    load_bundled,
    suite_split,
)

__all__ = [
    "CATEGORIES",
    "EVAL_TASKS",
    "FORMATS",
    "MODALITIES",
    "SOURCES",
    "SUITE_DIR",
    "TRAIN_TASKS",
    "Solution",
    "Task",
    "TaskError",
    "detect_format",
    "list_suite",
    "load_bundled",
    "load_task",
    "suite_split",
]
