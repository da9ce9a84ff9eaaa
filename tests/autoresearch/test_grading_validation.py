"""Submission validation: one clear reason per failure, alignment by id, Kaggle's Usage column."""

from __future__ import annotations

import numpy as np
import pytest

from wmrl.autoresearch.grading.scoring import score_submission
from wmrl.autoresearch.grading.validation import SubmissionError, validate_submission
from wmrl.autoresearch.tasks.model import Task
from wmrl.autoresearch.tasks.toy import make_toy_task


@pytest.fixture()
def task(tmp_path):
    return make_toy_task(tmp_path / "tasks", n_train=30, n_test=9)


def _answers(task):
    import pandas as pd

    return pd.read_csv(task.answers_path)


def _write(tmp_path, text: str, name: str = "submission.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _perfect(task) -> str:
    answers = _answers(task)
    return "id,y\n" + "".join(f"{i},{y!r}\n" for i, y in zip(answers["id"], answers["y"], strict=True))


def _code(tmp_path, task, text) -> str:
    with pytest.raises(SubmissionError) as err:
        validate_submission(_write(tmp_path, text), task)
    return err.value.code, err.value.reason


def test_perfect_submission_aligns_and_scores_zero(tmp_path, task):
    rows = _perfect(task).splitlines()
    shuffled = "\n".join([rows[0], *reversed(rows[1:])]) + "\n"  # order does not matter
    aligned = validate_submission(_write(tmp_path, shuffled), task)
    np.testing.assert_allclose(aligned.y_true, aligned.y_pred)
    assert list(aligned.usage).count("Public") == 3
    scored = score_submission(tmp_path / "submission.csv", task)
    assert scored.score == pytest.approx(0.0, abs=1e-12)
    assert scored.position == 1.0
    assert scored.medal.label == "gold"


def test_no_file(tmp_path, task):
    for path in (None, tmp_path / "missing.csv"):
        with pytest.raises(SubmissionError) as err:
            validate_submission(path, task)
        assert err.value.code == "no_file"


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        ("", "empty", "empty"),
        ("id,y\n", "empty", "no rows"),
        ('id,y\n1,"unterminated\n', "unreadable", "not a readable CSV"),
        ("id,target\n1,2\n", "wrong_columns", "missing ['y']"),
        ("id,y,z\n1,2,3\n", "wrong_columns", "unexpected ['z']"),
        (",id,y\n0,1,2\n", "wrong_columns", "index=False"),
        ("id,y,y\n1,2,3\n", "wrong_columns", "repeated"),
    ],
)
def test_malformed_files(tmp_path, task, text, code, fragment):
    got, reason = _code(tmp_path, task, text)
    assert got == code
    assert fragment in reason


def test_unreadable_binary(tmp_path, task):
    path = tmp_path / "submission.csv"
    path.write_bytes(b"\xff\xfe\x00\x81\x82garbage\x00")
    with pytest.raises(SubmissionError) as err:
        validate_submission(path, task)
    assert err.value.code in ("unreadable", "wrong_columns")


def test_id_problems(tmp_path, task):
    good = _perfect(task).splitlines()
    header, rows = good[0], good[1:]
    # duplicate id
    code, reason = _code(tmp_path, task, "\n".join([header, *rows, rows[0]]) + "\n")
    assert code == "duplicate_ids" and rows[0].split(",")[0] in reason
    # one row missing -> wrong row count naming the missing id
    code, reason = _code(tmp_path, task, "\n".join([header, *rows[1:]]) + "\n")
    assert code == "wrong_row_count" and "8 rows" in reason and "1 test ids missing" in reason
    # one id replaced by an unknown one: counts match, ids do not
    code, reason = _code(
        tmp_path, task, "\n".join([header, "999," + rows[0].split(",")[1], *rows[1:]]) + "\n"
    )
    assert code == "missing_ids"
    # an extra row
    code, reason = _code(tmp_path, task, "\n".join([header, *rows, "999,1.0"]) + "\n")
    assert code == "wrong_row_count" and "unknown ids" in reason


def test_value_problems(tmp_path, task):
    ids = list(_answers(task)["id"])

    def sub(values):
        return "id,y\n" + "".join(f"{i},{v}\n" for i, v in zip(ids, values, strict=True))

    code, reason = _code(tmp_path, task, sub(["1.0"] * 8 + [""]))
    assert code == "missing_values" and str(ids[-1]) in reason
    code, reason = _code(tmp_path, task, sub(["1.0"] * 8 + ["nan"]))
    assert code == "non_finite"
    code, reason = _code(tmp_path, task, sub(["1.0"] * 8 + ["inf"]))
    assert code == "non_finite"
    code, reason = _code(tmp_path, task, sub(["1.0"] * 8 + ["abc"]))
    assert code == "wrong_type" and "'abc'" in reason


def test_probability_and_integer_kinds(tmp_path):
    base = make_toy_task(tmp_path / "t", kind="binary", n_test=6)
    from dataclasses import replace

    lossy = replace(base, metric="log_loss", lower_is_better=True)
    ids = list(_answers(base)["id"])
    text = "id,y\n" + "".join(f"{i},{v}\n" for i, v in zip(ids, [0.2, 0.5, 1.5, 0.1, 0.3, 0.9], strict=True))
    with pytest.raises(SubmissionError) as err:
        validate_submission(_write(tmp_path, text), lossy)
    assert err.value.code == "out_of_range"
    kappa = replace(base, metric="quadratic_weighted_kappa")
    text = "id,y\n" + "".join(f"{i},{v}\n" for i, v in zip(ids, [0, 1, 0.5, 1, 0, 1], strict=True))
    with pytest.raises(SubmissionError) as err:
        validate_submission(_write(tmp_path, text), kappa)
    assert err.value.code == "wrong_type" and "whole-number" in reason_of(err)


def reason_of(err) -> str:
    return err.value.reason


def test_public_and_private_rows_are_scored_separately(tmp_path, task):
    answers = _answers(task)
    pred = answers["y"].to_numpy().copy()
    public = (answers["Usage"] == "Public").to_numpy()
    pred[public] += 1.0  # perfect on private rows, off by 1 on public rows
    path = _write(
        tmp_path, "id,y\n" + "".join(f"{i},{v!r}\n" for i, v in zip(answers["id"], pred, strict=True))
    )
    scored = score_submission(path, task)
    assert scored.board_scores["public"] == pytest.approx(1.0)
    assert scored.board_scores["private"] == pytest.approx(0.0)
    assert scored.score == pytest.approx(np.sqrt(public.mean()))
    # public: 1.0 ties/beats 1.0? board is 0.1..3.6 (lower better): beats 1.2..3.6 -> 5 of 10
    assert scored.positions["public"].position_score == pytest.approx(0.5)
    assert scored.positions["private"].position_score == 1.0
    assert scored.position == pytest.approx(0.75)
    assert scored.medal.label == "gold"  # medals use the private board


def test_composite_ids_and_bom(tmp_path):
    folder = tmp_path / "comp"
    (folder / "public").mkdir(parents=True)
    (folder / "private").mkdir()
    (folder / "public" / "sample_submission.csv").write_text("store,day,sales\n1,1,0\n", encoding="utf-8")
    (folder / "private" / "answers.csv").write_text(
        "store,day,sales\n1,1,10\n1,2,20\n2,1,30\n", encoding="utf-8"
    )
    task = Task(
        id="composite",
        description="",
        public_dir=folder / "public",
        answers_path=folder / "private" / "answers.csv",
        sample_submission="sample_submission.csv",
        id_columns=("store", "day"),
        target_columns=("sales",),
        metric="mae",
        lower_is_better=True,
        public_leaderboard=(),
        private_leaderboard=(1.0, 5.0, 10.0),
        category="regression",
        modality="tabular",
    )
    path = tmp_path / "s.csv"
    path.write_bytes("\ufeffday,store,sales\n2,1,22\n1,2,30\n1,1,10\n".encode())
    scored = score_submission(path, task)
    assert scored.score == pytest.approx(2 / 3)
    assert scored.positions["private"].position == 1
    path.write_text("store,day,sales\n1,1,10\n1,2,20\n1,1,30\n", encoding="utf-8")
    with pytest.raises(SubmissionError) as err:
        validate_submission(path, task)
    assert err.value.code == "duplicate_ids" and "1|1" in err.value.reason


def test_ids_are_compared_as_written(tmp_path, task):
    answers = _answers(task)
    first = str(answers["id"].iloc[0])
    text = _perfect(task).replace(f"\n{first},", f"\n{first}.0,", 1)
    code, _ = _code(tmp_path, task, text)
    assert code == "missing_ids"
