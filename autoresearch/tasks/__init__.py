"""AutoResearch tasks: the shared task model, loaders for MLE-bench / MLE-Dojo / DSBench folders, and
the bundled offline suite."""

from wmrl.autoresearch.tasks.model import CATEGORIES, MODALITIES, SOURCES, Solution, Task, TaskError

__all__ = ["CATEGORIES", "MODALITIES", "SOURCES", "Solution", "Task", "TaskError"]
