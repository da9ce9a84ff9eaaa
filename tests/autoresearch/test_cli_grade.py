"""``wmrl tasks list|show`` and ``wmrl grade`` end to end, with the real sandbox."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wmrl.core.cli import main

GOOD = """\
import os
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

data = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(data, "train.csv"))
test = pd.read_csv(os.path.join(data, "test.csv"))
model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
model.fit(train.drop(columns=["id", "cultivar"]), train["cultivar"])
proba = model.predict_proba(test.drop(columns=["id"]))
submission = pd.DataFrame(proba, columns=model.classes_)
submission.insert(0, "id", test["id"])
submission.to_csv(os.environ["SUBMISSION_PATH"], index=False)
"""
BROKEN = "import pandas as pd\nprint('unclosed'\n"
CRASH = "import os\nopen(os.path.join(os.environ['DATA_DIR'], 'no_such_file.csv'))\n"


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tasks_list_json(capsys):
    code, out, _ = _run(capsys, "tasks", "list", "--json")
    assert code == 0
    entries = json.loads(out)
    assert len(entries) >= 12
    for entry in entries:
        assert {"id", "split", "metric", "category", "modality", "lower_is_better"} <= set(entry)
        assert entry["split"] in ("train", "eval")
    assert {e["split"] for e in entries} == {"train", "eval"}
    code, out, _ = _run(capsys, "tasks", "list", "--split", "eval", "--json")
    assert {e["split"] for e in json.loads(out)} == {"eval"}


def test_tasks_list_text(capsys):
    code, out, _ = _run(capsys, "tasks", "list")
    assert code == 0 and "wine-cultivar" in out and "log_loss (↓)" in out


def test_tasks_show(capsys):
    code, out, _ = _run(capsys, "tasks", "show", "wine-cultivar")
    assert code == 0
    assert "metric: log_loss (lower is better)" in out and "## Evaluation" in out
    assert "private leaderboard: 60 entries" in out
    code, out, _ = _run(capsys, "tasks", "show", "wine-cultivar", "--json")
    info = json.loads(out)
    assert info["target_columns"] == ["class_0", "class_1", "class_2"]
    assert info["leaderboards"]["private"]["size"] >= 50
    assert info["provenance"]["package"] == "scikit-learn"
    code, _, err = _run(capsys, "tasks", "show", "no-such-task")
    assert code == 2 and "no-such-task" in err


def _grade(capsys, tmp_path, code_text, *extra):
    solution = tmp_path / "solution.py"
    solution.write_text(code_text, encoding="utf-8")
    return _run(capsys, "grade", "wine-cultivar", str(solution), "--json", *extra)


def test_grade_good_and_broken_with_subprocess_backend(capsys, tmp_path):
    code, out, _ = _grade(capsys, tmp_path, GOOD, "--backend", "subprocess")
    assert code == 0
    result = json.loads(out)
    assert {"status", "score", "position", "medal", "reward", "isolated", "resources"} <= set(result)
    assert result["status"] == "valid"
    assert result["score"] < 0.3  # log loss of a decent model on wine
    assert result["position"] > 0.5 and result["reward"] == pytest.approx(0.5 + 0.5 * result["position"])
    assert result["medal"] in ("gold", "silver", "bronze", "above_median")
    assert result["isolated"] is False and result["warnings"]  # the fallback says so
    assert result["resources"]["wall_s"] > 0

    code, out, _ = _grade(capsys, tmp_path, BROKEN, "--backend", "subprocess")
    result = json.loads(out)
    assert code == 0 and (result["status"], result["reward"], result["score"]) == ("syntax_error", 0.0, None)

    code, out, _ = _grade(capsys, tmp_path, CRASH, "--backend", "subprocess")
    result = json.loads(out)
    assert (result["status"], result["reward"]) == ("runtime_error", 0.1)
    assert "FileNotFoundError" in result["reason"]


@pytest.mark.bwrap
def test_grade_in_bubblewrap(capsys, tmp_path):
    code, out, _ = _grade(capsys, tmp_path, GOOD, "--backend", "bwrap")
    result = json.loads(out)
    assert (
        code == 0
        and result["status"] == "valid"
        and result["isolated"] is True
        and result["backend"] == "bwrap"
    )

    solution = tmp_path / "solution.py"
    code, out, _ = _run(capsys, "grade", "wine-cultivar", str(solution), "--backend", "bwrap")
    assert code == 0
    for label in (
        "status:    valid",
        "score:",
        "position:",
        "medal:",
        "reward:",
        "resources:",
        "sandbox:   bwrap (isolated)",
    ):
        assert label in out


@pytest.mark.bwrap
def test_grade_timeout_through_the_cli(capsys, tmp_path):
    _, out, _ = _grade(
        capsys, tmp_path, "import time\ntime.sleep(60)\n", "--backend", "bwrap", "--time-limit", "2"
    )
    result = json.loads(out)
    assert (result["status"], result["reward"], result["time_limit_s"]) == ("timeout", 0.1, 2.0)


def test_grade_missing_solution_file(capsys, tmp_path):
    code, _, err = _run(capsys, "grade", "wine-cultivar", str(tmp_path / "nope.py"))
    assert code == 2 and "cannot read solution" in err


def test_console_script_is_installed(tmp_path):
    exe = shutil.which("wmrl") or str(Path(sys.executable).parent / "wmrl")
    solution = tmp_path / "broken.py"
    solution.write_text(BROKEN, encoding="utf-8")
    done = subprocess.run(
        [exe, "grade", "wine-cultivar", str(solution), "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "syntax_error"
