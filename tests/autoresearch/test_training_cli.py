"""``wmrl train autoresearch`` writes the whole run directory, and ``--resume`` continues it."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.trl, pytest.mark.bwrap, pytest.mark.peft, pytest.mark.matplotlib]


def test_train_writes_the_run_directory_and_resumes(tmp_path, capsys, tiny_autoresearch):
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.cli import main
    from wmrl.core.config import from_dict
    from wmrl.core.corrector import METRICS, Corrector
    from wmrl.core.pipeline import CORRECTOR_FILE, LEDGER_FILE

    model = tmp_path / "tiny"
    run = tmp_path / "run"
    args = [*tiny_autoresearch, "checkpoint.every=1", "logging.progress=false"]
    assert main(["train", "autoresearch", "--out", str(run), *args, "steps=2"]) == 0
    printed = capsys.readouterr().out
    assert "run directory" in printed and "wmrl eval autoresearch --model" in printed
    # the share of rollouts executed, as the ledger counted them (not the share of whole groups, 0 here)
    summary = json.loads((run / "run_summary.json").read_text())
    executed = json.loads((run / "cost_report.json").read_text())["spent"]["anchor"]["items"]
    assert summary["execution_share_realised"] == pytest.approx(executed / 8)
    assert f"executed for real: {executed / 8:.1%} of the rollouts" in printed

    config = from_dict(TrainConfig, json.loads((run / "config.json").read_text()))
    assert config.steps == 2 and config.model.path == str(model)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "wmrl/step" in r]
    assert [r["wmrl/step"] for r in steps] == [1.0, 2.0]
    assert {k for r in steps for k in r if k.startswith("wmrl/")} <= set(METRICS)
    assert all("reward" in r and "cost/generation_s" in r for r in steps)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "plots" / "calibration.png").stat().st_size > 0
    report = json.loads((run / "cost_report.json").read_text())
    assert set(report["spent"]) >= {"generation", "world_model", "anchor", "update"}
    assert report["spent"]["update"]["wall_s"] > 0 and report["graded_rollouts"] == 8
    assert all(v["accel_s"] == 0 for v in report["spent"].values())  # CPU: no accelerator-seconds
    assert "real_mode_estimate" in report and report["mode"] == "wmrl"
    for step in (1, 2):
        folder = run / "checkpoints" / f"checkpoint-{step}"
        assert (folder / CORRECTOR_FILE).is_file() and (folder / LEDGER_FILE).is_file()
        assert Corrector.load(folder / CORRECTOR_FILE).step_count == step
    final = run / "final"
    assert (final / "adapter_config.json").is_file() and (final / CORRECTOR_FILE).is_file()
    assert json.loads((final / "wmrl_policy.json").read_text())["base"] == str(model)

    # the same --out again refuses to overwrite; --resume continues from the last checkpoint
    assert main(["train", "autoresearch", "--out", str(run), *args, "steps=2"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "autoresearch", "--out", str(run), "--resume", *args, "steps=3"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["wmrl/step"] for r in rows if "wmrl/step" in r] == [1.0, 2.0, 3.0]
    assert Corrector.load(run / "checkpoints" / "checkpoint-3" / CORRECTOR_FILE).step_count == 3


def test_the_completions_table_puts_both_streams_side_by_side(tmp_path, capsys, tiny_autoresearch):
    from wmrl.core.cli import main

    run = tmp_path / "run"
    args = [
        *tiny_autoresearch,
        "logging.progress=false",
        "steps=2",
        "logging.completions=true",
        "logging.completions_to_print=2",
    ]
    assert main(["train", "autoresearch", "--out", str(run), *args]) == 0
    printed = capsys.readouterr().out
    assert "wm_calibrated" in printed and "completion" in printed  # a sample is printed each step
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2  # steps x groups x rollouts
    for row in rows:
        assert {
            "prompt",
            "completion",
            "wm",
            "wm_calibrated",
            "real",
            "reward",
            "advantage",
            "status",
        } <= set(row)
        assert (isinstance(row["completion"], str) and "Write" in row["prompt"]) or row["prompt"]
        if row["stream"] == "anchor":
            assert row["reward"] == row["real"]
        else:
            assert row["real"] is None and row["reward"] == row["wm_calibrated"]


def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path, tiny_autoresearch):
    """A real SIGINT during a TRL run: the step finishes, a checkpoint is written, exit code 130."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, signal, sys
        from wmrl.core.engines.trl import trainer as engine

        original = engine.WMRLGRPOTrainer._generate_and_score_completions
        def interrupt_in_step_one(self, inputs):
            if self.state.global_step == 0:
                os.kill(os.getpid(), signal.SIGINT)
            return original(self, inputs)
        engine.WMRLGRPOTrainer._generate_and_score_completions = interrupt_in_step_one
        from wmrl.core.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "train",
            "autoresearch",
            "--out",
            str(run),
            *tiny_autoresearch,
            "steps=4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 130, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "stopped after step 1" in last and "--resume" in last and "Traceback" not in done.stderr
    assert (run / "checkpoints" / "checkpoint-1" / "wmrl_corrector.json").is_file()
    assert not (run / "final").exists()
    # the stopped attempt's wall time is kept; the resumed run's summary counts both attempts
    from wmrl.core.cli import main
    from wmrl.core.rundir import WALL_FILE

    (first,) = json.loads((run / WALL_FILE).read_text())["attempts_s"]
    assert first > 0
    assert main(["train", "autoresearch", "--out", str(run), "--resume", *tiny_autoresearch, "steps=4"]) == 0
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["wall_s_total"] == pytest.approx(first + summary["wall_s"])


def test_an_unwritable_out_is_one_line_and_leaves_nothing(tmp_path, capsys, tiny_autoresearch):
    from wmrl.core.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    args = tiny_autoresearch
    capsys.readouterr()  # the set-up's own output
    assert main(["train", "autoresearch", "--out", str(blocker / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and len(err.strip().splitlines()) == 1


def test_a_run_restarted_from_step_zero_drops_the_stopped_attempts_anchor_pairs(tmp_path, tiny_autoresearch):
    """Without a checkpoint the run starts over (its metrics too): pairs a stopped attempt recorded
    are not this run's, and would otherwise feed a world-model tuning on its pairs."""
    from wmrl.core.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.0}) + "\n")  # never checkpointed
    stale = json.dumps({"step": 1, "task_id": "toy-regression", "code": "# stale attempt"})
    (run / "anchor_pairs.jsonl").write_text(stale + "\n")
    assert main(["train", "autoresearch", "--out", str(run), "--resume", *tiny_autoresearch, "steps=1"]) == 0
    pairs = run / "anchor_pairs.jsonl"
    assert not pairs.exists() or "# stale attempt" not in pairs.read_text()
    assert (run / "run_summary.json").is_file()
