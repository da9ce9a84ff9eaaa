"""The embodied trainer on two processes (``torchrun``, gloo): rollouts and the update data-parallel.

Real everything, as in ``test_training_e2e.py`` (LIBERO-Long task 0 in MuJoCo, the tiny random
MiniVLA with LoRA, the tiny random Robometer), with two groups per step: on two ranks each rolls out
one group in its own simulator, grades its own episodes and trains on their samples with the
gradients summed over the ranks (``embodied_rank_worker.py``). The ranks end with identical
parameters, which are those one process reaches on the same config (``wmrl train embodied``), and
rank 0 writes one run directory that describes both ranks' episodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from wmrl.core.cli import main
from wmrl.core.pipeline import LEDGER_FILE
from wmrl.core.rundir import list_checkpoints

pytestmark = [pytest.mark.libero, pytest.mark.slow, pytest.mark.peft, pytest.mark.matplotlib]

WORKER = Path(__file__).with_name("embodied_rank_worker.py")
RANKS = 2
# A random policy never succeeds: calibrated to the anchors' zeros every advantage would be 0 and the
# update would not move the policy, so the calibration stays off and the world model's raw scores give
# the group that is not anchored non-zero advantages.
OVERRIDES = ["groups_per_step=2", "steps=2", "env.tasks=[0]", "corrector.debias.min_pairs=1000"]
ADAPTER = "policy/adapter/adapter_model.safetensors"


@pytest.fixture(scope="module", autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, unused_port):
    root = tmp_path_factory.mktemp("embodied-ranks")
    alone = root / "alone"
    assert main(["train", "embodied", "--smoke", "--out", str(alone), "--no-progress", *OVERRIDES]) == 0
    ranks = root / "ranks"
    ranks.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={RANKS}",
        "--master_addr=127.0.0.1",
        f"--master_port={unused_port()}",
        str(WORKER),
        str(ranks),
        *OVERRIDES,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads((ranks / f"rank{r}.json").read_text()) for r in range(RANKS)]
    params = [torch.load(ranks / f"rank{r}.pt", weights_only=True) for r in range(RANKS)]
    return alone, ranks, records, params


def _adapter(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(list_checkpoints(run)[-1] / ADAPTER))


def test_the_ranks_end_with_the_parameters_one_process_reaches(runs):
    alone, ranks, (zero, one), (p0, p1) = runs
    assert zero["world"] == one["world"] == RANKS
    assert len(p0) == len(p1) > 0
    assert all(torch.equal(a, b) for a, b in zip(p0, p1, strict=True))  # identical, bit for bit
    assert zero["corrector"] == one["corrector"]
    mine, single = _adapter(ranks / "run"), _adapter(alone)
    assert mine.keys() == single.keys()
    moved = 0.0
    for name, value in single.items():
        assert torch.allclose(mine[name], value, rtol=1e-4, atol=1e-6), name
        moved = max(moved, float((value - _initial(name, value)).abs().max()))
    assert moved > 0, "the update never moved the adapter: the comparison cannot see a difference"


def _initial(name: str, value: torch.Tensor) -> torch.Tensor:
    # LoRA's B matrices start at zero, its A matrices random: a trained B is what moved
    return torch.zeros_like(value) if "lora_B" in name else value


def test_each_rank_rolls_out_and_trains_its_own_group(runs):
    _, _, records, _ = runs
    for rank, record in enumerate(records):
        for step in record["steps"]:
            assert step["rows"] == [rank, rank + 1, 1]  # one group each
            assert step["episodes"] == 2 * 2  # the metrics describe the whole step
        assert [s["anchor"] for s in record["steps"]] == [s["anchor"] for s in records[0]["steps"]]
    keys = records[0]["steps"][0]["keys"]
    assert len(keys) == len(set(keys)) == 2


def test_rank_zero_writes_one_run_directory_of_both_ranks(runs):
    alone, ranks, (zero, _), _ = runs
    assert sorted(p.name for p in ranks.iterdir() if p.is_dir()) == ["run"]
    run = ranks / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    single = [json.loads(line) for line in (alone / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in single] == [0, 1]
    assert all(r["ppo/advantage_abs_mean"] > 0 for r in single)
    for mine, one in zip(rows, single, strict=True):
        for key in (
            "rollout/episodes",
            "rollout/episode_steps_mean",
            "ppo/samples",
            "ppo/episodes",
            "ppo/updates",
        ):
            assert mine[key] == one[key], key
        for key in (
            "wmrl/anchor_fraction_realised",
            "reward/world_model_mean",
            "ppo/advantage_abs_mean",
            "ppo/loss",
            "ppo/clip_fraction",
            "ppo/grad_norm",
        ):
            if one.get(key) is None:
                assert mine.get(key) is None, key
            else:
                assert mine[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    report = json.loads((run / "cost_report.json").read_text())
    assert report == zero["report"]
    assert report["processes"] == RANKS
    assert report["graded_rollouts"] == 2 * 2 * 2  # steps x groups x rollouts, both ranks
    assert report["spent"]["generation"]["items"] == 2 * 2 * 2
    assert report["spent"]["world_model"]["items"] == 2 * 2 * 2
    assert report["details"]["episodes"] == 2 * 2 * 2
    saved = json.loads((list_checkpoints(run)[-1] / LEDGER_FILE).read_text())["ranks"]
    assert [r["streams"]["generation"]["items"] for r in saved] == [2 * 2, 2 * 2]
    assert np.isclose(
        sum(r["streams"]["generation"]["wall_s"] for r in saved), report["spent"]["generation"]["wall_s"]
    )
