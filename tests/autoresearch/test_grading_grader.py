"""End-to-end grading of solution scripts through the real sandbox backends."""

from __future__ import annotations

import pytest

from wmrl.autoresearch.grading.grader import ExecutionGrader, check_syntax
from wmrl.autoresearch.grading.ladder import RewardLadder
from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task

NO_SUBMISSION = "print('thinking hard, writing nothing')\n"
CRASH = "import os\nraise ValueError('bad feature ' + os.environ['DATA_DIR'])\n"
WRONG_COLUMNS = TOY_SOLUTION.replace('{"id": test["id"], "y": pred}', '{"id": test["id"], "target": pred}')
SLOW = "import time\ntime.sleep(30)\n"
CONSTANT = TOY_SOLUTION.replace('"y": pred', '"y": pred * 0 + 1.0')


@pytest.fixture()
def task(tmp_path):
    return make_toy_task(tmp_path / "tasks", time_limit_s=60)


def _grader(backend: str, **kw) -> ExecutionGrader:
    return ExecutionGrader(backend=backend, **kw)


BACKENDS = [
    pytest.param("subprocess", id="subprocess"),
    pytest.param("bwrap", id="bwrap", marks=pytest.mark.bwrap),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_outcomes_climb_the_ladder(backend, task):
    grader = _grader(backend)
    good = grader.grade(task, TOY_SOLUTION)
    assert good.status == "valid", good.reason
    assert good.score < 0.2  # noise sd 0.1
    assert good.position >= 0.9 and good.reward == pytest.approx(0.5 + 0.5 * good.position)
    assert good.medal in ("gold", "silver")
    assert good.resources["wall_s"] > 0
    assert good.isolated is (backend != "subprocess")
    if backend == "subprocess":
        assert any("isolat" in w.lower() for w in good.warnings)

    weak = grader.grade(task, CONSTANT)
    assert weak.status == "valid" and weak.reward < good.reward

    crash = grader.grade(task, CRASH)
    assert (crash.status, crash.reward) == ("runtime_error", 0.1)
    assert "ValueError" in crash.reason and crash.exit_code not in (0, None)

    silent = grader.grade(task, NO_SUBMISSION)
    assert (silent.status, silent.reward, silent.submission_error) == ("no_submission", 0.2, "no_file")

    wrong = grader.grade(task, WRONG_COLUMNS)
    assert (wrong.status, wrong.reward, wrong.submission_error) == (
        "invalid_submission",
        0.2,
        "wrong_columns",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_timeout_is_the_solutions_failure(backend, task):
    result = _grader(backend, time_limit_s=2.0).grade(task, SLOW)
    assert result.status == "timeout"
    assert result.reward == 0.1
    assert result.time_limit_s == 2.0
    assert result.resources["wall_s"] < 20
    configured = _grader(backend, time_limit_s=2.0, ladder=RewardLadder(timeout=0.05)).grade(task, SLOW)
    assert configured.reward == 0.05


def test_syntax_error_never_reaches_the_sandbox(task):
    # A backend that cannot run (bad name is rejected; docker without engine would harness-error)
    # is never built: syntax errors are caught before.
    grader = ExecutionGrader(backend="docker")
    result = grader.grade(task, "def f(:\n    pass\n")
    assert (result.status, result.reward) == ("syntax_error", 0.0)
    assert "line 1" in result.reason
    assert grader._sandbox is None
    assert check_syntax("x = 1\n") is None
    assert check_syntax("x = 1\0") is not None  # NUL bytes: not a script


def test_missing_answers_is_a_harness_error(task):
    task.answers_path.unlink()
    result = _grader("subprocess").grade(task, TOY_SOLUTION)
    assert result.status == "harness_error"
    assert result.reward is None
    assert "answers" in result.reason


@pytest.mark.docker
def test_docker_backend_grades(task):
    assert _grader("docker").grade(task, TOY_SOLUTION).status == "valid"


def test_unavailable_backend_is_a_harness_error_not_zero(task, tmp_path):
    """A backend that cannot run (here: bubblewrap named at a path where there is none) grades
    every solution as unknown, never as a failure of the solution."""
    from wmrl.autoresearch.sandbox import make_sandbox

    broken = make_sandbox("bwrap", bwrap=str(tmp_path / "no-such-bwrap"), output_root=tmp_path / "out")
    result = ExecutionGrader(sandbox=broken).grade(task, TOY_SOLUTION)
    assert result.status == "harness_error"
    assert result.reward is None
    assert result.reason


def test_grade_submission_without_execution(tmp_path, task):
    grader = ExecutionGrader()
    assert grader.grade_submission(task, tmp_path / "none.csv").status == "no_submission"
    sample = grader.grade_submission(task, task.sample_submission_path)
    assert sample.status == "valid" and sample.score > 1.0
    result = sample.to_grade()
    assert result.value == sample.reward and result.status == "valid" and result.info["score"] == sample.score


@pytest.mark.bwrap
def test_bundled_answers_are_out_of_reach_in_bubblewrap():
    """A solution that would score perfectly by copying the bundled answers cannot read them: they
    sit in the installed package, which bubblewrap hides; only a copy of the public folder is mounted."""
    from wmrl.autoresearch.tasks import load_bundled

    task = load_bundled("wine-cultivar")
    cheat = f"""
import os, shutil
import pandas as pd
answers = pd.read_csv({str(task.answers_path)!r})
answers.drop(columns=["Usage"]).to_csv(os.environ["SUBMISSION_PATH"], index=False)
"""
    result = ExecutionGrader(backend="bwrap").grade(task, cheat)
    assert result.status == "runtime_error", result
    assert "No such file" in result.stderr_tail or "FileNotFoundError" in result.stderr_tail
    # the same script does score perfectly where it can see the file: the cheat is real
    unsafe = ExecutionGrader(backend="subprocess").grade(task, cheat)
    assert unsafe.status == "valid" and unsafe.score == pytest.approx(0.0, abs=1e-9)
