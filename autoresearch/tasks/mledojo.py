"""Load an MLE-Dojo prepared competition (MLE-Dojo/MLE-Dojo) from a user's disk.

``prepare/mle.py`` lays a competition out as ``<data_dir>/<name>/data/`` with

* ``public/``: the training/test files, ``sample_submission.csv`` and ``description.txt``;
* ``private/``: ``test_answer.csv`` and copies of ``public_leaderboard.csv`` and
  ``private_leaderboard.csv`` (plain text, header ``rank,score``; MLE-Dojo reads the scores from
  the second column).

The metric lives in MLE-Dojo's source (``mledojo/competitions/<name>/utils/metric.py``), not in
the data. It is taken, in order, from the ``metric`` argument, from that file when the MLE-Dojo
source is found (``mledojo_root`` argument, ``MLEDOJO_ROOT``, or an installed ``mledojo``
package), or from the Evaluation section of ``description.txt``. The direction comes from the
leaderboards' rank order (rank 1 is best), falling back to the metric's own direction when the
boards are flat.
"""

from __future__ import annotations

import importlib.util
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

__all__ = ["find_mledojo_metric_source", "is_mledojo_dir", "load_mledojo", "mledojo_data_dir"]

_REQUIRED = ("public/description.txt", "public/sample_submission.csv", "private/test_answer.csv")


def mledojo_data_dir(path: Path) -> Path | None:
    """The ``data`` folder (holding ``public/`` and ``private/``) for ``path``, or None."""
    for candidate in (path, path / "data"):
        if all((candidate / rel).is_file() for rel in _REQUIRED):
            return candidate
    return None


def is_mledojo_dir(path: Path) -> bool:
    """True if ``path`` is an MLE-Dojo prepared competition (``<name>`` or ``<name>/data``)."""
    return mledojo_data_dir(path) is not None


def _competition_name(data: Path) -> str:
    return data.parent.name if data.name == "data" else data.name


def find_mledojo_metric_source(name: str, mledojo_root: str | os.PathLike | None = None) -> Path | None:
    """Path of MLE-Dojo's ``metric.py`` for competition ``name``, if the MLE-Dojo source is available."""
    roots = []
    if mledojo_root is not None:
        roots.append(Path(mledojo_root))
    if os.environ.get("MLEDOJO_ROOT"):
        roots.append(Path(os.environ["MLEDOJO_ROOT"]))
    spec = importlib.util.find_spec("mledojo")
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p).parent for p in spec.submodule_search_locations]
    for root in roots:
        for rel in (
            f"mledojo/competitions/{name}/utils/metric.py",
            f"competitions/{name}/utils/metric.py",
            f"{name}/utils/metric.py",
        ):
            if (root / rel).is_file():
                return root / rel
    return None


def _metric_from_source(source: str) -> tuple[str | None, bool | None]:
    """(metric name, higher_is_better) read from an MLE-Dojo ``CompetitionMetrics`` subclass."""
    direction = None
    match = re.search(r"higher_is_better\s*:\s*bool\s*=\s*(True|False)", source)
    if match:
        direction = match.group(1) == "True"
    body = source
    evaluate = re.search(r"def evaluate\(.*?(?=\n    def |\Z)", source, flags=re.DOTALL)
    if evaluate:
        body = evaluate.group(0)
    return detect_metric_in_code(body), direction


def load_mledojo(
    path: str | os.PathLike,
    metric: str | None = None,
    mledojo_root: str | os.PathLike | None = None,
    time_limit_s: float = 3600.0,
    memory_limit_mb: int = 16384,
) -> Task:
    """Build a :class:`Task` from an MLE-Dojo prepared competition folder.

    Args:
        path: ``<data_dir>/<name>`` or ``<data_dir>/<name>/data``.
        metric: metric-registry name (overrides detection).
        mledojo_root: a checkout of MLE-Dojo (to read the competition's ``metric.py``).
        time_limit_s / memory_limit_mb: limits of one execution of a solution.
    """
    from wmrl.autoresearch.grading.metrics import MetricError, get_metric

    data = mledojo_data_dir(Path(path))
    if data is None:
        raise TaskError(f"{path} is not an MLE-Dojo prepared competition (needs {', '.join(_REQUIRED)})")
    name = _competition_name(data)
    public, private = data / "public", data / "private"
    description = (public / "description.txt").read_text(encoding="utf-8")

    source_direction = None
    metric_origin = "argument"
    if metric is None:
        src = find_mledojo_metric_source(name, mledojo_root)
        if src is not None:
            metric, source_direction = _metric_from_source(src.read_text(encoding="utf-8"))
            metric_origin = str(src)
    if metric is None:
        metric = detect_metric_in_text(description)
        metric_origin = "description.txt"
    if metric is None:
        raise TaskError(
            f"{name}: cannot tell the metric (no MLE-Dojo metric.py found and the description names none); "
            "pass metric= or mledojo_root="
        )
    try:
        spec = get_metric(metric)
    except MetricError as err:
        raise TaskError(f"{name}: {err}") from None

    boards = {}
    for board in ("public", "private"):
        board_path = private / f"{board}_leaderboard.csv"
        boards[board] = (
            read_scores(board_path, column=None, rank_column="rank") if board_path.is_file() else []
        )
    if not boards["public"] and not boards["private"]:
        raise TaskError(f"{name}: no public_leaderboard.csv or private_leaderboard.csv in {private}")
    lower = _direction_from_boards(boards)
    if lower is None:
        lower = (not source_direction) if source_direction is not None else spec.lower_is_better

    header = csv_header(public / "sample_submission.csv")
    if len(header) < 2:
        raise TaskError(f"{name}: sample_submission.csv needs an id column and at least one target column")
    labels = answer_labels(private / "test_answer.csv", header[1]) if len(header) == 2 else None
    train = next(iter(sorted(public.glob("train*.csv"))), None)
    return Task(
        id=name,
        description=description,
        public_dir=public,
        answers_path=private / "test_answer.csv",
        sample_submission="sample_submission.csv",
        id_columns=(header[0],),
        target_columns=tuple(header[1:]),
        metric=spec.name,
        lower_is_better=lower,
        public_leaderboard=tuple(boards["public"]),
        private_leaderboard=tuple(boards["private"]),
        category=guess_category(spec.name, len(header) - 1, labels),
        modality=guess_modality(public, train),
        time_limit_s=time_limit_s,
        memory_limit_mb=memory_limit_mb,
        source="mledojo",
        train_files=tuple(p.name for p in sorted(public.glob("train*"))),
        test_files=tuple(p.name for p in sorted(public.glob("test*"))),
        metadata={"metric_from": metric_origin, "data_dir": str(data)},
    )


def _direction_from_boards(boards: dict[str, list[float]]) -> bool | None:
    """lower_is_better from rank-ordered boards (rank 1 first), None when every board is flat."""
    for scores in (boards["private"], boards["public"]):
        if len(scores) >= 2 and scores[0] != scores[-1]:
            return scores[0] < scores[-1]
    return None
