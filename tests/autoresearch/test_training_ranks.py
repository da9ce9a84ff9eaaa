"""WMRLGRPOTrainer on two processes: the corrector runs identically on every rank.

Two CPU ranks (``torchrun``, gloo; the same code path as two GPUs under ``accelerate launch``, minus
NCCL) train three GRPO steps with the closed-form sources of ``test_training_trainer.py``. Each rank
writes what it saw (``grpo_rank_worker.py``); the test checks that both ranks planned, gathered and
corrected the same batch, that each trained on its own slice of the corrector's advantages, that
each executed only its own anchor rollouts, and that the logs and the cost ledger describe the whole
batch, not rank 0's half.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.trl]

WORKER = Path(__file__).with_name("grpo_rank_worker.py")
RANKS = 2
GROUP = 2  # rollouts per group
LOCAL_ROWS = 4  # per rank and step: 2 prompts x 2 rollouts


def _torchrun(port: int, *program: str, cwd=None) -> subprocess.CompletedProcess:
    """Run ``program`` (a script, or ``-m module``, and its arguments) on RANKS local CPU processes."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={RANKS}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        *program,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, unused_port):
    out = tmp_path_factory.mktemp("ranks")
    _torchrun(unused_port(), str(WORKER), str(out))
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


def _matrix(values) -> np.ndarray:
    m = np.asarray(values, dtype=float)
    return np.where(m == -99.0, np.nan, m)


def test_every_rank_corrects_the_same_gathered_batch(ranks):
    from wmrl.core.config import from_dict
    from wmrl.core.corrector import Corrector, CorrectorConfig

    _, (zero, one) = ranks
    assert zero["processes"] == one["processes"] == RANKS
    assert "MULTI_CPU" in zero["distributed_type"]
    assert len(zero["steps"]) == 3
    assert zero["steps"] == one["steps"]
    assert zero["corrector_state"] == one["corrector_state"]
    for step in zero["steps"]:
        assert len(step["keys"]) == RANKS * LOCAL_ROWS // GROUP  # the whole batch, not a rank's half
        assert sum(step["anchor"]) == 1  # the floor: one anchor group per step
    # a single process replaying the gathered batches gets the same corrections, bit for bit
    replay = Corrector(from_dict(CorrectorConfig, zero["corrector_config"]))
    for step in zero["steps"]:
        plan = replay.plan(step["keys"], step["tasks"] or None)
        assert plan.anchor.tolist() == step["anchor"]
        again = replay.correct(plan, _matrix(step["wm"]), _matrix(step["real"]))
        assert np.array_equal(again.advantages, _matrix(step["advantages"]), equal_nan=True)


def test_each_rank_trains_on_and_grades_its_own_slice(ranks):
    _, records = ranks
    anchor_rows = 0
    for rank, record in enumerate(records):
        executed = 0
        for step, used in zip(record["steps"], record["used_advantages"], strict=True):
            flat = np.nan_to_num(_matrix(step["advantages"]).ravel(), nan=0.0)
            own = slice(rank * LOCAL_ROWS, (rank + 1) * LOCAL_ROWS)
            assert np.allclose(used, flat[own], atol=1e-6)
            executed += int(np.repeat(step["anchor"], GROUP)[own].sum())
        # the sandbox ran exactly this rank's anchor rollouts; the world model exactly its rows
        assert len(record["anchor_items"]) == executed
        assert len(record["wm_items"]) == LOCAL_ROWS * len(record["steps"])
        anchor_rows += executed
    assert anchor_rows == 3 * GROUP  # every anchor rollout executed once, by one rank
    assert all(records[r]["anchor_items"] for r in range(RANKS)), (
        "one rank executed nothing; the test cannot see the split"
    )


def test_logs_and_costs_describe_every_rank(ranks):
    from wmrl.core.corrector import Corrector
    from wmrl.core.pipeline import CORRECTOR_FILE, LEDGER_FILE

    out, (zero, one) = ranks
    statuses = {0: "valid", 1: "runtime_error"}  # grpo_rank_worker labels executions by rank
    logged = [h for h in zero["log_history"] if "wmrl/step" in h]
    for index, step in enumerate(zero["steps"]):
        counts = {}
        for rank in range(RANKS):
            own = np.repeat(step["anchor"], GROUP)[rank * LOCAL_ROWS : (rank + 1) * LOCAL_ROWS]
            counts[statuses[rank]] = int(own.sum())
        total = sum(counts.values())
        for status, n in counts.items():
            assert logged[index][f"anchor_status/{status}"] == pytest.approx(n / total)
        assert logged[index]["cost/anchor_s"] > 0
    # the ledger: each rank's own half, merged into the run's total on every rank
    assert zero["ledger"] == one["ledger"]
    merged = zero["ledger"]
    assert merged["graded_rollouts"] == 3 * RANKS * LOCAL_ROWS
    assert merged["spent"]["anchor"]["items"] == 3 * GROUP
    own_items = [r["own_ledger"]["spent"]["anchor"]["items"] for r in (zero, one)]
    assert sum(own_items) == 3 * GROUP and all(own_items)
    # the checkpoint holds the corrector once and each rank's ledger apart
    checkpoint = out / "train" / "out" / "checkpoint-3"
    assert json.dumps(Corrector.load(checkpoint / CORRECTOR_FILE).state_dict(), default=str) == json.dumps(
        zero["corrector_state"]
    )
    saved = json.loads((checkpoint / LEDGER_FILE).read_text())
    assert len(saved["ranks"]) == RANKS
    assert [r["streams"]["anchor"]["items"] for r in saved["ranks"]] == own_items


def _failure_run(tmp_path, port: int, lag: int, failing_rank: int, turns: int = 1) -> tuple[int, list[dict]]:
    """``grpo_rank_failure_worker.py`` on two ranks; the launcher's monitor is slowed to 60 s so that it
    cannot be what stops a rank."""
    worker = Path(__file__).with_name("grpo_rank_failure_worker.py")
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={RANKS}", "--master_addr=127.0.0.1",
        f"--master_port={port}", "--monitor-interval=60", str(worker), str(tmp_path), str(lag), str(failing_rank), str(turns),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    missing = [r for r in range(RANKS) if not (tmp_path / f"rank{r}.json").is_file()]
    assert not missing, f"ranks {missing} recorded nothing: {done.stderr[-3000:]}"
    return done.returncode, [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.mark.parametrize("lag", [0, 1], ids=["synchronous", "asynchronous"])
def test_an_execution_that_raises_on_one_rank_stops_every_rank(tmp_path, unused_port, lag):
    """Rank 1's anchor source raises (in the scoring, or in the worker thread of asynchronous anchors):
    rank 1 ends with its error and rank 0 with PeerRankFailed naming it, in the same step, instead of
    waiting in the next collective until the process group times out."""
    returncode, (zero, one) = _failure_run(tmp_path, unused_port(), lag, failing_rank=1)
    assert returncode != 0
    assert one["ended"] == "OSError" and "injected" in one["message"]
    assert zero["ended"] == "PeerRankFailed", zero
    assert zero["message"].startswith("an anchor execution failed on another rank")
    assert "rank 1: OSError: sandbox daemon went away (injected)" in zero["message"]
    # synchronous: the first step's own executions; asynchronous: they raise when they land a step later
    assert zero["step"] == one["step"] == lag


def test_an_execution_that_raises_between_two_turns_on_one_rank_stops_every_rank(tmp_path, unused_port):
    """K-turn episodes execute inside the rollout, between turns: rank 1's failure there stops rank 0
    too, in the same step, instead of leaving it in the next turn's collective."""
    returncode, (zero, one) = _failure_run(tmp_path, unused_port(), 0, failing_rank=1, turns=2)
    assert returncode != 0
    assert one["ended"] == "OSError" and "injected" in one["message"]
    assert zero["ended"] == "PeerRankFailed", zero
    assert zero["message"].startswith(
        "a turn's grading (world model or anchor execution) failed on another rank"
    )
    assert zero["step"] == one["step"] == 0


@pytest.mark.parametrize("lag", [1, 2])
def test_asynchronous_anchors_train_late_rows_on_two_ranks(tmp_path, unused_port, lag):
    """Late rows land on the ranks that executed them, so ranks train batches of different sizes unless
    padded: TRL gathers per-row metrics across ranks, which broke with a collective mismatch."""
    returncode, records = _failure_run(tmp_path, unused_port(), lag=lag, failing_rank=-1)
    assert returncode == 0
    assert [r["ended"] for r in records] == ["finished", "finished"]
    assert all(r["late_rows"] > 0 for r in records)


@pytest.mark.bwrap
@pytest.mark.peft
@pytest.mark.matplotlib
def test_wmrl_train_under_torchrun_writes_one_run(tmp_path, unused_port):
    """``torchrun -m wmrl.core.cli train autoresearch``: two ranks train, the main one writes the run
    directory once, and the cost report counts both ranks' rollouts."""
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.tasks.toy import make_toy_task

    model = save_tiny_model(tmp_path / "tiny")
    make_toy_task(tmp_path, "toy-regression")
    make_toy_task(tmp_path, "toy-binary", kind="binary")
    ids = json.dumps([str(tmp_path / "toy-regression"), str(tmp_path / "toy-binary")])
    run = tmp_path / "run"
    done = _torchrun(
        unused_port(),
        "-m",
        "wmrl.core.cli",
        "train",
        "autoresearch",
        "--out",
        str(run),
        f"model.path={model}",
        f"tasks.ids={ids}",
        "tasks.prompts_per_task=2",  # 2 ranks x 2 prompts per step need 4 distinct prompts
        "tasks.overview_tokens=1500",
        "world_model.overview_tokens=1500",
        "group_size=2",
        "grpo.max_completion_tokens=12",
        "steps=2",
        "logging.progress=false",
        cwd=tmp_path,
    )
    assert done.stdout.count("[wmrl] run directory:") == 1  # the main process reports, once
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["wmrl/step"] for r in rows if "wmrl/step" in r] == [1.0, 2.0]
    assert all(r["wmrl/groups"] == RANKS * 2 for r in rows if "wmrl/step" in r)
    report = json.loads((run / "cost_report.json").read_text())
    assert report["processes"] == RANKS
    assert report["graded_rollouts"] == 2 * RANKS * 2 * 2  # steps x ranks x prompts x rollouts
    assert report["spent"]["world_model"]["items"] == report["graded_rollouts"]
    assert json.loads((run / "run_summary.json").read_text())["processes"] == RANKS
    assert (run / "final" / "wmrl_corrector.json").is_file()
