"""The anchor reward source against the core contract, with real execution."""

from __future__ import annotations

import pytest

from wmrl.autoresearch.grading.grader import ExecutionGrader
from wmrl.autoresearch.grading.source import ExecutionRewardSource, as_solution
from wmrl.autoresearch.tasks import Solution
from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task
from wmrl.core.sources import Role, check_pair, check_source, collect_grades


@pytest.fixture()
def task(tmp_path):
    return make_toy_task(tmp_path / "tasks")


def _source(**kw):
    return ExecutionRewardSource(grader=ExecutionGrader(backend="subprocess"), **kw)


def test_source_satisfies_the_core_contract(task):
    source = _source()
    assert source.role == Role.ANCHOR
    items = [(task, TOY_SOLUTION), (task, "syntax error here")]
    assert check_source(source, items, role="anchor") == []
    wm = type(
        "WM", (), {"name": "wm", "role": "world_model", "score": lambda self, items: [0.5] * len(items)}
    )()
    check_pair(wm, source)


def test_grades_carry_status_and_info(task):
    grades = collect_grades(_source(), [(task, TOY_SOLUTION), (task, "raise SystemExit(3)"), (task, "x = (")])
    assert [g.status for g in grades] == ["valid", "runtime_error", "syntax_error"]
    assert grades[0].value > 0.9 and grades[1].value == 0.1 and grades[2].value == 0.0
    assert grades[0].info["score"] < 0.2 and grades[0].info["resources"]["wall_s"] > 0
    assert grades[1].info["exit_code"] == 3


def test_solutions_by_task_folder_and_unknown_tasks(task):
    source = _source(max_workers=2)
    folder = str(task.public_dir.parent)
    items = [Solution(folder, TOY_SOLUTION), {"task_id": "no-such-task", "code": TOY_SOLUTION}]
    grades = source.grade(items)
    assert grades[0].status == "valid"
    # a task that cannot be loaded is unknown (None), with the reason, never 0
    assert grades[1].status == "harness_error" and grades[1].value is None
    assert "no-such-task" in grades[1].info["reason"]
    assert source.score(items)[1] is None


def test_bad_items_are_a_caller_error():
    with pytest.raises(TypeError, match="Solution"):
        as_solution(42)
    with pytest.raises(ValueError, match="max_workers"):
        ExecutionRewardSource(max_workers=0)


def test_source_over_a_sandbox_pool_with_cache(task):
    from wmrl.autoresearch.sandbox import SandboxPool, make_sandbox

    with SandboxPool(make_sandbox("subprocess"), slots=2, cache="memory") as pool:
        source = ExecutionRewardSource(grader=ExecutionGrader(sandbox=pool), max_workers=2)
        first = source.grade([(task, TOY_SOLUTION), (task, "raise SystemExit(1)")])
        again = source.grade([(task, TOY_SOLUTION)])
    assert [g.status for g in first] == ["valid", "runtime_error"]
    assert again[0].value == first[0].value
    assert again[0].info["cached"] is True and first[0].info["cached"] is False  # served from the cache


def test_execution_metrics_are_the_valid_rate_and_mean_position_of_the_executed_rollouts():
    """Closed form: 4 executions, one harness failure (left out), 2 valid at positions 0.5 and 0.9."""
    from wmrl.autoresearch.training.streams import EXECUTION_METRICS, execution_metrics
    from wmrl.core.sources import Grade

    grades = [
        Grade(0.75, "valid", info={"position": 0.5}),
        Grade(0.95, "valid", info={"position": 0.9}),
        Grade(0.1, "runtime_error", info={"position": None}),
        Grade(None, "harness_error"),
    ]
    m = execution_metrics(grades)
    assert set(m) == set(EXECUTION_METRICS)
    assert m["executed/valid_rate"] == pytest.approx(2 / 3)
    assert m["executed/position"] == pytest.approx((0.5 + 0.9 + 0.0) / 3)
    assert m["executed/valid_position"] == pytest.approx(0.7)
    assert execution_metrics([Grade(None)]) == dict.fromkeys(EXECUTION_METRICS)  # unknown, not zero
    assert execution_metrics([Grade(0.1, "syntax_error")])["executed/valid_position"] is None
