"""Runs of a stage without a corrector (a supervised warm start): its checkpoints count as complete
once they hold the stage marker, and its config base shares the resume rules of every run."""

from __future__ import annotations

import json

import pytest

from wmrl.core.config import ConfigError, load_config
from wmrl.core.pipeline import CORRECTOR_FILE
from wmrl.core.rundir import (
    STAGE_FILE,
    RunDirectory,
    RunDirError,
    latest_checkpoint,
    list_checkpoints,
    read_stage_marker,
    write_stage_marker,
)
from wmrl.core.train_config import LoggingConfig, SupervisedConfigBase


def test_a_stage_marker_makes_a_checkpoint_complete(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4, 6):
        (run / "checkpoints" / f"checkpoint-{step}").mkdir(parents=True)
    assert list_checkpoints(run, STAGE_FILE) == []  # no marker: incomplete, never resumed from
    marker = write_stage_marker(run / "checkpoints" / "checkpoint-4", stage="sft", step=4)
    assert marker.name == STAGE_FILE and json.loads(marker.read_text()) == {"stage": "sft", "step": 4}
    assert read_stage_marker(marker.parent) == {"stage": "sft", "step": 4}
    # each trainer names what completes its checkpoints: an RL checkpoint is not a stage's, nor the reverse
    (run / "checkpoints" / "checkpoint-2" / CORRECTOR_FILE).write_text("{}")
    assert [p.name for p in list_checkpoints(run, STAGE_FILE)] == ["checkpoint-4"]
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-2"]
    assert latest_checkpoint(run, STAGE_FILE).name == "checkpoint-4"
    (run / "metrics.jsonl").write_text("{}\n")
    assert RunDirectory(run, resume=True, marker=STAGE_FILE).checkpoint.name == "checkpoint-4"
    four = run / "checkpoints" / "checkpoint-4"
    assert RunDirectory(run, resume_from=four, marker=STAGE_FILE).checkpoint == four
    with pytest.raises(RunDirError, match=CORRECTOR_FILE):
        RunDirectory(run, resume_from=four)  # an RL trainer refuses a stage's checkpoint
    with pytest.raises(RunDirError, match=STAGE_FILE):
        RunDirectory(run, resume_from=run / "checkpoints" / "checkpoint-6", marker=STAGE_FILE)
    with pytest.raises(RunDirError, match="--resume"):
        RunDirectory(run, marker=STAGE_FILE)  # a run folder is never silently reused


def test_supervised_base_validates_and_resumes_by_the_shared_rules():
    config = SupervisedConfigBase()
    assert (config.epochs, config.batch_size) == (1, 4)
    for bad, message in (
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"logging": LoggingConfig(completions=True)}, "completions"),
    ):
        with pytest.raises(ConfigError, match=message):
            SupervisedConfigBase(**bad)
    saved = config.to_dict()
    SupervisedConfigBase(epochs=3).check_resume(saved)  # more epochs: the same run, continued
    load_config(SupervisedConfigBase, None, ["logging.progress=false"]).check_resume(saved)
    with pytest.raises(ConfigError, match="learning_rate"):
        SupervisedConfigBase(learning_rate=1e-2).check_resume(saved)
    assert not hasattr(config, "mode") and not hasattr(config, "corrector")  # nothing that would do nothing
