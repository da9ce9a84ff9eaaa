"""The anchor pairs a run collects (every executed script with its real outcome) are recorded as
world-model examples, and a world model is fine-tuned on them with the warm-start stage
(``corpus.anchor_runs``) without executing anything again; pairs of tasks outside the stage's
training tasks are refused."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.bwrap]

_VALID = """import os
import pandas as pd
t = pd.read_csv(os.environ["DATA_DIR"] + "/test.csv")
t["y"] = 0.5
t[["id", "y"]].to_csv(os.environ["SUBMISSION_PATH"], index=False)
"""
_CRASH = """import os
import pandas as pd
t = pd.read_csv(os.environ["DATA_DIR"] + "/test.csv")
print(t["y"].mean())
"""


def _record(tmp_path):
    from wmrl.autoresearch.grading import ExecutionGrader, ExecutionRewardSource
    from wmrl.autoresearch.tasks import Solution
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.training.anchor_pairs import AnchorPairRecorder

    make_toy_task(tmp_path / "tasks", "toy-regression", time_limit_s=30)
    ref = str(tmp_path / "tasks" / "toy-regression")
    run = tmp_path / "run"
    run.mkdir()
    source = ExecutionRewardSource(ExecutionGrader(backend="bwrap"), max_workers=2)
    source.record = AnchorPairRecorder(run / "anchor_pairs.jsonl", step=lambda: 3)
    grades = source.grade([Solution(ref, _VALID), Solution(ref, _CRASH)])
    return ref, run, grades


def test_every_executed_anchor_is_recorded_with_its_real_outcome(tmp_path):
    from wmrl.autoresearch.training.anchor_pairs import read_anchor_pairs

    ref, run, grades = _record(tmp_path)
    assert [g.status for g in grades] == ["valid", "runtime_error"]
    pairs = read_anchor_pairs([run])
    assert [(p.role, p.task_id, p.task_ref, p.recipe) for p in pairs] == [
        ("world_model", "toy-regression", ref, "anchor@step3")
    ] * 2
    valid, crash = (json.loads(p.completion) for p in pairs)
    # the world model's answer is the real outcome: status, error type, position on its 0.1 grid
    assert valid["status"] == "valid" and valid["position"] == round(grades[0].info["position"], 1)
    assert crash == {
        "status": "runtime_error",
        "error_type": "KeyError",
        "error_line": None,
        "position": None,
        "output": "",
    }
    assert [p.code for p in pairs] == [_VALID, _CRASH]
    assert pairs[0].reward == grades[0].value and pairs[1].reward == grades[1].value
    with pytest.raises(FileNotFoundError, match="anchor_pairs"):
        read_anchor_pairs([tmp_path])


def test_repeated_pairs_count_once_but_a_flaky_scripts_two_outcomes_both_count():
    from wmrl.autoresearch.training.anchor_pairs import unique_pairs
    from wmrl.autoresearch.training.corpus import CorpusExample

    def pair(task, code, status, recipe="anchor@step1"):
        answer = json.dumps({"status": status})
        return CorpusExample("world_model", task, task, recipe, answer, code, status, None, 0.1)

    pairs = [
        pair("a", "x = 1", "valid"),
        pair("a", "x = 1", "valid", recipe="anchor@step2"),  # the same script again, later
        pair("b", "x = 1", "valid"),  # the same script on another task is another pair
        pair("a", "x = 1", "runtime_error"),  # flaky: what it also did
        pair("a", "y = 2", "valid"),
    ]
    kept, dropped = unique_pairs(pairs)
    assert dropped == 1
    assert kept == [pairs[0], pairs[2], pairs[3], pairs[4]]
    assert unique_pairs([]) == ([], 0)


@pytest.mark.trl
@pytest.mark.peft
def test_a_world_model_is_fine_tuned_on_a_runs_anchor_pairs(tmp_path):
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.training.config import ModelSection
    from wmrl.autoresearch.training.sft import CorpusSection, WarmStartConfig, run_sft
    from wmrl.core.errors import UserError
    from wmrl.core.train_config import LoggingConfig

    ref, run, _ = _record(tmp_path)
    model = save_tiny_model(tmp_path / "tiny")

    def config(ids):
        return WarmStartConfig(
            epochs=8,
            batch_size=2,
            learning_rate=1e-2,
            model=ModelSection(path=str(model)),
            corpus=CorpusSection(
                # the run twice, as a rerun of the same seed would record it: its pairs count once
                ids=ids,
                anchor_runs=(str(run), str(run)),
                overview_tokens=1500,
                world_model_overview_tokens=1500,
            ),
            max_length=4096,
            logging=LoggingConfig(report_to=(), progress=False, plots=False),
        )

    result = run_sft(config((ref,)), tmp_path / "wm", log=lambda *_: None)
    report = json.loads((tmp_path / "wm" / "corpus_report.json").read_text())
    assert report["world_model_examples"] == 2 and report["agent_examples"] == 0
    assert report["duplicate_pairs_dropped"] == 2
    assert report["executions"] == 0  # nothing ran again: the pairs were already graded
    assert result.loss_last < result.loss_first
    assert (result.final_model / "config.json").is_file()
    # the pairs' task must be a training task of the stage
    other = tmp_path / "other"
    from wmrl.autoresearch.tasks.toy import make_toy_task

    make_toy_task(other, "toy-binary", kind="binary")
    with pytest.raises(UserError, match="not training tasks of this stage"):
        run_sft(config((str(other / "toy-binary"),)), tmp_path / "wm2", log=lambda *_: None)
