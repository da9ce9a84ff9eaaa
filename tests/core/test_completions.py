"""The completions table's rows: one per rollout, unknown values null, never the string "None"."""

from __future__ import annotations

import json

import numpy as np

from wmrl.core.completions import completion_rows
from wmrl.core.correction import Correction


def _correction() -> Correction:
    rewards = np.array([[1.0, 0.0], [0.5, np.nan]])
    return Correction(
        rewards=rewards,
        advantages=np.array([[1.0, -1.0], [0.0, np.nan]]),
        weights=np.ones(2),
        anchor=np.array([True, False]),
        metrics={},
        executed=np.array([[True, True], [True, False]]),
        from_memory=np.array([[False, False], [False, False]]),
    )


def test_a_group_without_a_task_is_null_in_a_batch_where_others_have_one():
    wm = np.array([[0.9, 0.1], [0.4, np.nan]])
    real = np.array([[1.0, 0.0], [0.5, np.nan]])
    rows = completion_rows(3, ["a", "b"], ["task-a", None], _correction(), wm, real)
    assert [r["task"] for r in rows] == ["task-a", "task-a", None, None]
    assert [r["stream"] for r in rows] == ["anchor", "anchor", "anchor", "world_model"]
    assert rows[3]["wm"] is None and rows[3]["reward"] is None  # unknown is null, not NaN
    assert "None" not in json.dumps(rows)  # nothing unknown is written as a string


def test_without_tasks_every_task_is_null():
    wm = np.zeros((2, 2))
    rows = completion_rows(0, ["a", "b"], None, _correction(), wm, wm)
    assert {r["task"] for r in rows} == {None}
