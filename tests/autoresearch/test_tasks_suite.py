"""The bundled offline suite: what it ships, and that its build is deterministic."""

from __future__ import annotations

import csv
import filecmp
import json

import pytest

from wmrl.autoresearch.grading.grader import ExecutionGrader
from wmrl.autoresearch.tasks import (
    EVAL_TASKS,
    SUITE_DIR,
    TRAIN_TASKS,
    list_suite,
    load_bundled,
    load_task,
    suite_split,
)
from wmrl.autoresearch.tasks.build_suite import SPECS, build_task

SUITE = list_suite()


def test_suite_is_complete_and_split():
    assert len(SUITE) >= 12
    assert set(SUITE) == set(TRAIN_TASKS) | set(EVAL_TASKS) == {s.id for s in SPECS}
    assert not set(TRAIN_TASKS) & set(EVAL_TASKS)
    tasks = [load_bundled(t) for t in SUITE]
    for split in ("train", "eval"):
        members = [t for t in tasks if suite_split(t.id) == split]
        assert {t.category for t in members} >= {"binary", "multiclass", "regression"}, split
        assert "text" in {t.modality for t in members}, split
    with pytest.raises(Exception, match="split"):
        suite_split("not-a-task")


def test_suite_has_varied_sizes_and_stays_small():
    rows = [load_bundled(t).metadata["rows"]["train"] for t in SUITE]
    assert min(rows) < 500 and max(rows) >= 5000
    total = sum(p.stat().st_size for p in SUITE_DIR.rglob("*") if p.is_file())
    assert total < 15 * 1024 * 1024, f"the suite is {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("task_id", SUITE)
def test_bundled_task(task_id):
    task = load_task(task_id)
    assert task.source == "bundled"
    assert "## Evaluation" in task.description and task.metric in task.description
    for name in ("train.csv", "test.csv", "sample_submission.csv", "description.md"):
        assert (task.public_dir / name).is_file(), name
    assert not any(p.name.startswith("answers") for p in task.public_dir.iterdir())
    with open(task.public_dir / "test.csv", encoding="utf-8") as fh:
        test_header = next(csv.reader(fh))
    assert not set(task.target_columns) & set(test_header)
    # the answers cover exactly the test ids, split into public and private rows
    with open(task.answers_path, encoding="utf-8") as fh:
        answers = list(csv.DictReader(fh))
    with open(task.public_dir / "test.csv", encoding="utf-8") as fh:
        test_ids = [row["id"] for row in csv.DictReader(fh)]
    assert sorted(r["id"] for r in answers) == sorted(test_ids)
    assert {r["Usage"] for r in answers} == {"Public", "Private"}
    # leaderboards come from >= 50 distinct, really-run pipelines, dummy baselines included
    assert len(task.public_leaderboard) == len(task.private_leaderboard) >= 50
    with open(task.answers_path.parent / "leaderboard.csv", encoding="utf-8") as fh:
        names = [row["pipeline"] for row in csv.DictReader(fh)]
    assert len(set(names)) == len(names) >= 50
    assert any(n.startswith("dummy") for n in names)
    assert len(set(task.private_leaderboard)) >= 10  # a spread, not a handful of ties
    meta = json.loads((task.public_dir.parent / "task.json").read_text())
    assert {"package", "dataset", "data_licence"} <= set(meta["provenance"])
    # the sample submission is valid and lands low on the board
    sample = ExecutionGrader().grade_submission(task, task.sample_submission_path)
    assert sample.status == "valid", sample.reason
    assert sample.position <= 0.5


def test_build_is_deterministic(tmp_path):
    """Rebuilding a task reproduces the committed files byte for byte."""
    spec = next(s for s in SPECS if s.id == "wine-cultivar")
    build_task(spec, tmp_path, log=lambda *_: None)
    fresh, shipped = tmp_path / spec.id, SUITE_DIR / spec.id
    files = sorted(p.relative_to(shipped) for p in shipped.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    mismatched = [
        str(f)
        for f in files
        if f.name != "task.json" and not filecmp.cmp(shipped / f, fresh / f, shallow=False)
    ]
    assert mismatched == []
    # task.json differs only in build timings (none are stored) — compare it whole
    assert json.loads((shipped / "task.json").read_text()) == json.loads((fresh / "task.json").read_text())
