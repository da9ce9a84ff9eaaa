"""Tiny tasks written to a folder, for tests and examples (no package data, no network).

``make_toy_task(root)`` writes a bundled-layout task (``task.json``, ``description.md``,
``public/``, ``private/``) with a handful of rows and a hand-made leaderboard, and returns the
loaded :class:`~wmrl.autoresearch.tasks.model.Task`. Solutions for it fit in a few lines; see
:data:`TOY_SOLUTION`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from wmrl.autoresearch.tasks.model import Task

__all__ = ["TOY_SOLUTION", "make_toy_task"]

#: A correct solution for a regression toy task: least squares on the features.
TOY_SOLUTION = """\
import os
import numpy as np
import pandas as pd

data = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(data, "train.csv"))
test = pd.read_csv(os.path.join(data, "test.csv"))
features = [c for c in test.columns if c != "id"]
X = np.c_[train[features].to_numpy(), np.ones(len(train))]
coef, *_ = np.linalg.lstsq(X, train["y"].to_numpy(), rcond=None)
pred = np.c_[test[features].to_numpy(), np.ones(len(test))] @ coef
pd.DataFrame({"id": test["id"], "y": pred}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
"""


def make_toy_task(
    root: str | os.PathLike,
    task_id: str = "toy-regression",
    kind: str = "regression",
    n_train: int = 40,
    n_test: int = 20,
    time_limit_s: float = 60.0,
    seed: int = 0,
) -> Task:
    """Write a tiny task under ``root / task_id`` and load it.

    Args:
        kind: ``"regression"`` (target ``y`` = linear in ``x1``, ``x2`` + noise; metric RMSE) or
            ``"binary"`` (target ``y`` = 1 when ``x1 + x2 > 0``; metric ROC AUC).
        n_train / n_test: rows; the first ``n_test // 3`` test rows are Public, the rest Private.

    The leaderboard holds 10 made-up scores spread from a perfect to a poor submission.
    """
    from wmrl.autoresearch.tasks.suite import load_bundled_dir

    if kind not in ("regression", "binary"):
        raise ValueError(f"kind must be 'regression' or 'binary'; got {kind!r}")
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x = rng.normal(size=(n, 2))
    if kind == "regression":
        y = 3.0 * x[:, 0] - 2.0 * x[:, 1] + 1.0 + rng.normal(0, 0.1, n)
        metric, lower = "rmse", True
        board = [0.1, 0.15, 0.3, 0.5, 0.8, 1.2, 1.8, 2.5, 3.0, 3.6]
    else:
        y = (x[:, 0] + x[:, 1] > 0).astype(int)
        metric, lower = "roc_auc", False
        board = [1.0, 0.98, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.55, 0.5]
    ids = np.arange(1, n + 1)
    folder = Path(root) / task_id
    public, private = folder / "public", folder / "private"
    public.mkdir(parents=True, exist_ok=True)
    private.mkdir(parents=True, exist_ok=True)

    def write(path: Path, header: list[str], rows) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(",".join(header) + "\n")
            for row in rows:
                fh.write(",".join(str(v) for v in row) + "\n")

    tr, te = slice(0, n_train), slice(n_train, n)
    write(public / "train.csv", ["id", "x1", "x2", "y"], zip(ids[tr], x[tr, 0], x[tr, 1], y[tr], strict=True))
    write(public / "test.csv", ["id", "x1", "x2"], zip(ids[te], x[te, 0], x[te, 1], strict=True))
    placeholder = 0.0 if kind == "regression" else 0.5
    write(public / "sample_submission.csv", ["id", "y"], ((i, placeholder) for i in ids[te]))
    usage = ["Public" if k < max(1, n_test // 3) else "Private" for k in range(n_test)]
    write(private / "answers.csv", ["id", "y", "Usage"], zip(ids[te], y[te], usage, strict=True))
    write(
        private / "leaderboard.csv",
        ["pipeline", "public_score", "private_score"],
        ((f"p{k}", s, s) for k, s in enumerate(board)),
    )
    description = (
        f"# Toy {kind} task\n\nPredict `y` from `x1` and `x2`.\n\n## Evaluation\n\n"
        f"Submissions are scored with {metric} ({'lower' if lower else 'higher'} is better). "
        "Write a CSV with columns `id,y`, one row per test id.\n"
    )
    (folder / "description.md").write_text(description, encoding="utf-8")
    (public / "description.md").write_text(description, encoding="utf-8")
    meta = {
        "id": task_id,
        "title": f"Toy {kind}",
        "metric": metric,
        "lower_is_better": lower,
        "id_columns": ["id"],
        "target_columns": ["y"],
        "category": "regression" if kind == "regression" else "binary",
        "modality": "tabular",
        "time_limit_s": time_limit_s,
        "memory_limit_mb": 1024,
        "sample_submission": "sample_submission.csv",
    }
    (folder / "task.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return load_bundled_dir(folder)
