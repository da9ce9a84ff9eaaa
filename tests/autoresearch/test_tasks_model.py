"""The shared task model validates itself."""

from __future__ import annotations

from dataclasses import replace

import pytest

from wmrl.autoresearch.tasks import Solution, Task, TaskError


def _task(tmp_path, **kw):
    fields = {
        "id": "t",
        "description": "d",
        "public_dir": tmp_path / "public",
        "answers_path": tmp_path / "private" / "answers.csv",
        "sample_submission": "sample_submission.csv",
        "id_columns": "id",
        "target_columns": ["y"],
        "metric": "rmse",
        "lower_is_better": True,
        "public_leaderboard": [1, 2],
        "private_leaderboard": (),
        "category": "regression",
        "modality": "tabular",
    }
    fields.update(kw)
    return Task(**fields)


def test_normalises_fields(tmp_path):
    task = _task(tmp_path)
    assert task.id_columns == ("id",) and task.target_columns == ("y",)
    assert task.public_leaderboard == (1.0, 2.0)
    assert task.leaderboards == {"public": (1.0, 2.0)}
    assert task.sample_submission_path == tmp_path / "public" / "sample_submission.csv"
    assert hash(task) == hash(_task(tmp_path))
    assert task.with_limits(time_limit_s=5).time_limit_s == 5.0
    with pytest.raises(AttributeError):
        task.id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"id": "a/b"}, "task id"),
        ({"id_columns": []}, "id_columns"),
        ({"target_columns": ["id"]}, "both id and target"),
        ({"target_columns": ["y", "y"]}, "duplicate"),
        ({"public_leaderboard": [], "private_leaderboard": []}, "reference to rank against"),
        ({"public_leaderboard": [1.0, float("nan")]}, "non-finite"),
        ({"category": "ranking"}, "category"),
        ({"modality": "video"}, "modality"),
        ({"source": "kaggle"}, "source"),
        ({"time_limit_s": 0}, "time_limit_s"),
        ({"memory_limit_mb": 1.5}, "memory_limit_mb"),
        ({"lower_is_better": "yes"}, "lower_is_better"),
        ({"baseline_score": 1.0}, "together"),
        ({"baseline_score": 1.0, "oracle_score": 1.0}, "divide by 0"),
    ],
)
def test_rejects_broken_tasks(tmp_path, kw, message):
    with pytest.raises(TaskError, match=message):
        _task(tmp_path, **kw)


def test_answers_inside_the_public_folder_are_rejected(tmp_path):
    with pytest.raises(TaskError, match="inside the public folder"):
        _task(tmp_path, answers_path=tmp_path / "public" / "answers.csv")


def test_relative_gap_references_replace_a_leaderboard(tmp_path):
    task = _task(tmp_path, public_leaderboard=[], baseline_score=4, oracle_score=0)
    assert task.leaderboards == {} and (task.baseline_score, task.oracle_score) == (4.0, 0.0)
    assert replace(task, oracle_score=1.0).oracle_score == 1.0


def test_solution():
    assert Solution("wine-cultivar", "print(1)").task_id == "wine-cultivar"
    with pytest.raises(TaskError):
        Solution("", "x")
    with pytest.raises(TaskError):
        Solution("t", None)  # type: ignore[arg-type]
