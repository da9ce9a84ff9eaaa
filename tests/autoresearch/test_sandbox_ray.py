"""Real execution on a Ray pool of a real multi-raylet cluster (``ray_cluster`` in conftest).

The grader uses the Ray pool exactly as the local ``SandboxPool``; the solutions run in the
sandbox backend of Ray workers on other raylets. A raylet is killed mid-batch: its executions
are retried elsewhere or come back unknown with the reason, and none is scored 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from wmrl.autoresearch.grading.grader import ExecutionGrader
from wmrl.autoresearch.grading.source import ExecutionRewardSource
from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task
from wmrl.core.engines.ray.config import RayPoolConfig

pytestmark = [pytest.mark.ray, pytest.mark.pandas]

SLOW_SOLUTION = "import time\ntime.sleep(2.5)\n" + TOY_SOLUTION
SHOW_GPU = 'import os\nprint("GPU=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))\n' + TOY_SOLUTION
SHOW_DATA = 'import os\nprint("DATA=" + os.environ["DATA_DIR"])\n' + TOY_SOLUTION


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_toy_task(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    """The tiny coder of ``test_training_real.py`` (a tiny LM taught to write four kinds of scripts)
    and a dataset of prompts on two toy tasks."""
    from datasets import Dataset

    from wmrl.autoresearch.training.tiny_coder import train_tiny_coder

    root = tmp_path_factory.mktemp("coder-tasks")
    make_toy_task(root, "toy-regression", time_limit_s=30)
    make_toy_task(root, "toy-binary", kind="binary", time_limit_s=30)
    prompt = [{"role": "user", "content": "Write a script for the task."}]
    rows = [
        {"prompt": prompt, "prompt_id": f"{t}-{k}", "task_id": t, "task_ref": str(root / t)}
        for k, t in enumerate(("toy-regression", "toy-binary") * 2)
    ]
    folder = tmp_path_factory.mktemp("coder")
    train_tiny_coder([prompt], save_to=folder)
    return {"coder": folder, "dataset": Dataset.from_list(rows)}


def _pool(config, **kw):
    from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool

    return make_ray_sandbox_pool("subprocess", config, **kw)


def _run_once(config, code, data_dir, limits, backend="subprocess", **kw):
    """One execution on a fresh Ray sandbox pool, closed afterwards: (result, the pool's counters)."""
    from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool

    pool = make_ray_sandbox_pool(backend, config, cache=None, **kw)
    try:
        return pool.run(code, data_dir, limits), pool.sandbox.pool.metrics()
    finally:
        pool.sandbox.close()
        pool.close()


def _wait_for_workers(pool, n, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while len(pool.sandbox.pool.workers()) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pool.sandbox.pool.workers()) >= n


def test_grades_on_ray_workers_match_local_grades_and_share_one_cache(ray_cluster, task):
    from wmrl.autoresearch.sandbox.ray_pool import pool_metrics

    items = [(task, TOY_SOLUTION), (task, "raise SystemExit(3)"), (task, "x = ("), (task, "print('hi')")]
    local = ExecutionRewardSource(ExecutionGrader(backend="subprocess")).grade(items)
    pool = _pool(RayPoolConfig(slots=2, resources={"sandbox": 1}, timeout_s=120))
    try:
        _wait_for_workers(pool, 2)
        source = ExecutionRewardSource(ExecutionGrader(sandbox=pool), max_workers=2)
        remote = source.grade(items)
        again = source.grade([(task, TOY_SOLUTION)])  # the same script: the pool's cache answers
        metrics = pool_metrics(pool)
        nodes = pool.sandbox.pool.node_items()
    finally:
        pool.sandbox.close()
        pool.close()
    assert (
        [g.status for g in remote]
        == [g.status for g in local]
        == [
            "valid",
            "runtime_error",
            "syntax_error",
            "no_submission",
        ]
    )
    assert [g.value for g in remote] == pytest.approx([g.value for g in local])
    assert remote[0].info["backend"] == "ray-subprocess"
    assert any("ran on Ray node" in w for w in remote[0].info["warnings"])
    assert again[0].info["cached"] and again[0].value == pytest.approx(remote[0].value)
    assert metrics["pool/cache_hits"] >= 1
    # the syntax error never reached a worker; the three executions ran on both nodes
    assert sum(nodes.values()) == 3 and len(nodes) == 2


def test_a_lost_node_mid_batch_scores_nothing_zero(ray_cluster, task):
    from wmrl.autoresearch.sandbox.ray_pool import pool_metrics

    for retries in (1, 0):
        doomed = ray_cluster.add_node(cpus=1, resources={"sandbox": 1})
        ray_cluster.wait_for_nodes()
        pool = _pool(
            RayPoolConfig(slots=3, resources={"sandbox": 1}, retries=retries, timeout_s=120), cache=None
        )
        try:
            _wait_for_workers(pool, 3)
            source = ExecutionRewardSource(ExecutionGrader(sandbox=pool), max_workers=3)
            items = [(task, SLOW_SOLUTION + f"\n# variant {i}\n") for i in range(6)]
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as side:
                grading = side.submit(source.grade, items)
                time.sleep(1.5)  # every slot is mid-execution
                doomed.kill_raylet()
                grades = grading.result(timeout=300)
            metrics = pool_metrics(pool)
        finally:
            pool.sandbox.close()
            pool.close()
            doomed.stop()
        assert metrics["pool/workers_lost"] >= 1
        assert all(g.value is None or g.status == "valid" for g in grades), [g.status for g in grades]
        assert not any(g.value == 0 for g in grades)
        unknown = [g for g in grades if g.value is None]
        if retries:
            assert not unknown, [g.info.get("reason") for g in unknown]
        else:
            assert unknown, "the killed node held executions: without retries they come back unknown"
            for g in unknown:
                assert g.status == "harness_error" and "was lost" in g.info["reason"]


def test_a_gpu_slot_gives_its_solution_its_own_gpu_only(ray_cluster, task, tmp_path):
    from wmrl.autoresearch.sandbox import Limits

    pool = _pool(RayPoolConfig(slots=2, gpus_per_slot=1, resources={"gpu_node": 1}), cache=None)
    try:
        _wait_for_workers(pool, 2)
        futures = [
            pool.submit(SHOW_GPU + f"\n# {i}\n", task.public_dir, Limits(gpu=True, wall_time_s=60))
            for i in range(4)
        ]
        results = [f.result() for f in futures]
        refused, _ = _run_once(
            RayPoolConfig(slots=1, resources={"sandbox": 1}), SHOW_GPU, task.public_dir, Limits(gpu=True)
        )
    finally:
        pool.sandbox.close()
        pool.close()
    seen = {line for r in results for line in r.stdout_tail.splitlines() if line.startswith("GPU=")}
    assert all(r.status == "ok" for r in results)
    assert seen == {"GPU=0", "GPU=1"}  # each slot's own device, never both, never all
    assert refused.status == "harness_error" and "holds none" in refused.reason


def test_public_data_is_shipped_to_nodes_that_lack_it(ray_cluster, task):
    from wmrl.autoresearch.sandbox import Limits

    used = {}
    for ship in ("always", "auto"):
        result, _ = _run_once(
            RayPoolConfig(slots=1, resources={"sandbox": 1}),
            SHOW_DATA,
            task.public_dir,
            Limits(),
            ship_data=ship,
        )
        assert result.status == "ok", result.reason
        assert any(line.startswith("DATA=") for line in result.stdout_tail.splitlines())
        (used[ship],) = [w for w in result.warnings if w.startswith("ran on Ray node")]
    # shipped: the node unpacks its own copy; auto, every worker on this host: the folder in place
    assert used["always"].endswith("public data shipped")
    assert used["auto"].endswith("public data in place")


@pytest.mark.trl
@pytest.mark.bwrap
def test_grpo_trains_on_real_execution_from_the_ray_pool(ray_cluster, tmp_path, coder):
    """WMRLGRPOTrainer with its anchor on Ray workers (bubblewrap on each): every real reward the
    corrector gets is what a local re-grading gives, and the pool's counters reach the log."""
    from cpu_grpo import cpu_grpo_config
    from test_training_real import Recorder

    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.llm import load_model
    from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool, pool_metrics
    from wmrl.autoresearch.tasks import Solution, load_task
    from wmrl.core.corrector import CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer

    pool = make_ray_sandbox_pool("bwrap", RayPoolConfig(slots=2, resources={"sandbox": 1}, timeout_s=120))
    try:
        anchor = ExecutionRewardSource(ExecutionGrader(sandbox=pool), max_workers=2)
        policy = load_model(coder["coder"])
        args = cpu_grpo_config(
            tmp_path / "out",
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=96,
            max_steps=2,
            save_strategy="no",
            seed=0,
            temperature=1.0,
        )
        trainer = WMRLGRPOTrainer(
            model=policy.model,
            processing_class=policy.tokenizer,
            args=args,
            train_dataset=coder["dataset"],
            corrector=CorrectorConfig.preset("real", base=CorrectorConfig(debias=DebiasConfig(min_pairs=4))),
            mode="real",
            anchor=anchor,
            metrics_fn=lambda: pool_metrics(pool),
        )
        rec = Recorder(trainer)
        trainer.train()
        nodes = pool.sandbox.pool.node_items()
    finally:
        pool.sandbox.close()
        pool.close()
    regrade = ExecutionGrader(backend="bwrap")
    items, checked, ran = iter(rec.items), 0, 0
    for plan, _wm, real, _result in rec.corrections:
        for g in range(real.shape[0]):
            for j in range(real.shape[1]):
                item = next(items)
                if plan.anchor[g] and isinstance(item, Solution):
                    expected = regrade.grade(load_task(item.task_id), item.code)
                    assert real[g, j] == pytest.approx(expected.reward, abs=1e-12)
                    checked += 1
                    ran += expected.status != "syntax_error"  # a syntax error never reaches a sandbox
    assert checked, "no script was graded"
    logged = [h for h in trainer.state.log_history if "pool/items_done" in h]
    assert len(logged) == 2
    last = logged[-1]
    # every execution that reached the pool ran on a Ray worker, or was answered by the shared cache
    assert last["pool/items_done"] == last["pool/cache_misses"]
    assert last["pool/items_done"] + last["pool/cache_hits"] == ran
    assert last["pool/items_unknown"] == 0 and last["pool/nodes"] == 2
    assert sum(nodes.values()) == last["pool/items_done"]


def test_the_training_config_builds_its_anchor_on_the_ray_pool(ray_cluster, task):
    from wmrl.autoresearch.sandbox.ray_pool import RaySandbox
    from wmrl.autoresearch.training.builders import build_anchor, pool_metrics
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import ConfigError, from_dict

    values = {
        "sandbox": {
            "pool": "ray",
            "backend": "subprocess",
            "workers": 2,
            "ray": {"address": ray_cluster.address, "slots": 2, "resources": {"sandbox": 1}},
        }
    }
    config = from_dict(TrainConfig, values)
    anchor = build_anchor(config, {task.id: task})
    pool = anchor.grader.sandbox
    try:
        assert isinstance(pool.sandbox, RaySandbox) and pool.slots == 2
        assert anchor.grade([(task, TOY_SOLUTION)])[0].status == "valid"
        assert pool_metrics(anchor)()["pool/items_done"] == 1
    finally:
        pool.sandbox.close()
        pool.close()
    with pytest.raises(ConfigError, match=r"must equal sandbox\.ray\.slots"):
        from_dict(TrainConfig, {"sandbox": {"pool": "ray", "backend": "subprocess", "workers": 3}})
    with pytest.raises(ConfigError, match="must be named"):
        from_dict(TrainConfig, {"sandbox": {"pool": "ray", "backend": "auto", "workers": 1}})


LIST_DATA = (
    'import os, json\nprint("FILES=" + json.dumps(sorted(os.listdir(os.environ["DATA_DIR"]))))\n'
    + TOY_SOLUTION
)


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root")
def test_shipped_data_never_reuses_a_folder_someone_else_planted(ray_cluster, task):
    """Round three, hole 5: a worker reused whatever it found at the predictable unpack path of
    shipped data; a subprocess-backend solution planted answers there and a later isolated run on
    the Ray pool scored gold. Planted at the old path and at the new staging root (made first, by
    another uid, with a forged manifest), neither is used: the node unpacks and verifies its own."""
    from wmrl.autoresearch.sandbox import Limits
    from wmrl.autoresearch.sandbox.pool import data_fingerprint

    key = data_fingerprint(task.public_dir)
    tmp = Path(tempfile.gettempdir())
    attacker = 300_200
    old_root = tmp / "wmrl-ray-data" / hashlib.sha256(key.encode()).hexdigest()[:24]
    new_root = tmp / f"wmrl-ray-data-{os.geteuid()}"
    aside = tmp / f"wmrl-ray-data-aside-{os.getpid()}"
    if new_root.exists():
        new_root.rename(aside)
    planted = []
    try:
        for public in (old_root / "public", new_root / key / "public"):
            shutil.copytree(task.public_dir, public)
            (public / "answers.csv").write_text("id,y\n1,0.5\n")
            (public.parent / "manifest.json").write_text("{}")
            planted.append(public.parent)
        for folder in {old_root.parent, old_root, new_root, *planted}:
            for path in [folder, *folder.rglob("*")]:
                os.chown(path, attacker, attacker)
        result, _ = _run_once(
            RayPoolConfig(slots=1, resources={"sandbox": 1}),
            LIST_DATA,
            task.public_dir,
            Limits(),
            ship_data="always",
        )
        assert result.status == "ok", result.reason
        (line,) = [x for x in result.stdout_tail.splitlines() if x.startswith("FILES=")]
        assert "answers.csv" not in json.loads(line[len("FILES=") :])
        assert sorted(json.loads(line[len("FILES=") :])) == sorted(os.listdir(task.public_dir))
    finally:
        shutil.rmtree(old_root.parent, ignore_errors=True)
        shutil.rmtree(new_root, ignore_errors=True)
        if aside.exists():
            aside.rename(new_root)


def test_a_shared_gpu_slot_says_its_memory_is_not_bounded(ray_cluster, task):
    """Issue 35: slots sharing a device (``gpus_per_slot < 1``, the paper's packing) have no per-slot
    GPU-memory bound; each result of such a slot says so, a whole-GPU slot's does not."""
    from wmrl.autoresearch.sandbox import Limits

    warned = {}
    for share in (0.5, 1):
        result, _ = _run_once(
            RayPoolConfig(slots=1, gpus_per_slot=share, resources={"gpu_node": 1}),
            SHOW_GPU,
            task.public_dir,
            Limits(gpu=True, wall_time_s=60),
        )
        assert result.status == "ok", result.reason
        warned[share] = any("not bounded per slot" in w for w in result.warnings)
    assert warned == {0.5: True, 1: False}


ATTACK_LAUNCHER = (
    "import os, resource, signal\n"
    "for target in {1, os.getppid()}:\n"
    "    for attack in (lambda: os.kill(target, signal.SIGINT), lambda: os.kill(target, signal.SIGKILL),\n"
    "                   lambda: resource.prlimit(target, resource.RLIMIT_NOFILE, (3, 3))):\n"
    "        try:\n"
    "            attack()\n"
    "        except OSError:\n"
    "            pass\n"
    "raise SystemExit(1)\n"
)


@pytest.mark.bwrap
def test_attacking_the_launcher_on_a_ray_worker_is_a_failure_not_a_retried_unknown(ray_cluster, task):
    """Round three, hole 1, on the Ray pool: a harness error is retried on another node (a lottery for
    a solution that could fake one). A solution that attacks its launcher comes back as its own
    failure, once, with no retry and no harness failure on the pool's counters."""
    from wmrl.autoresearch.sandbox import Limits

    result, counters = _run_once(
        RayPoolConfig(slots=1, resources={"sandbox": 1}, retries=2),
        ATTACK_LAUNCHER,
        task.public_dir,
        Limits(wall_time_s=60),
        backend="bwrap",
    )
    assert result.status == "error" and result.exit_code == 1, (result.status, result.reason)
    assert counters["pool/retries"] == 0 and counters["pool/harness_failures"] == 0, counters
