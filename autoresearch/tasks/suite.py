"""The bundled offline suite: Kaggle-style tasks built from data that ships inside registry packages.

Each task lives in ``wmrl/autoresearch/suite/<id>/`` (package data):

* ``task.json``: metric, direction, id/target columns, category, modality, limits, provenance;
* ``description.md``: the statement shown to the agent (overview, data, Evaluation, limits);
* ``public/``: ``train.csv``, ``test.csv``, ``sample_submission.csv`` and a copy of the description
  (the folder a solution sees as ``DATA_DIR``);
* ``private/answers.csv``: the held-out answers with Kaggle's ``Usage`` column (``Public`` /
  ``Private``: which leaderboard each test row counts for);
* ``private/leaderboard.csv``: ``pipeline,public_score,private_score``, one row per baseline pipeline
  that was actually trained and scored when the suite was built.

The suite is rebuilt by ``python -m wmrl.autoresearch.tasks.build_suite``. The fixed split of tasks
into a training set and a held-out evaluation set is :data:`TRAIN_TASKS` / :data:`EVAL_TASKS`.
"""

from __future__ import annotations

import csv
import json
import os
from functools import cache
from pathlib import Path

from wmrl.autoresearch.tasks.model import Task, TaskError

__all__ = [
    "EVAL_TASKS",
    "HEAVY_DIR",
    "HEAVY_TASKS",
    "SUITE_DIR",
    "TRAIN_TASKS",
    "is_bundled_dir",
    "list_suite",
    "load_bundled",
    "load_bundled_dir",
    "suite_split",
]

#: Where the bundled tasks live (inside the installed package).
SUITE_DIR = Path(__file__).resolve().parent.parent / "suite"

#: Tasks a policy may train on. Every category (binary, multiclass, regression) and modality
#: family (tabular, text) appears here and in :data:`EVAL_TASKS`.
TRAIN_TASKS: tuple[str, ...] = (
    "breast-cancer-diagnosis",
    "credit-status",
    "customer-churn",
    "diabetes-progression",
    "diamond-prices",
    "digit-recognition",
    "flight-arrival-delay",
    "food-review-rating",
    "health-visits",
    "hpc-job-duration",
    "penguin-body-mass",
    "wine-cultivar",
)
#: Held-out tasks, never trained on: the evaluation of a trained policy.
EVAL_TASKS: tuple[str, ...] = (
    "ames-house-prices",
    "employee-attrition",
    "leaf-species",
    "taxi-tip",
    "tate-artwork-year",
)

#: The heavy tier (:mod:`wmrl.autoresearch.tasks.heavy`): whole datasets whose competitive solutions
#: take 20-60 s on 2 CPU cores. Training tasks; their data is rebuilt on first use.
HEAVY_TASKS: tuple[str, ...] = ("flight-delay-full", "flight-delay-minutes")
#: The heavy tier's packaged part (task.json, description, leaderboard, data manifest).
HEAVY_DIR = Path(__file__).resolve().parent.parent / "suite_heavy"

_REQUIRED_KEYS = {
    "id",
    "metric",
    "lower_is_better",
    "id_columns",
    "target_columns",
    "category",
    "modality",
    "time_limit_s",
    "memory_limit_mb",
    "sample_submission",
}


def is_bundled_dir(path: Path) -> bool:
    """True if ``path`` holds a task in the bundled layout."""
    return (path / "task.json").is_file() and (path / "public").is_dir() and (path / "private").is_dir()


def _read_leaderboard(path: Path) -> tuple[list[float], list[float]]:
    if not path.is_file():
        raise TaskError(f"bundled task is missing its leaderboard {path}")
    public, private = [], []
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            public.append(float(row["public_score"]))
            private.append(float(row["private_score"]))
    return public, private


def load_bundled_dir(path: str | os.PathLike) -> Task:
    """Load a task folder in the bundled layout (see the module docstring)."""
    path = Path(path)
    if not is_bundled_dir(path):
        raise TaskError(f"{path} is not a bundled task folder (task.json, public/, private/)")
    meta = json.loads((path / "task.json").read_text(encoding="utf-8"))
    missing = sorted(_REQUIRED_KEYS - set(meta))
    if missing:
        raise TaskError(f"{path / 'task.json'} lacks keys {missing}")
    public, private = _read_leaderboard(path / "private" / "leaderboard.csv")
    return Task(
        id=meta["id"],
        description=(path / "description.md").read_text(encoding="utf-8"),
        public_dir=path / "public",
        answers_path=path / "private" / "answers.csv",
        sample_submission=meta["sample_submission"],
        id_columns=tuple(meta["id_columns"]),
        target_columns=tuple(meta["target_columns"]),
        metric=meta["metric"],
        lower_is_better=bool(meta["lower_is_better"]),
        public_leaderboard=tuple(public),
        private_leaderboard=tuple(private),
        category=meta["category"],
        modality=meta["modality"],
        time_limit_s=float(meta["time_limit_s"]),
        memory_limit_mb=int(meta["memory_limit_mb"]),
        source="bundled",
        train_files=tuple(meta.get("train_files", ("train.csv",))),
        test_files=tuple(meta.get("test_files", ("test.csv",))),
        metadata={k: meta[k] for k in ("title", "provenance", "rows", "pool") if k in meta},
    )


@cache
def _load_cached(task_id: str, root: str) -> Task:
    return load_bundled_dir(Path(root) / task_id)


def list_suite(root: str | os.PathLike | None = None) -> list[str]:
    """Ids of the bundled tasks present on disk, sorted."""
    base = Path(root) if root is not None else SUITE_DIR
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if is_bundled_dir(p))


def load_bundled(task_id: str, root: str | os.PathLike | None = None) -> Task:
    """Load bundled task ``task_id`` (a heavy-tier id materialises its data first, unless ``root`` is given).

    Raises:
        TaskError: no such task (the message lists the known ids).
    """
    if root is None and task_id in HEAVY_TASKS:
        from wmrl.autoresearch.tasks.heavy import materialise

        return _load_cached(task_id, str(materialise(task_id).parent.resolve()))
    base = Path(root) if root is not None else SUITE_DIR
    if not is_bundled_dir(base / task_id):
        known = ", ".join(list_suite(base)) or "none (run python -m wmrl.autoresearch.tasks.build_suite)"
        raise TaskError(f"no bundled task {task_id!r}; bundled tasks: {known}")
    return _load_cached(task_id, str(base.resolve()))


def suite_split(task_id: str) -> str:
    """``"train"`` or ``"eval"`` for a bundled task id (the heavy tier's tasks are training tasks)."""
    if task_id in TRAIN_TASKS or task_id in HEAVY_TASKS:
        return "train"
    if task_id in EVAL_TASKS:
        return "eval"
    raise TaskError(f"{task_id!r} is not in the suite's train/eval split")
