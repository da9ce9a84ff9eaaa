"""``wmrl train autoresearch`` writes the whole run directory, and ``--resume`` continues it."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.trl, pytest.mark.bwrap, pytest.mark.peft, pytest.mark.matplotlib]


def test_train_writes_the_run_directory_and_resumes(tmp_path, capsys):
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.autoresearch.training.trainer import CORRECTOR_FILE, LEDGER_FILE
    from wmrl.core.cli import main
    from wmrl.core.config import from_dict
    from wmrl.core.corrector import METRICS, Corrector

    model = save_tiny_model(tmp_path / "tiny")
    make_toy_task(tmp_path, "toy-regression")
    make_toy_task(tmp_path, "toy-binary", kind="binary")
    ids = json.dumps([str(tmp_path / "toy-regression"), str(tmp_path / "toy-binary")])
    run = tmp_path / "run"
    args = [
        f"model.path={model}",
        f"tasks.ids={ids}",
        "tasks.overview_tokens=1500",  # the tiny tokenizer spends ~3x SmolLM2's tokens on the same text
        "world_model.overview_tokens=1500",
        "grpo.group_size=2",
        "grpo.max_completion_tokens=12",
        "grpo.save_steps=1",
        "logging.progress=false",
    ]
    assert main(["train", "autoresearch", "--out", str(run), *args, "grpo.steps=2"]) == 0
    printed = capsys.readouterr().out
    assert "run directory" in printed and "wmrl eval autoresearch --model" in printed

    config = from_dict(TrainConfig, json.loads((run / "config.json").read_text()))
    assert config.grpo.steps == 2 and config.model.path == str(model)
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
    assert main(["train", "autoresearch", "--out", str(run), *args, "grpo.steps=2"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "autoresearch", "--out", str(run), "--resume", *args, "grpo.steps=3"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["wmrl/step"] for r in rows if "wmrl/step" in r] == [1.0, 2.0, 3.0]
    assert Corrector.load(run / "checkpoints" / "checkpoint-3" / CORRECTOR_FILE).step_count == 3
