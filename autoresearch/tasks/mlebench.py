"""Load an MLE-bench competition (openai/mle-bench) from a user's disk.

MLE-bench splits a competition in two places:

* the registry folder ``mlebench/competitions/<id>/`` with ``config.yaml`` (``id``, ``name``,
  ``description`` — a repo-relative path to ``description.md`` —, ``dataset.answers`` and
  ``dataset.sample_submission`` — paths relative to the data dir —, ``grader.name``), the
  description and ``leaderboard.csv`` (Kaggle's final leaderboard, best first, ``score`` column);
* the data dir (default ``~/.cache/mle-bench/data``) with ``<id>/prepared/public/`` (what the agent
  sees) and ``<id>/prepared/private/`` (the answers, e.g. ``test.csv``).

The metric comes from ``grader.name`` through the metric registry's aliases (``auc-roc``,
``multi-class-log-loss``, ...); the direction is the metric's. Where the registry has no equivalent,
the competition's own ``grader.grade_fn`` grades it (:mod:`wmrl.autoresearch.grading.grade_fn`):
``mlebench.competitions.<id>.grade:grade`` is imported from the ``mlebench`` package, or else loaded
from the folder's ``grade.py``; its direction is MLE-bench's rule, read from the leaderboard (lower is
better iff the first, best row scores below the last). MLE-bench has one leaderboard (Kaggle's
final, private one); it becomes the task's ``private_leaderboard``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from wmrl.autoresearch.tasks.inspect import (
    answer_labels,
    csv_header,
    guess_category,
    guess_modality,
    read_scores,
)
from wmrl.autoresearch.tasks.model import Task, TaskError

__all__ = ["DEFAULT_DATA_DIR", "is_mlebench_dir", "load_mlebench"]

#: Where ``mlebench prepare`` puts data by default (appdirs' user cache dir on Linux).
DEFAULT_DATA_DIR = Path.home() / ".cache" / "mle-bench" / "data"


def _load_yaml(path: Path) -> dict:
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict):
        raise TaskError(f"{path} is not a YAML mapping")
    return data


def is_mlebench_dir(path: Path) -> bool:
    """True if ``path`` is an MLE-bench competition registry folder (``config.yaml`` with dataset/grader)."""
    config = path / "config.yaml"
    if not config.is_file():
        return False
    try:
        data = _load_yaml(config)
    except Exception:
        return False
    return isinstance(data.get("dataset"), dict) and isinstance(data.get("grader"), dict)


def _find_data_dir(competition_dir: Path, answers_rel: str, data_dir: Path | None) -> Path:
    candidates = []
    if data_dir is not None:
        candidates.append(Path(data_dir))
    if os.environ.get("MLEBENCH_DATA_DIR"):
        candidates.append(Path(os.environ["MLEBENCH_DATA_DIR"]))
    # A folder that holds both the registry entry and its prepared data (`<root>/<id>/config.yaml`
    # next to `<root>/<id>/prepared/...`) is its own data dir's child.
    candidates += [competition_dir.parent, DEFAULT_DATA_DIR]
    for root in candidates:
        if (root / answers_rel).is_file():
            return root
    tried = ", ".join(str(c) for c in candidates)
    raise TaskError(
        f"MLE-bench answers {answers_rel!r} not found under any data dir ({tried}); run `mlebench prepare -c "
        f"{competition_dir.name}` or pass data_dir= (or set MLEBENCH_DATA_DIR)"
    )


def load_mlebench(
    competition_dir: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    metric: str | None = None,
    time_limit_s: float = 3600.0,
    memory_limit_mb: int = 16384,
) -> Task:
    """Build a :class:`Task` from an MLE-bench competition folder.

    Args:
        competition_dir: the registry folder holding ``config.yaml``.
        data_dir: MLE-bench's data dir (see :data:`DEFAULT_DATA_DIR`; ``MLEBENCH_DATA_DIR`` overrides).
        metric: a metric-registry name overriding the one derived from ``grader.name``.
        time_limit_s / memory_limit_mb: limits of one execution of a solution.
    """
    from wmrl.autoresearch.grading.metrics import MetricError, get_metric

    comp = Path(competition_dir)
    if not is_mlebench_dir(comp):
        raise TaskError(
            f"{comp} is not an MLE-bench competition folder (config.yaml with dataset and grader)"
        )
    config = _load_yaml(comp / "config.yaml")
    task_id = str(config.get("id") or comp.name)
    dataset, grader = config["dataset"], config["grader"]
    for key in ("answers", "sample_submission"):
        if not isinstance(dataset.get(key), str):
            raise TaskError(f"{comp / 'config.yaml'}: dataset.{key} must be a path relative to the data dir")
    root = _find_data_dir(comp, dataset["answers"], Path(data_dir) if data_dir is not None else None)
    answers = root / dataset["answers"]
    sample = root / dataset["sample_submission"]
    if not sample.is_file():
        raise TaskError(f"MLE-bench sample submission {sample} does not exist")
    public_dir = sample.parent
    if answers.suffix.lower() != ".csv":
        raise TaskError(f"{task_id}: answers {answers.name} are not a CSV; only CSV answers are supported")

    desc_rel = config.get("description")
    desc_candidates = [comp / "description.md"]
    if isinstance(desc_rel, str):
        desc_candidates.insert(0, comp / Path(desc_rel).name)
    description = next((p.read_text(encoding="utf-8") for p in desc_candidates if p.is_file()), None)
    if description is None and (public_dir / "description.md").is_file():
        description = (public_dir / "description.md").read_text(encoding="utf-8")
    if description is None:
        raise TaskError(f"{task_id}: no description.md in {comp} or {public_dir}")

    grader_name = str(grader.get("name", ""))
    leaderboard = read_scores(comp / "leaderboard.csv", column="score")
    grade_fn = None
    try:
        metric_name = get_metric(metric or grader_name).name
        lower_is_better = get_metric(metric_name).lower_is_better
    except MetricError as err:
        if metric is not None or not grader.get("grade_fn"):
            raise TaskError(
                f"{task_id}: MLE-bench grader {grader_name!r} has no registry metric ({err}) and "
                "config.yaml names no grader.grade_fn"
            ) from None
        grade_fn = _own_grade_fn(task_id, comp, str(grader["grade_fn"]))
        metric_name = grader_name or "grade_fn"
        lower_is_better = _direction_from_leaderboard(task_id, leaderboard)

    header = csv_header(sample)
    if len(header) < 2:
        raise TaskError(
            f"{task_id}: sample submission {sample} needs an id column and at least one target column"
        )
    train = public_dir / "train.csv"
    labels = answer_labels(answers, header[1]) if len(header) == 2 else None
    return Task(
        id=task_id,
        description=description,
        public_dir=public_dir,
        answers_path=answers,
        sample_submission=sample.name,
        id_columns=(header[0],),
        target_columns=tuple(header[1:]),
        metric=metric_name,
        lower_is_better=lower_is_better,
        grade_fn=grade_fn,
        public_leaderboard=(),
        private_leaderboard=tuple(leaderboard),
        category=guess_category(metric_name, len(header) - 1, labels),
        modality=guess_modality(public_dir, train if train.is_file() else None),
        time_limit_s=time_limit_s,
        memory_limit_mb=memory_limit_mb,
        source="mlebench",
        train_files=tuple(p.name for p in sorted(public_dir.glob("train*"))),
        test_files=tuple(p.name for p in sorted(public_dir.glob("test*"))),
        metadata={
            "name": config.get("name"),
            "grader": grader_name,
            "competition_type": config.get("competition_type"),
            "competition_dir": str(comp),
            "data_dir": str(root),
        },
    )


def _own_grade_fn(task_id: str, comp: Path, spec: str) -> str:
    """The loadable spec of a competition's ``grader.grade_fn``: as written when its module imports
    (the ``mlebench`` package installed), else the folder's own file. Loaded here, so a grader that
    cannot be imported fails when the task loads, not at its first rollout."""
    from wmrl.autoresearch.grading.grade_fn import GradeFnError, load_grade_fn, parse_grade_fn_spec

    try:
        module, name = parse_grade_fn_spec(spec)
    except ValueError as err:
        raise TaskError(f"{task_id}: {err}") from None
    candidates = [spec]
    if module.rsplit(".", 1)[-1] + ".py" in {p.name for p in comp.glob("*.py")}:
        candidates.append(f"{comp / (module.rsplit('.', 1)[-1] + '.py')}:{name}")
    errors = []
    for candidate in candidates:
        try:
            load_grade_fn(candidate, str(comp))
            return candidate
        except GradeFnError as err:
            errors.append(str(err))
    raise TaskError(
        f"{task_id}: its grader has no registry metric and its grader.grade_fn cannot be loaded: "
        + "; ".join(errors)
    )


def _direction_from_leaderboard(task_id: str, scores: Sequence[float]) -> bool:
    """MLE-bench's ``is_lower_better``: the leaderboard is best first, so lower is better iff its first
    score is below its last."""
    if len(scores) < 2 or scores[0] == scores[-1]:
        raise TaskError(
            f"{task_id}: the direction of a grade_fn metric is read from leaderboard.csv (best first), "
            "which needs at least two different scores"
        )
    return scores[0] < scores[-1]
