"""The loop trainer on a toy domain: run layout, exact resume, Ctrl-C, nothing left by a run that did nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from wmrl.core import Group, RewardPipeline, as_source
from wmrl.core.config import ConfigError
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.errors import Interrupted
from wmrl.core.loop import LoopTrainer
from wmrl.core.pipeline import CORRECTOR_FILE, LEDGER_FILE
from wmrl.core.rundir import RunDirectory, RunDirError, checkpoint_step, list_checkpoints
from wmrl.core.train_config import CheckpointConfig, LoggingConfig, TrainConfigBase

pytestmark = [pytest.mark.matplotlib]


@dataclass(frozen=True)
class ToyConfig(TrainConfigBase):
    """A bandit over 6 arms per task.

    Attributes:
        arms: arms per task.
    """

    steps: int = 4
    group_size: int = 4
    learning_rate: float = 0.5
    logging: LoggingConfig = field(
        default_factory=lambda: LoggingConfig(report_to=(), completions=True, completions_to_print=0)
    )
    corrector: CorrectorConfig = field(
        default_factory=lambda: CorrectorConfig(debias=DebiasConfig(min_pairs=4))
    )
    arms: int = 6


TRUE = np.linspace(0.0, 1.0, 6)


class ToyDomain:
    def __init__(self, config: ToyConfig, fail_at: int | None = None, stop_after: int | None = None) -> None:
        self.config = config
        self.logits = torch.zeros(2, config.arms, requires_grad=True)
        self.opt = torch.optim.Adam([self.logits], lr=config.learning_rate)
        self.fail_at, self.stop_after = fail_at, stop_after

    def groups(self, step):
        if self.fail_at is not None and step == self.fail_at:
            raise RuntimeError("the simulator crashed")
        return [0, 1]

    def rollout(self, groups, step):
        gen = torch.Generator().manual_seed(step)
        out = []
        for task in groups:
            picks = torch.multinomial(
                torch.softmax(self.logits[task].detach(), 0), self.config.group_size, True, generator=gen
            )
            out.append(Group(key=f"{step}:{task}", items=[(task, int(a)) for a in picks], task=f"t{task}"))
        return out

    def update(self, batch, result, step):
        adv = torch.as_tensor(np.nan_to_num(result.advantages), dtype=torch.float32)
        logp = torch.stack(
            [torch.stack([torch.log_softmax(self.logits[t], 0)[a] for t, a in g.items]) for g in batch]
        )
        loss = -(adv * logp).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if self.stop_after is not None and step + 1 == self.stop_after:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of training
        return {"toy/loss": float(loss.detach())}

    def metrics(self, batch, result):
        return {"toy/arm_mean": float(np.mean([a for g in batch for _, a in g.items]))}

    def completion_columns(self, batch):
        return {"arm": [a for g in batch for _, a in g.items]}

    def save(self, folder: Path):
        torch.save({"logits": self.logits.detach(), "opt": self.opt.state_dict()}, folder / "toy.pt")

    def load(self, folder: Path):
        state = torch.load(folder / "toy.pt", weights_only=True)
        with torch.no_grad():
            self.logits.copy_(state["logits"])
        self.opt.load_state_dict(state["opt"])


def _sources():
    wm = as_source(lambda items: [float(TRUE[a] ** 2) for _, a in items], "world_model", "wm")
    real = as_source(lambda items: [float(TRUE[a]) for _, a in items], "anchor", "real")
    return wm, real


def _trainer(config, out, resume=False, **domain):
    pipe = RewardPipeline(*_sources(), mode=config.mode, corrector=config.corrector)
    return LoopTrainer(
        ToyDomain(config, **domain), pipe, config, RunDirectory(out, resume=resume), progress=False
    )


def test_a_run_writes_the_shared_layout(tmp_path):
    config = ToyConfig()
    trainer = _trainer(config, tmp_path / "run")
    report = trainer.run()
    trainer.close()
    run = tmp_path / "run"
    assert [checkpoint_step(c) for c in list_checkpoints(run)] == [4]  # checkpoint.every null: the final one
    ckpt = list_checkpoints(run)[-1]
    for name in (CORRECTOR_FILE, LEDGER_FILE, "wmrl_trainer.json", "toy.pt"):
        assert (ckpt / name).is_file()
    assert json.loads((run / "config.json").read_text()) == config.to_dict()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(
        "toy/loss" in r and "wmrl/step" in r for r in rows
    )
    table = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert len(table) == 4 * 2 * 4 and {"wm", "wm_calibrated", "real", "reward", "advantage", "arm"} <= set(
        table[0]
    )
    anchor_rows = [r for r in table if r["stream"] == "anchor"]
    assert anchor_rows and all(r["real"] == TRUE[r["arm"]] for r in anchor_rows)
    assert report["steps"] == 4 and report["graded_rollouts"] == 32
    assert json.loads((run / "cost_report.json").read_text()) == json.loads(json.dumps(report))


def test_resume_is_bit_identical_and_refuses_other_settings(tmp_path):
    config = ToyConfig(checkpoint=CheckpointConfig(every=1, keep=None))
    whole = _trainer(config, tmp_path / "a")
    whole.run()
    whole.close()
    short = _trainer(ToyConfig(steps=2, checkpoint=config.checkpoint), tmp_path / "b")
    short.run()
    short.close()
    with pytest.raises(RunDirError, match="--resume"):
        _trainer(config, tmp_path / "b")
    with pytest.raises(ConfigError, match=r"\['learning_rate'\]"):
        _trainer(ToyConfig(learning_rate=0.1, checkpoint=config.checkpoint), tmp_path / "b", resume=True)
    resumed = _trainer(config, tmp_path / "b", resume=True)
    assert resumed.step == 2
    resumed.run()
    resumed.close()
    for name in (CORRECTOR_FILE, "toy.pt"):
        a = (tmp_path / "a/checkpoints/checkpoint-4" / name).read_bytes()
        b = (tmp_path / "b/checkpoints/checkpoint-4" / name).read_bytes()
        assert a == b, name
    read = lambda p: [json.loads(line) for line in (p / "completions.jsonl").read_text().splitlines()]  # noqa: E731
    assert read(tmp_path / "a") == read(tmp_path / "b")


def test_a_run_that_fails_before_its_first_step_leaves_nothing(tmp_path):
    trainer = _trainer(ToyConfig(), tmp_path / "run", fail_at=0)
    with pytest.raises(RuntimeError, match="crashed"):
        trainer.run()
    assert not (tmp_path / "run").exists()
    # a failure later keeps the run, which --resume continues
    trainer = _trainer(ToyConfig(checkpoint=CheckpointConfig(every=1)), tmp_path / "later", fail_at=2)
    with pytest.raises(RuntimeError):
        trainer.run()
    assert [checkpoint_step(c) for c in list_checkpoints(tmp_path / "later")] == [1, 2]
    assert (
        _trainer(ToyConfig(checkpoint=CheckpointConfig(every=1)), tmp_path / "later", resume=True).step == 2
    )


def test_a_run_that_died_without_a_checkpoint_restarts_with_resume(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(RunDirError, match="never wrote a checkpoint"):
        RunDirectory(tmp_path / "run")
    trainer = _trainer(ToyConfig(steps=1), tmp_path / "run", resume=True)
    assert trainer.step == 0 and not (tmp_path / "run" / "metrics.jsonl").read_text()
    trainer.run()


def test_ctrl_c_finishes_the_step_checkpoints_and_stops(tmp_path):
    trainer = _trainer(ToyConfig(), tmp_path / "run", stop_after=2)
    with pytest.raises(Interrupted, match="stopped after step 2; checkpoint saved"):
        trainer.run()
    trainer.close()
    assert [checkpoint_step(c) for c in list_checkpoints(tmp_path / "run")] == [2]
    again = _trainer(ToyConfig(), tmp_path / "run", resume=True)
    assert again.step == 2
    again.run()


def test_a_trainer_without_a_correction_names_its_own_checkpoint_marker(tmp_path):
    # e.g. supervised fine-tuning: its checkpoints hold no wmrl_corrector.json
    run = tmp_path / "sft"
    done = run / "checkpoints" / "checkpoint-4"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "checkpoint-6").mkdir()  # no marker: an incomplete checkpoint
    (run / "metrics.jsonl").write_text("")
    assert list_checkpoints(run) == []  # not a correction checkpoint
    assert list_checkpoints(run, marker="trainer_state.json") == [done]
    resumed = RunDirectory(run, resume=True, marker="trainer_state.json")
    assert resumed.checkpoint == done and not resumed.restarted
    with pytest.raises(RunDirError, match="continue it with --resume"):
        RunDirectory(run, marker="trainer_state.json")
    with pytest.raises(RunDirError, match=r"has no trainer_state\.json"):
        RunDirectory(run, resume_from=run / "checkpoints" / "checkpoint-6", marker="trainer_state.json")
    assert RunDirectory(run, resume_from=done, marker="trainer_state.json").checkpoint == done


def test_resume_never_silently_discards_a_run_whose_checkpoints_are_unusable(tmp_path):
    run = tmp_path / "run"
    broken = run / "checkpoints" / "checkpoint-3"
    broken.mkdir(parents=True)  # its wmrl_corrector.json was deleted (or never finished writing)
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    with pytest.raises(RunDirError, match=r"no complete checkpoint \(checkpoint-3 lack"):
        RunDirectory(run, resume=True)
    # a run that never wrote a checkpoint restarts, and says so in one line
    shutil.rmtree(run / "checkpoints")
    restarted = RunDirectory(run, resume=True)
    assert restarted.restarted and "restarting it from step 0" in restarted.notice
    assert RunDirectory(tmp_path / "new", resume=True).notice.endswith("starting one")


def test_the_python_api_takes_a_run_folder_as_a_path(tmp_path):
    config = ToyConfig(steps=1)
    pipe = RewardPipeline(*_sources(), mode=config.mode, corrector=config.corrector)
    trainer = LoopTrainer(ToyDomain(config), pipe, config, str(tmp_path / "run"), progress=False)
    trainer.run()
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    with pytest.raises(RunDirError, match="already holds a run"):
        LoopTrainer(ToyDomain(config), pipe, config, tmp_path / "run", progress=False)


def test_resume_refuses_a_checkpoint_missing_its_ledger_or_its_policy(tmp_path, capsys):
    from wmrl.core.errors import UserError
    from wmrl.core.pipeline import LEDGER_FILE

    run = tmp_path / "run"
    trainer = _trainer(ToyConfig(steps=2), run)
    trainer.run()
    trainer.close()
    checkpoint = list_checkpoints(run)[-1]
    # finished: resuming says so in one line instead of silently doing nothing
    again = _trainer(ToyConfig(steps=2), run, resume=True)
    again.run()
    again.close()
    assert "already completed its 2 steps" in capsys.readouterr().err
    # the ledger deleted: the cost report would book only the steps after the checkpoint
    (checkpoint / LEDGER_FILE).rename(tmp_path / "ledger.json")
    with pytest.raises(UserError, match=r"incomplete: .*wmrl_ledger\.json is missing"):
        _trainer(ToyConfig(steps=3), run, resume=True)
    (tmp_path / "ledger.json").rename(checkpoint / LEDGER_FILE)
    # the policy's own file deleted: a clear line, not a raw [Errno 2]
    (checkpoint / "toy.pt").unlink()
    with pytest.raises(UserError, match=r"incomplete: .*toy\.pt is missing"):
        _trainer(ToyConfig(steps=3), run, resume=True)
