"""The loop trainer on two processes (``torchrun``, gloo): the same training as one process.

``loop_rank_worker.py`` trains a bandit of 4 groups per step once on a single process and once on two
ranks (each rolls out 2 groups). The ranks plan and correct the whole gathered batch identically,
grade only their own rollouts (every anchor rollout executed once, by its own rank), end with the
same parameters as each other and as the single process, and rank 0 alone writes one run directory
whose log, completions and cost report describe the whole batch. Both schedulers are covered: the
plan from keys alone, and the active one that plans after the world model has scored every rank's
rollouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wmrl.core.pipeline import LEDGER_FILE
from wmrl.core.rundir import list_checkpoints

WORKER = Path(__file__).with_name("loop_rank_worker.py")
RANKS = 2
GROUP = 4


def _run(out: Path, scheduler: str, ranks: int, port: int, *extra: str) -> list[dict]:
    # faulthandler: a rank that aborts in native code (SIGABRT) prints every thread's Python stack
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    env.pop("WORLD_SIZE", None)
    if ranks == 1:
        command = [sys.executable, str(WORKER), str(out), scheduler, *extra]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={ranks}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            str(WORKER),
            str(out),
            scheduler,
            *extra,
        ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"exit {done.returncode}\nstdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-12000:]}"
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module", params=["keys", "active"])
def runs(request, tmp_path_factory, unused_port):
    root = tmp_path_factory.mktemp(f"loop-{request.param}")
    alone = _run(root / "alone", request.param, 1, unused_port())[0]
    ranks = _run(root / "ranks", request.param, RANKS, unused_port())
    return root, alone, ranks


def test_the_ranks_train_what_one_process_trains(runs):
    _, alone, (zero, one) = runs
    assert zero["world"] == one["world"] == RANKS and alone["world"] == 1
    # identical across ranks, bit for bit (the gradient is summed before the same Adam step)
    assert zero["logits"] == one["logits"]
    assert zero["corrector_state"] == one["corrector_state"]
    # and the single process's training, up to float summation order
    assert np.allclose(zero["logits"], alone["logits"], rtol=0, atol=1e-12)
    assert not np.allclose(zero["logits"], 0.0)  # it trained
    assert zero["corrector_state"] == alone["corrector_state"]
    for s_alone, s0, s1 in zip(alone["steps"], zero["steps"], one["steps"], strict=True):
        assert s0["anchor"] == s1["anchor"] == s_alone["anchor"]  # one plan, the whole batch's
        assert s0["advantages"] == s1["advantages"] == s_alone["advantages"]
        assert s0["keys"] == s1["keys"] == s_alone["keys"]  # the gathered batch, in rank order
        assert s0["rows"] == [0, 2, 1] and s1["rows"] == [2, 4, 1]
        assert s0["metrics"] == s1["metrics"] == s_alone["metrics"]
        assert 0 < sum(s0["anchor"]) < 4


def test_each_rank_grades_only_its_own_rollouts(runs):
    _, alone, ranks = runs
    anchored = 0
    for rank, record in enumerate(ranks):
        tasks = {task for task, _ in record["wm_items"]}
        assert tasks == {2 * rank, 2 * rank + 1}  # its two groups of every step
        assert len(record["wm_items"]) == 3 * 2 * GROUP
        own_anchor = 0
        for step in record["steps"]:
            own_anchor += GROUP * sum(step["anchor"][2 * rank : 2 * rank + 2])
        assert len(record["anchor_items"]) == own_anchor
        assert {task for task, _ in record["anchor_items"]} <= tasks
        anchored += own_anchor
    assert anchored == len(alone["anchor_items"])  # every anchor rollout executed once
    assert all(r["anchor_items"] for r in ranks), "one rank executed nothing: the split is not seen"


def test_rank_zero_writes_one_run_that_describes_every_rank(runs):
    root, alone, (zero, one) = runs
    assert zero["report"] == one["report"]
    report = zero["report"]
    assert report["processes"] == RANKS
    assert report["graded_rollouts"] == alone["report"]["graded_rollouts"] == 3 * 4 * GROUP
    assert report["spent"]["world_model"]["items"] == 3 * 4 * GROUP
    assert report["spent"]["anchor"]["items"] == alone["report"]["spent"]["anchor"]["items"]
    run = root / "ranks" / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # one line per step: rank 1 wrote nothing
    assert all(r["bandit/rollouts"] == 4 * GROUP for r in rows)
    table = (run / "completions.jsonl").read_text().splitlines()
    assert len(table) == 3 * 4 * GROUP
    assert table == (root / "alone" / "run" / "completions.jsonl").read_text().splitlines()
    assert json.loads((run / "cost_report.json").read_text())["processes"] == RANKS
    final = list_checkpoints(run)[-1]
    saved = json.loads((final / LEDGER_FILE).read_text())["ranks"]
    assert len(saved) == RANKS
    assert sum(r["streams"]["world_model"]["items"] for r in saved) == 3 * 4 * GROUP
    assert [p.name for p in (root / "ranks").iterdir() if p.is_dir()] == ["run"]


def test_two_ranks_resume_where_they_stopped(runs, tmp_path, unused_port):
    """Stopped after step 2 and continued from its checkpoint on two ranks: the run that never stopped."""
    root, _, (zero, _) = runs
    scheduler = "active" if "active" in root.name else "keys"
    again = _run(tmp_path, scheduler, RANKS, unused_port(), "resume")
    assert again[0]["logits"] == again[1]["logits"] == zero["logits"]
    assert again[0]["corrector_state"] == zero["corrector_state"]
    assert [s["anchor"] for s in again[0]["steps"]] == [s["anchor"] for s in zero["steps"][2:]]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert again[0]["report"]["graded_rollouts"] == zero["report"]["graded_rollouts"]
    # each rank got its own ledger back from the checkpoint
    assert again[0]["report"]["spent"]["world_model"]["items"] == 3 * 4 * GROUP
