"""``wmrl train embodied --smoke`` on the real LIBERO simulator: the run directory, and a bit-identical resume.

Real everything: LIBERO-Long task 0 in MuJoCo (one 64 px camera), the tiny random MiniVLA with peft
LoRA, the tiny random Robometer, the core corrector. About a minute per smoke run on a 2-core CPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from wmrl.core.cli import main
from wmrl.core.corrector import METRICS
from wmrl.core.pipeline import CORRECTOR_FILE, LEDGER_FILE
from wmrl.core.rundir import checkpoint_step, list_checkpoints
from wmrl.embodied.training import load_train_config
from wmrl.embodied.training.trainer import train

pytestmark = [pytest.mark.libero, pytest.mark.slow, pytest.mark.peft, pytest.mark.matplotlib]

STEP_KEYS = (
    "rollout/success_rate",
    "reward/world_model_mean",
    "ppo/loss",
    "ppo/clip_fraction",
    "ppo/approx_kl",
    "ppo/kl_ref",
    "ppo/grad_norm",
    "time/step_s",
    "time/rollout_s",
    "time/scoring_s",
    "time/update_s",
)


@pytest.fixture(scope="module", autouse=True)
def _restore_threads():
    """The smoke preset sets torch to one thread for the process; give the next tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "smoke"
    assert main(["train", "embodied", "--smoke", "--out", str(out), "--no-progress"]) == 0
    return out


def test_smoke_run_writes_the_run_directory(smoke_run):
    config = load_train_config("smoke")
    assert load_train_config(smoke_run / "config.json") == config
    rows = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(config.steps))
    # the memory's metrics are written when the memory is on
    memory_keys = {k for k in METRICS if k.startswith("memory/")}
    expected = set(METRICS) if config.corrector.memory.enabled else set(METRICS) - memory_keys
    for row in rows:
        assert expected <= set(row)
        assert config.corrector.memory.enabled or not memory_keys & set(row)
        for key in STEP_KEYS:
            assert key in row, key
        assert row["rollout/episodes"] == config.group_size * config.groups_per_step
        assert (
            row["rollout/episode_steps_mean"] == config.env.max_episode_steps
        )  # a random policy never succeeds
        assert row["reward/world_model_mean"] is not None
        assert row["ppo/behaviour_logp_gap"] < 1e-3
    assert any(r["ppo/updates"] > 0 for r in rows)
    resolved = json.loads((smoke_run / "resolved.json").read_text())
    assert resolved["train_states"] == list(range(16)) and resolved["max_episode_steps"] == 12

    report = json.loads((smoke_run / "cost_report.json").read_text())
    episodes = config.steps * config.group_size
    assert report["spent"]["generation"]["items"] == episodes
    assert report["spent"]["world_model"]["items"] == episodes
    assert report["graded_rollouts"] == episodes
    details = report["details"]
    assert details["policy_steps"] == episodes * config.env.max_episode_steps
    assert details["mean_step_seconds"]["rollout_s"] > 0 and "success flag" in details["accounting"]

    for name in ("training.png", "weights.png", "reward.png"):
        assert (smoke_run / "plots" / name).stat().st_size > 0
    final = list_checkpoints(smoke_run)[-1]
    assert checkpoint_step(final) == config.steps
    for name in (
        CORRECTOR_FILE,
        LEDGER_FILE,
        "optimizer.pt",
        "rng.pt",
        "wmrl_trainer.json",
        "policy/policy.json",
    ):
        assert (final / name).is_file(), name
    assert (final / "policy" / "adapter" / "adapter_model.safetensors").is_file()


def test_resumed_smoke_run_matches_the_uninterrupted_one(smoke_run, tmp_path):
    config = load_train_config("smoke")
    out = tmp_path / "interrupted"
    train(config.replace(steps=config.steps - 1), out, progress=False)
    train(config, out, resume=True, progress=False)
    a = list_checkpoints(smoke_run)[-1]
    b = list_checkpoints(out)[-1]
    assert checkpoint_step(a) == checkpoint_step(b) == config.steps
    assert (a / CORRECTOR_FILE).read_bytes() == (b / CORRECTOR_FILE).read_bytes()
    adapter = "policy/adapter/adapter_model.safetensors"
    assert (a / adapter).read_bytes() == (b / adapter).read_bytes()
    rows_a = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_b] == [r["step"] for r in rows_a]
    for ra, rb in zip(rows_a, rows_b, strict=True):
        for key in ra:
            if key.startswith(("wmrl/", "reward/", "ppo/")):
                assert ra[key] == rb[key], (ra["step"], key)
