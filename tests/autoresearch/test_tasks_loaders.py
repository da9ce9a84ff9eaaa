"""Loaders for MLE-bench, MLE-Dojo and DSBench folders, on small fixtures written in each format.

The fixture layouts follow the upstream projects' code: MLE-bench's ``registry.py``/``data.py``
(``config.yaml`` + ``leaderboard.csv`` in the registry, ``<id>/prepared/{public,private}`` in the
data dir), MLE-Dojo's ``prepare/mle.py`` (``<name>/data/{public,private}``, ``rank,score``
leaderboards copied into ``private/``) and DSBench's ``data_modeling`` scripts
(``data_resplit/``, ``answers/``, ``task/``, ``evaluation/<name>_eval.py``, ``save_performance``).
"""

from __future__ import annotations

import textwrap

import pytest

from wmrl.autoresearch.grading.grader import ExecutionGrader
from wmrl.autoresearch.tasks import TaskError, detect_format, load_task
from wmrl.autoresearch.tasks.dsbench import load_dsbench
from wmrl.autoresearch.tasks.mlebench import load_mlebench
from wmrl.autoresearch.tasks.mledojo import load_mledojo
from wmrl.autoresearch.tasks.model import Task


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


# ------------------------------------------------------------------ MLE-bench


def _mlebench(tmp_path, grader="accuracy", leaderboard=None):
    comp = tmp_path / "mlebench" / "competitions" / "spaceship-lite"
    _write(
        comp / "config.yaml",
        f"""
        id: spaceship-lite
        name: Spaceship Lite
        competition_type: simple
        awards_medals: false
        prizes: null
        description: mlebench/competitions/spaceship-lite/description.md

        dataset:
          answers: spaceship-lite/prepared/private/test.csv
          sample_submission: spaceship-lite/prepared/public/sample_submission.csv

        grader:
          name: {grader}
          grade_fn: mlebench.competitions.spaceship-lite.grade:grade

        preparer: mlebench.competitions.spaceship-lite.prepare:prepare
        """,
    )
    _write(comp / "description.md", "# Spaceship Lite\n\n## Evaluation\n\nClassification accuracy.\n")
    _write(
        comp / "leaderboard.csv",
        leaderboard
        or """
        scoreNullable,teamId,hasTeamName,submissionDate,score,hasScore
        0.9,1,True,2022-03-01,0.9,True
        0.8,2,True,2022-03-01,0.8,True
        0.8,3,True,2022-03-01,0.8,True
        0.7,4,True,2022-03-01,0.7,True
        0.6,5,True,2022-03-01,0.6,True
        ,6,True,2022-03-01,,False
        """,
    )
    data = tmp_path / "mle-data"
    public = data / "spaceship-lite" / "prepared" / "public"
    _write(public / "train.csv", "PassengerId,Age,Transported\n0001_01,30,True\n0002_01,40,False\n")
    _write(public / "test.csv", "PassengerId,Age\n0003_01,20\n0004_01,50\n0005_01,60\n0006_01,70\n")
    _write(
        public / "sample_submission.csv",
        "PassengerId,Transported\n0003_01,False\n0004_01,False\n0005_01,False\n0006_01,False\n",
    )
    _write(
        data / "spaceship-lite" / "prepared" / "private" / "test.csv",
        "PassengerId,Age,Transported\n0003_01,20,True\n0004_01,50,False\n0005_01,60,True\n0006_01,70,True\n",
    )
    return comp, data


def test_mlebench_competition_loads(tmp_path):
    comp, data = _mlebench(tmp_path)
    task = load_mlebench(comp, data_dir=data)
    assert task.id == "spaceship-lite" and task.source == "mlebench"
    assert task.metric == "accuracy" and task.lower_is_better is False
    assert task.id_columns == ("PassengerId",) and task.target_columns == ("Transported",)
    assert task.private_leaderboard == (0.9, 0.8, 0.8, 0.7, 0.6)  # the row without a score is dropped
    assert task.public_leaderboard == ()
    assert task.category == "binary" and task.modality == "tabular"
    assert task.public_dir == data / "spaceship-lite" / "prepared" / "public"
    assert task.answers_path.name == "test.csv" and "Classification accuracy" in task.description
    assert task.metadata["grader"] == "accuracy"
    assert detect_format(comp) == "mlebench"
    assert load_task(comp, data_dir=data) == task


def test_mlebench_grading(tmp_path):
    comp, data = _mlebench(tmp_path)
    task = load_task(comp, data_dir=data)
    grader = ExecutionGrader()
    perfect = _write(
        tmp_path / "perfect.csv",
        "PassengerId,Transported\n0003_01,True\n0004_01,False\n0005_01,True\n0006_01,True\n",
    )
    result = grader.grade_submission(task, perfect)
    assert (result.status, result.score, result.position, result.medal) == ("valid", 1.0, 1.0, "gold")
    sample = grader.grade_submission(task, task.sample_submission_path)
    assert sample.score == 0.25 and sample.position == 0.0 and sample.medal == "none"


def test_mlebench_data_dir_from_environment(tmp_path, monkeypatch):
    comp, data = _mlebench(tmp_path)
    monkeypatch.setenv("MLEBENCH_DATA_DIR", str(data))
    assert load_mlebench(comp).public_dir.is_dir()


def test_mlebench_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("MLEBENCH_DATA_DIR", raising=False)
    comp, _ = _mlebench(tmp_path)
    with pytest.raises(TaskError, match="mlebench prepare"):
        load_mlebench(comp, data_dir=tmp_path / "elsewhere")
    comp2, data2 = _mlebench(tmp_path / "b", grader="dice-hausdorff-combo")
    with pytest.raises(TaskError, match="no registry metric"):
        load_mlebench(comp2, data_dir=data2)
    assert load_mlebench(comp2, data_dir=data2, metric="balanced_accuracy").metric == "balanced_accuracy"
    comp3, data3 = _mlebench(
        tmp_path / "c", leaderboard="version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 1\n"
    )
    with pytest.raises(TaskError, match="Git LFS pointer"):
        load_mlebench(comp3, data_dir=data3)


# ------------------------------------------------------------------ MLE-Dojo

METRIC_PY = """
from typing import Any
import numpy as np
import pandas as pd
from sklearn.metrics import mean_squared_error, accuracy_score
from mledojo.metrics.base import CompetitionMetrics, InvalidSubmissionError

class HousePricesMetrics(CompetitionMetrics):
    def __init__(self, value: str = "SalePrice", higher_is_better: bool = False):
        super().__init__(higher_is_better)
        self.value = value

    def evaluate(self, y_true: pd.DataFrame, y_pred: pd.DataFrame) -> float:
        return np.sqrt(mean_squared_error(np.log(y_true[self.value]), np.log(y_pred[self.value])))

    def validate_submission(self, submission: Any, ground_truth: Any) -> str:
        if accuracy_score is None:
            raise InvalidSubmissionError("never")
        return "Submission is valid."
"""


def _mledojo(
    tmp_path, description="## Evaluation\n\nSubmissions are evaluated on Root-Mean-Squared-Error (RMSE).\n"
):
    data = tmp_path / "dojo" / "house-lite" / "data"
    _write(data / "public" / "description.txt", f"# House prices lite\n\n{description}")
    _write(data / "public" / "train.csv", "Id,LotArea,SalePrice\n1,8450,208500\n2,9600,181500\n")
    _write(data / "public" / "test.csv", "Id,LotArea\n3,11250\n4,9550\n")
    _write(data / "public" / "sample_submission.csv", "Id,SalePrice\n3,180000\n4,180000\n")
    _write(data / "private" / "test_answer.csv", "Id,SalePrice\n3,223500\n4,140000\n")
    _write(data / "private" / "public_leaderboard.csv", "rank,score\n1,0.0\n2,0.1\n3,0.2\n4,0.3\n")
    _write(data / "private" / "private_leaderboard.csv", "rank,score\n2,0.15\n1,0.05\n3,0.25\n")
    return data


def test_mledojo_competition_loads(tmp_path):
    data = _mledojo(tmp_path)
    for path in (data, data.parent):  # <name>/data and <name> both work
        task = load_mledojo(path)
        assert task.id == "house-lite" and task.source == "mledojo"
        assert task.metric == "rmse" and task.metadata["metric_from"] == "description.txt"
        assert task.lower_is_better is True  # rank 1 has the smallest score
        assert task.public_leaderboard == (0.0, 0.1, 0.2, 0.3)
        assert task.private_leaderboard == (0.05, 0.15, 0.25)  # ordered by rank
        assert task.answers_path == data / "private" / "test_answer.csv"
        assert task.category == "regression"
        assert detect_format(path) == "mledojo"


def test_mledojo_metric_from_source(tmp_path):
    data = _mledojo(tmp_path, description="No evaluation section here.\n")
    with pytest.raises(TaskError, match="cannot tell the metric"):
        load_mledojo(data)
    root = tmp_path / "MLE-Dojo"
    _write(root / "mledojo" / "competitions" / "house-lite" / "utils" / "metric.py", METRIC_PY)
    task = load_mledojo(data, mledojo_root=root)
    # evaluate() computes an RMSE of logs; the registry's closest name is read from the call
    assert task.metric == "rmse" and task.metadata["metric_from"].endswith("metric.py")
    assert load_task(data, metric="mae").metric == "mae"


def test_mledojo_grading_uses_both_boards(tmp_path):
    task = load_task(_mledojo(tmp_path))
    submission = _write(tmp_path / "s.csv", "Id,SalePrice\n3,223500.1\n4,140000\n")
    result = ExecutionGrader().grade_submission(task, submission)
    assert result.status == "valid" and result.score == pytest.approx(0.1 / 2**0.5)
    # no Usage column: one score ranked on both boards, MLE-Dojo's way
    assert result.board_scores == {"public": result.score, "private": result.score}
    assert result.positions["public"]["position_score"] == pytest.approx(3 / 4)
    assert result.positions["private"]["position_score"] == pytest.approx(2 / 3)  # beats 0.15 and 0.25
    assert result.position == pytest.approx((3 / 4 + 2 / 3) / 2)


# ------------------------------------------------------------------ DSBench

EVAL_PY = """
import os.path
import numpy as np
import pandas as pd
import argparse
from sklearn.metrics import roc_auc_score
from sklearn.metrics import mean_squared_error

parser = argparse.ArgumentParser()
parser.add_argument('--path', type=str, required=True)
parser.add_argument('--name', type=str, required=True)
parser.add_argument('--answer_file', type=str, required=True)
parser.add_argument('--predict_file', type=str, required=True)
parser.add_argument('--value', type=str, default="MedHouseVal")
args = parser.parse_args()

actual = pd.read_csv( args.answer_file)
submission = pd.read_csv( args.predict_file)
performance = np.sqrt(mean_squared_error(actual[args.value], submission[args.value]))
with open(os.path.join(args.path, args.name, "result.txt"), "w") as f:
    f.write(str(performance))
"""


def _dsbench(tmp_path, with_refs=True):
    root = tmp_path / "DSBench" / "data_modeling"
    name = "playground-series-s3e1"
    _write(
        root / "data" / "data_resplit" / name / "train.csv", "id,MedInc,MedHouseVal\n0,8.3,4.5\n1,7.2,3.5\n"
    )
    _write(root / "data" / "data_resplit" / name / "test.csv", "id,MedInc\n2,5.6\n3,3.8\n")
    _write(root / "data" / "data_resplit" / name / "sample_submission.csv", "id,MedHouseVal\n2,2.0\n3,2.0\n")
    _write(root / "data" / "answers" / name / "test_answer.csv", "id,MedHouseVal\n2,3.0\n3,1.0\n")
    _write(
        root / "data" / "task" / f"{name}.txt",
        "Predict MedHouseVal. Submissions are scored on the root mean squared error.\n",
    )
    _write(root / "evaluation" / f"{name}_eval.py", EVAL_PY)
    if with_refs:
        _write(root / "save_performance" / "GT" / name / "result.txt", "0.0")
        _write(root / "save_performance" / "baseline" / name / "result.txt", "1.0")
    return root, name


def test_dsbench_task_loads_with_relative_gap(tmp_path):
    root, name = _dsbench(tmp_path)
    task = load_dsbench(root, name)
    assert task.id == name and task.source == "dsbench"
    assert task.metric == "rmse" and task.metadata["metric_from"].endswith(f"{name}_eval.py")
    assert task.target_columns == ("MedHouseVal",) and task.id_columns == ("id",)
    assert (task.oracle_score, task.baseline_score, task.lower_is_better) == (0.0, 1.0, True)
    assert task.leaderboards == {}
    public = root / "data" / "data_resplit" / name
    assert detect_format(public) == "dsbench"
    assert load_task(public) == task
    half = _write(tmp_path / "half.csv", "id,MedHouseVal\n2,2.5\n3,1.5\n")  # RMSE 0.5: half the gap
    result = ExecutionGrader().grade_submission(task, half)
    assert result.status == "valid" and result.score == pytest.approx(0.5)
    assert (
        result.position == pytest.approx(0.5)
        and result.medal is None
        and result.reward == pytest.approx(0.75)
    )


def test_dsbench_needs_something_to_rank_against(tmp_path):
    root, name = _dsbench(tmp_path, with_refs=False)
    with pytest.raises(TaskError, match="nothing to rank against"):
        load_dsbench(root, name)
    dojo = tmp_path / "MLE-Dojo"
    _write(
        dojo / "mledojo" / "competitions" / name / "info" / "private_leaderboard.csv",
        "rank,score\n1,0.55\n2,0.6\n3,0.9\n",
    )
    task = load_dsbench(root, name, mledojo_root=dojo)
    assert task.private_leaderboard == (0.55, 0.6, 0.9) and task.baseline_score is None


def test_unknown_folders_and_ids_are_explained(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="not a task folder in a known format"):
        load_task(tmp_path / "empty")
    with pytest.raises(TaskError, match="neither a bundled task id"):
        load_task("no-such-task")


_OWN_GRADER = '''
import numpy as np


class InvalidSubmissionError(Exception):
    """MLE-bench's exception for a malformed submission (its graders raise it)."""


def grade(submission, answers):
    """Accuracy weighted by Age: a metric the registry has no equivalent of."""
    if list(submission.columns) != ["PassengerId", "Transported"]:
        raise InvalidSubmissionError("wrong columns")
    merged = answers.merge(submission, on="PassengerId", suffixes=("", "_pred"))
    if merged["Transported_pred"].dtype != bool:
        raise InvalidSubmissionError("Transported must be True or False")
    hit = (merged["Transported"] == merged["Transported_pred"]).to_numpy(float)
    return float(np.average(hit, weights=merged["Age"]))
'''


def test_mlebench_grade_fn_grades_where_the_registry_has_no_metric(tmp_path):
    """A competition whose grader the registry lacks is graded by its own grade_fn (the folder's
    grade.py when the mlebench package is absent), with MLE-bench's outcomes: a score, an
    InvalidSubmissionError → invalid, any other failure → the grader's, never the submission's 0."""
    comp, data = _mlebench(tmp_path, grader="age-weighted-accuracy")
    (comp / "grade.py").write_text(_OWN_GRADER)
    task = load_task(comp, data_dir=data)
    assert task.grade_fn == f"{comp / 'grade.py'}:grade" and task.metric == "age-weighted-accuracy"
    assert task.lower_is_better is False  # best first: 0.9 ... 0.6
    grader = ExecutionGrader()
    # answers True, False, True, True with ages 20, 50, 60, 70; two right answers: ages 20 + 70
    half = _write(
        tmp_path / "half.csv",
        "PassengerId,Transported\n0003_01,True\n0004_01,True\n0005_01,False\n0006_01,True\n",
    )
    result = grader.grade_submission(task, half)
    assert result.status == "valid" and result.score == pytest.approx(90 / 200)
    assert result.position == 0.0  # below every leaderboard score
    perfect = _write(
        tmp_path / "perfect.csv",
        "PassengerId,Transported\n0003_01,True\n0004_01,False\n0005_01,True\n0006_01,True\n",
    )
    assert grader.grade_submission(task, perfect).medal == "gold"
    refused = _write(
        tmp_path / "refused.csv",
        "PassengerId,Transported\n0003_01,yes\n0004_01,no\n0005_01,yes\n0006_01,yes\n",
    )
    result = grader.grade_submission(task, refused)
    assert result.status == "invalid_submission" and "must be True or False" in result.reason
    # the structural checks still come first: the task's code never sees a missing id
    short = _write(tmp_path / "short.csv", "PassengerId,Transported\n0003_01,True\n")
    assert grader.grade_submission(task, short).submission_error == "wrong_row_count"


def test_mlebench_grade_fn_that_breaks_is_the_graders_failure(tmp_path):
    comp, data = _mlebench(tmp_path, grader="broken-metric")
    (comp / "grade.py").write_text("def grade(submission, answers):\n    return float('nan')\n")
    task = load_task(comp, data_dir=data)
    result = ExecutionGrader().grade_submission(task, task.sample_submission_path)
    assert (
        result.status == "harness_error" and result.reward is None and "not a finite score" in result.reason
    )


def test_mlebench_grade_fn_direction_and_errors(tmp_path):
    lower = """
        score
        0.1
        0.2
        0.5
        """
    comp, data = _mlebench(tmp_path, grader="custom-loss", leaderboard=lower)
    (comp / "grade.py").write_text(_OWN_GRADER)
    assert load_mlebench(comp, data_dir=data).lower_is_better is True  # best first and smallest
    comp2, data2 = _mlebench(tmp_path / "b", grader="custom-loss")
    (comp2 / "grade.py").write_text("import mlebench_not_installed\n\ndef grade(s, a):\n    return 0.0\n")
    with pytest.raises(TaskError, match=r"cannot be imported.*mlebench_not_installed"):
        load_mlebench(comp2, data_dir=data2)
    with pytest.raises(TaskError, match="grade_fn"):
        Task(**{**_task_fields(load_mlebench(comp, data_dir=data)), "grade_fn": "no-colon"})


def _task_fields(task):
    import dataclasses

    return {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
