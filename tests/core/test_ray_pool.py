"""``RayPool`` on a real multi-raylet Ray cluster started on this machine (``ray_cluster`` in conftest).

Nothing is mocked: the nodes are separate ``ray start`` raylets, items run in Ray actors on them,
and a lost node is a raylet killed with SIGKILL mid-batch.
"""

from __future__ import annotations

import os
import time

import pytest

from wmrl.core.config import ConfigError
from wmrl.core.engines.ray.config import RayPoolConfig

pytestmark = [pytest.mark.ray]


@pytest.fixture(autouse=True, scope="module")
def _functions_travel_by_value():
    """The workers cannot import this test module: its functions are pickled by value."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _sleeper(seconds: float):
    """Worker factory: ``fn(x) -> (x * x, node id)`` after sleeping ``seconds``."""

    def factory():
        import ray

        node = ray.get_runtime_context().get_node_id()

        def fn(x):
            if x == "hang":
                time.sleep(3600)
            time.sleep(seconds)
            return (x * x, node)

        return fn

    return factory


def _gpu_probe():
    import ray

    def fn(_):
        time.sleep(0.5)  # long enough that concurrent items land on different workers
        return (os.environ.get("CUDA_VISIBLE_DEVICES"), [int(g) for g in ray.get_gpu_ids()])

    return fn


def _wait_for_workers(pool, n: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while len(pool.workers()) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pool.workers()) >= n, f"only {len(pool.workers())} of {n} workers came up"


def test_config_is_validated():
    with pytest.raises(ConfigError, match=r"ray\.slots"):
        RayPoolConfig(slots=0)
    with pytest.raises(ConfigError, match="whole number"):
        RayPoolConfig(gpus_per_slot=1.5)
    with pytest.raises(ConfigError, match="custom resource"):
        RayPoolConfig(resources={"GPU": 1})
    options = RayPoolConfig(
        memory_mb_per_slot=512, gpus_per_slot=0.25, resources={"sandbox": 1}
    ).actor_options()
    assert options["memory"] == 512 * 2**20 and options["num_gpus"] == 0.25
    assert options["resources"] == {"sandbox": 1.0} and options["scheduling_strategy"] == "SPREAD"


def test_items_spread_over_nodes_and_come_back_in_order(ray_cluster):
    from wmrl.core.engines.ray import RayPool

    config = RayPoolConfig(slots=2, resources={"sandbox": 1}, timeout_s=60, start_timeout_s=60)
    with RayPool(_sleeper(0.2), config) as pool:
        results = pool.map(range(8))
        assert [r[0] for r in results] == [x * x for x in range(8)]
        nodes = {r[1] for r in results}
        assert len(nodes) == 2  # one sandbox slot per node: both nodes worked
        assert pool.node_items() == {n: sum(1 for r in results if r[1] == n) for n in nodes}
        metrics = pool.metrics()
    assert metrics["pool/items_done"] == 8 and metrics["pool/items_unknown"] == 0
    assert metrics["pool/nodes"] == 2 and metrics["pool/throughput_per_s"] > 0
    # the test cluster stays on loopback: no raylet listens on the machine's network address
    import ipaddress

    import ray

    addresses = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    assert addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def test_each_gpu_slot_sees_only_its_own_gpu(ray_cluster):
    from wmrl.core.engines.ray import RayPool

    config = RayPoolConfig(slots=2, gpus_per_slot=1, resources={"gpu_node": 1}, start_timeout_s=60)
    with RayPool(lambda: _gpu_probe(), config) as pool:
        _wait_for_workers(pool, 2)
        futures = [pool.submit(None) for _ in range(4)]
        seen = {tuple(v[1]): v[0] for v in (f.result() for f in futures)}
        infos = pool.workers()
    assert sorted(seen) == [(0,), (1,)]  # two slots, two different GPUs
    assert seen == {(0,): "0", (1,): "1"}  # and each process sees only its own through CUDA_VISIBLE_DEVICES
    assert sorted(w.gpus for w in infos) == [("0",), ("1",)]
    # a third of a GPU per slot: several slots share one device (the paper's 3 slots per GPU)
    shared = RayPoolConfig(slots=4, cpus_per_slot=0.5, gpus_per_slot=0.5, resources={"gpu_node": 0.5})
    with RayPool(lambda: _gpu_probe(), shared) as pool:
        _wait_for_workers(pool, 4)
        gpus = sorted(w.gpus for w in pool.workers())
    assert gpus == [("0",), ("0",), ("1",), ("1",)]


def test_a_lost_node_is_retried_elsewhere_or_unknown_never_dropped(ray_cluster):
    """Kill a raylet mid-batch: with retries its items finish on the other nodes; without, they are
    :class:`Unknown` with the reason. Every item gets a result; none is a made-up value."""
    from wmrl.core.engines.ray import RayPool, Unknown

    for retries in (1, 0):
        doomed = ray_cluster.add_node(cpus=1, resources={"sandbox": 1})
        ray_cluster.wait_for_nodes()
        config = RayPoolConfig(slots=3, resources={"sandbox": 1}, retries=retries, timeout_s=120)
        pool = RayPool(_sleeper(2.0), config)
        try:
            deadline = time.monotonic() + 90
            while len({w.node for w in pool.workers()}) < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len({w.node for w in pool.workers()}) == 3, "the pool did not reach all three nodes"
            futures = [pool.submit(x) for x in range(6)]
            time.sleep(1.0)  # every slot is mid-item
            doomed.kill_raylet()
            results = [f.result(timeout=180) for f in futures]
            metrics = pool.metrics()
        finally:
            pool.close()
            doomed.stop()
        lost = [r for r in results if isinstance(r, Unknown)]
        done = [r for r in results if not isinstance(r, Unknown)]
        assert all(
            r[0] == x * x for x, r in zip(range(6), results, strict=True) if not isinstance(r, Unknown)
        )
        assert metrics["pool/workers_lost"] >= 1
        if retries:
            assert not lost and len(done) == 6
            assert metrics["pool/retries"] >= 1
        else:
            assert lost, "the killed node held an item: without retries it must come back unknown"
            assert all("was lost" in u.reason and u.attempts == 1 for u in lost)
            assert metrics["pool/items_unknown"] == len(lost)


def test_a_hung_try_is_killed_at_the_deadline_and_harness_failures_move_node(ray_cluster):
    from wmrl.core.engines.ray import RayPool, Unknown

    config = RayPoolConfig(slots=2, resources={"sandbox": 1}, retries=0, timeout_s=3, start_timeout_s=60)
    with RayPool(_sleeper(0.0), config) as pool:
        hung, fine = pool.submit("hang"), pool.submit(3)
        result = hung.result(timeout=60)
        assert isinstance(result, Unknown) and "deadline" in result.reason
        assert fine.result(timeout=60)[0] == 9
        assert pool.metrics()["pool/timeouts"] == 1
        assert pool.submit(4).result(timeout=60)[0] == 16  # the hung worker was replaced
    # A value the caller calls a harness failure is tried again on a node it was not tried on.
    first_node = {}

    def failing_once(value):
        square, node = value
        if square not in first_node:
            first_node[square] = node
            return "the sandbox did not start"
        return None

    config = RayPoolConfig(slots=2, resources={"sandbox": 1}, retries=1, start_timeout_s=60)
    with RayPool(_sleeper(0.0), config, harness_failure=failing_once) as pool:
        _wait_for_workers(pool, 2)
        value = pool.submit(5).result(timeout=60)
        assert value[0] == 25 and value[1] != first_node[25]
        assert pool.metrics()["pool/harness_failures"] == 1


def test_no_worker_can_start_gives_unknown_after_the_start_timeout(ray_cluster):
    from wmrl.core.engines.ray import RayPool, Unknown

    config = RayPoolConfig(slots=1, resources={"no_such_resource": 1}, start_timeout_s=2)
    with RayPool(_sleeper(0.0), config) as pool:
        result = pool.submit(1).result(timeout=60)
    assert isinstance(result, Unknown) and "no_such_resource" in result.reason
