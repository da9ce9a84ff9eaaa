"""Real execution on a Ray pool of a real multi-raylet cluster (``ray_cluster`` in conftest).

The grader uses the Ray pool exactly as the local ``SandboxPool``; the solutions run in the
sandbox backend of Ray workers on other raylets. A raylet is killed mid-batch: its executions
are retried elsewhere or come back unknown with the reason, and none is scored 0.
"""

from __future__ import annotations

import time

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


def _pool(config, **kw):
    from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool

    return make_ray_sandbox_pool("subprocess", config, **kw)


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
        cpu_only = _pool(RayPoolConfig(slots=1, resources={"sandbox": 1}), cache=None)
        try:
            refused = cpu_only.run(SHOW_GPU, task.public_dir, Limits(gpu=True))
        finally:
            cpu_only.sandbox.close()
            cpu_only.close()
    finally:
        pool.sandbox.close()
        pool.close()
    seen = {line for r in results for line in r.stdout_tail.splitlines() if line.startswith("GPU=")}
    assert all(r.status == "ok" for r in results)
    assert seen == {"GPU=0", "GPU=1"}  # each slot's own device, never both, never all
    assert refused.status == "harness_error" and "holds none" in refused.reason


def test_public_data_is_shipped_to_nodes_that_lack_it(ray_cluster, task):
    shown = {}
    for ship in ("always", "auto"):
        # copy_data=False: the solution's DATA_DIR is the very folder the worker uses
        pool = _pool(
            RayPoolConfig(slots=1, resources={"sandbox": 1}),
            cache=None,
            ship_data=ship,
            options={"copy_data": False},
        )
        try:
            (grade,) = ExecutionRewardSource(ExecutionGrader(sandbox=pool)).grade([(task, SHOW_DATA)])
        finally:
            pool.sandbox.close()
            pool.close()
        assert grade.status == "valid"
        shown[ship] = next(
            line for line in grade.info["stdout_tail"].splitlines() if line.startswith("DATA=")
        )
    # shipped: the node's own unpacked copy; auto on one host: the task's folder in place
    assert "wmrl-ray-data" in shown["always"] and str(task.public_dir) not in shown["always"]
    assert shown["auto"] == f"DATA={task.public_dir}"
