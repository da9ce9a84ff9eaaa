"""Load a DSBench data-modelling task (LiqiangJing/DSBench) from a user's disk.

DSBench's ``data_modeling/data.zip`` unpacks to

* ``data_resplit/<name>/``: ``train.csv``, ``test.csv`` and one more CSV, the sample submission
  (its name varies by competition);
* ``answers/<name>/test_answer.csv``: the held-out answers;
* ``task/<name>.txt``: the task statement given to the agent;

either directly under the root or under ``<root>/data/`` (the repository's scripts use both).
The repository adds ``evaluation/<name>_eval.py`` (the metric; its ``--value`` default names the
target column) and, in ``save_performance.zip``, ``save_performance/{GT,baseline}/<name>/result.txt``
(the oracle and the trivial-baseline scores behind DSBench's relative performance gap).

DSBench has no leaderboards. When a checkout of MLE-Dojo, which re-packaged DSBench's tasks with
Kaggle leaderboards, is given (``mledojo_root``), its ``info/{public,private}_leaderboard.csv``
are used; otherwise the task is ranked by the relative performance gap, which needs the
``save_performance`` references.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from wmrl.autoresearch.tasks.inspect import (
    answer_labels,
    csv_header,
    detect_metric_in_code,
    detect_metric_in_text,
    guess_category,
    guess_modality,
    read_scores,
)
from wmrl.autoresearch.tasks.model import Task, TaskError

__all__ = ["dsbench_root_for", "is_dsbench_task_dir", "load_dsbench"]


def _layout(root: Path) -> tuple[Path, Path, Path] | None:
    """(data_resplit, answers, task) folders under ``root``, or None."""
    for base in (root, root / "data"):
        resplit = next((p for p in (base / "data_resplit", root / "data_resplit") if p.is_dir()), None)
        if resplit is not None and (base / "answers").is_dir() and (base / "task").is_dir():
            return resplit, base / "answers", base / "task"
    return None


def dsbench_root_for(path: Path) -> tuple[Path, str] | None:
    """(DSBench root, task name) when ``path`` is ``<root>/[data/]data_resplit/<name>``, else None."""
    if path.parent.name != "data_resplit":
        return None
    for root in (path.parent.parent, path.parent.parent.parent):
        layout = _layout(root)
        if layout is not None and layout[0] == path.parent:
            return root, path.name
    return None


def is_dsbench_task_dir(path: Path) -> bool:
    """True if ``path`` is a DSBench ``data_resplit/<name>`` folder with answers and a task text."""
    found = dsbench_root_for(path)
    if found is None:
        return False
    root, name = found
    _, answers, task = _layout(root)  # type: ignore[misc]
    return (answers / name / "test_answer.csv").is_file() and (task / f"{name}.txt").is_file()


def _find(root: Path, *rels: str) -> Path | None:
    for base in (root, root.parent, root / "data"):
        for rel in rels:
            if (base / rel).is_file():
                return base / rel
    return None


def _read_number(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return float(path.read_text(encoding="utf-8").strip())
    except ValueError:
        return None


def load_dsbench(  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    root: str | os.PathLike,
    name: str | None = None,
    metric: str | None = None,
    mledojo_root: str | os.PathLike | None = None,
    time_limit_s: float = 3600.0,
    memory_limit_mb: int = 16384,
) -> Task:
    """Build a :class:`Task` for DSBench competition ``name``.

    Args:
        root: the unpacked ``data_modeling`` folder, or a ``data_resplit/<name>`` folder (then
            ``name`` may be omitted).
        name: the competition (``"playground-series-s3e1"``).
        metric: metric-registry name (overrides detection from ``evaluation/<name>_eval.py`` or the
            task text).
        mledojo_root: an MLE-Dojo checkout whose leaderboards to use.
        time_limit_s / memory_limit_mb: limits of one execution of a solution.
    """
    from wmrl.autoresearch.grading.metrics import MetricError, get_metric

    root = Path(root)
    found = dsbench_root_for(root)
    if found is not None:
        root, inferred = found
        name = name or inferred
    if not name:
        raise TaskError("load_dsbench needs the competition name (or a data_resplit/<name> path)")
    layout = _layout(root)
    if layout is None:
        raise TaskError(
            f"{root} is not a DSBench data_modeling folder (needs data_resplit/, answers/, task/)"
        )
    resplit, answers_dir, task_dir = layout
    public = resplit / name
    answers = answers_dir / name / "test_answer.csv"
    task_text = task_dir / f"{name}.txt"
    for needed in (public / "train.csv", public / "test.csv", answers, task_text):
        if not needed.is_file():
            raise TaskError(f"DSBench task {name!r}: missing {needed}")
    others = sorted(p.name for p in public.glob("*.csv") if p.name not in ("train.csv", "test.csv"))
    if len(others) != 1:
        raise TaskError(
            f"DSBench task {name!r}: expected one sample-submission CSV besides train/test; found {others}"
        )
    sample = others[0]
    description = task_text.read_text(encoding="utf-8")

    eval_script = _find(root, f"evaluation/{name}_eval.py", f"data_modeling/evaluation/{name}_eval.py")
    target_hint = None
    metric_origin = "argument"
    if eval_script is not None:
        source = eval_script.read_text(encoding="utf-8")
        value = re.search(r"['\"]--value['\"].*?default\s*=\s*['\"]([^'\"]+)['\"]", source)
        target_hint = value.group(1) if value else None
        if metric is None:
            metric = detect_metric_in_code(source)
            metric_origin = str(eval_script)
    if metric is None:
        metric = detect_metric_in_text(description)
        metric_origin = str(task_text)
    if metric is None:
        raise TaskError(f"DSBench task {name!r}: cannot tell the metric; pass metric=")
    try:
        spec = get_metric(metric)
    except MetricError as err:
        raise TaskError(f"DSBench task {name!r}: {err}") from None

    header = csv_header(public / sample)
    if len(header) < 2:
        raise TaskError(f"DSBench task {name!r}: {sample} needs an id column and at least one target column")
    targets = tuple(header[1:])
    if target_hint and target_hint in header and target_hint != header[0]:
        targets = (target_hint,) if len(header) == 2 else targets

    oracle = _read_number(_find(root, f"save_performance/GT/{name}/result.txt"))
    baseline = _read_number(_find(root, f"save_performance/baseline/{name}/result.txt"))
    if oracle is None or baseline is None or oracle == baseline:
        oracle = baseline = None
    # oracle and baseline are both numbers or both None
    lower = spec.lower_is_better if oracle is None or baseline is None else bool(oracle < baseline)

    boards: dict[str, list[float]] = {"public": [], "private": []}
    if mledojo_root is not None:
        info = Path(mledojo_root)
        for rel in (f"mledojo/competitions/{name}/info", f"competitions/{name}/info", f"{name}/info"):
            if (info / rel).is_dir():
                for board in boards:
                    path = info / rel / f"{board}_leaderboard.csv"
                    if path.is_file():
                        boards[board] = read_scores(path, column=None, rank_column="rank")
                break
    if not boards["public"] and not boards["private"] and oracle is None:
        raise TaskError(
            f"DSBench task {name!r}: nothing to rank against: no save_performance/{{GT,baseline}}/{name}/result.txt "
            "(DSBench's relative-gap references) and no MLE-Dojo leaderboards (mledojo_root=)"
        )
    labels = answer_labels(answers, targets[0]) if len(targets) == 1 else None
    return Task(
        id=name,
        description=description,
        public_dir=public,
        answers_path=answers,
        sample_submission=sample,
        id_columns=(header[0],),
        target_columns=targets,
        metric=spec.name,
        lower_is_better=lower,
        public_leaderboard=tuple(boards["public"]),
        private_leaderboard=tuple(boards["private"]),
        category=guess_category(spec.name, len(targets), labels),
        modality=guess_modality(public, public / "train.csv"),
        time_limit_s=time_limit_s,
        memory_limit_mb=memory_limit_mb,
        source="dsbench",
        train_files=("train.csv",),
        test_files=("test.csv",),
        baseline_score=baseline,
        oracle_score=oracle,
        metadata={"metric_from": metric_origin, "root": str(root)},
    )
