"""A run's wall time across attempts: each stopped attempt adds its seconds; a run continued from a
checkpoint counts them; a run that starts from step 0 (new, or restarted without a checkpoint)
starts from none."""

from __future__ import annotations

import json
import shutil

import pytest

from wmrl.core.pipeline import CORRECTOR_FILE
from wmrl.core.rundir import WALL_FILE, RunDirectory, add_attempt_wall, earlier_wall_s


def test_attempts_add_up_and_a_run_from_step_zero_forgets_them(tmp_path):
    run = tmp_path / "run"
    add_attempt_wall(run, 5.0)  # no folder (abandoned before its first step): nothing written
    assert not run.exists() and earlier_wall_s(run) == 0.0
    run.mkdir()
    add_attempt_wall(run, 5.0)
    add_attempt_wall(run, 2.5)
    assert earlier_wall_s(run) == pytest.approx(7.5)
    assert json.loads((run / WALL_FILE).read_text()) == {"attempts_s": [5.0, 2.5]}
    # continued from a checkpoint: the attempts it continues are kept
    checkpoint = run / "checkpoints" / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    (checkpoint / CORRECTOR_FILE).write_text("{}")
    resumed = RunDirectory(run, resume=True)
    resumed.open()
    assert resumed.checkpoint == checkpoint and earlier_wall_s(run) == pytest.approx(7.5)
    # restarted without a checkpoint: it starts over, and so does its wall time
    shutil.rmtree(run / "checkpoints")  # (an unusable checkpoint folder is refused: test_loop.py)
    (run / "metrics.jsonl").write_text("")
    restarted = RunDirectory(run, resume=True)
    restarted.open()
    assert restarted.restarted and earlier_wall_s(run) == 0.0
