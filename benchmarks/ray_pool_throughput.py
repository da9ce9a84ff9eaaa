"""Executions per second through the Ray sandbox pool against 1, 2 and 4 Ray workers, side by side.

A real cluster on this machine (:class:`~wmrl.core.engines.ray.LocalCluster`: a head with no CPUs
and four worker raylets, one ``sandbox`` slot each), and the Ray sandbox pool
(:func:`~wmrl.autoresearch.sandbox.ray_pool.make_ray_sandbox_pool`, bubblewrap on every worker, no
result cache) with 1, 2 and 4 slots, all in one run. Two solutions:

* ``wait``: sleeps 1 s, then copies the sample submission: an execution whose time is spent off
  this machine's CPUs (a GPU kernel, a remote service, I/O). It shows how far the pool itself scales
  (dispatch, Ray calls, sandbox start-up) when executions do not compete for the CPUs;
* ``cpu``: the toy least-squares solution (pandas + numpy: ~0.5 s of CPU): executions that do
  compete; on a 2-core machine it cannot scale past 2 workers, and the ratio says so.

Each (solution, workers) cell runs ``n`` distinct executions after one warm-up per worker and
reports executions per second and the ratio to 1 worker. Run:

    RAY_AUTH_MODE=disabled python benchmarks/ray_pool_throughput.py [--n 16] [--json out.json]

(about five minutes on 2 cores, most of it starting the raylets). The load average at start and end
is printed: on a shared machine absolute rates move with other work, the ratios much less.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

WAIT = """
import os, shutil, time
time.sleep(1.0)
shutil.copy(os.path.join(os.environ["DATA_DIR"], "sample_submission.csv"), os.environ["SUBMISSION_PATH"])
"""


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(n: int, workers: tuple[int, ...], backend: str) -> dict:
    import ray

    from wmrl.autoresearch.sandbox import Limits
    from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool
    from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task
    from wmrl.core.engines.ray import LocalCluster, RayPoolConfig
    from wmrl.core.engines.ray.cluster import LOOPBACK

    task = make_toy_task(Path(tempfile.mkdtemp(prefix="wmrl-bench-")))
    solutions = {"wait": WAIT, "cpu": TOY_SOLUTION}
    limits = Limits(wall_time_s=60, threads=1)
    rows = []
    started = time.perf_counter()
    with LocalCluster(head_cpus=0, memory_mb=1024, object_store_mb=80) as cluster:
        for _ in range(max(workers)):
            cluster.add_node(cpus=1, resources={"sandbox": 1})
        ray.init(address=cluster.address, log_to_driver=False, _node_ip_address=LOOPBACK)
        cluster.wait_for_nodes(max(workers) + 1)
        setup_s = time.perf_counter() - started
        try:
            for slots in workers:
                config = RayPoolConfig(slots=slots, resources={"sandbox": 1}, timeout_s=300)
                pool = make_ray_sandbox_pool(backend, config, cache=None)
                try:
                    deadline = time.monotonic() + 120
                    while len(pool.sandbox.pool.workers()) < slots and time.monotonic() < deadline:
                        time.sleep(0.2)
                    for name, code in solutions.items():
                        # one warm-up per worker (imports, page cache), then n distinct executions
                        warm = [
                            pool.submit(code + f"\n# warm {i}\n", task.public_dir, limits)
                            for i in range(slots)
                        ]
                        [f.result() for f in warm]
                        t0 = time.perf_counter()
                        futures = [
                            pool.submit(code + f"\n# {i}\n", task.public_dir, limits) for i in range(n)
                        ]
                        results = [f.result() for f in futures]
                        wall = time.perf_counter() - t0
                        ok = sum(r.status == "ok" for r in results)
                        rows.append(
                            {
                                "solution": name,
                                "workers": slots,
                                "executions": n,
                                "ok": ok,
                                "wall_s": round(wall, 3),
                                "exec_per_s": round(n / wall, 3),
                                "nodes_used": len(pool.sandbox.pool.node_items()),
                            }
                        )
                        print(f"{name:5s} workers={slots} {n / wall:7.3f} exec/s ({ok}/{n} ok)", flush=True)
                finally:
                    pool.sandbox.close()
                    pool.close()
        finally:
            ray.shutdown()
    for row in rows:
        base = next(r for r in rows if r["solution"] == row["solution"] and r["workers"] == workers[0])
        row["ratio_to_1"] = round(row["exec_per_s"] / base["exec_per_s"], 2)
    return {"rows": rows, "cluster_setup_s": round(setup_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=16, help="executions per (solution, workers) cell")
    parser.add_argument("--workers", default="1,2,4", help="Ray worker counts to compare")
    parser.add_argument("--backend", default="bwrap", choices=("bwrap", "subprocess", "docker"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    load_start = _load()
    result = run(args.n, tuple(int(w) for w in args.workers.split(",")), args.backend)
    result.update(
        load_start=load_start,
        load_end=_load(),
        cpus=os.cpu_count(),
        machine=platform.platform(),
        backend=args.backend,
    )
    print(f"load average: {load_start} -> {result['load_end']}")
    print("| solution | workers | exec/s | ratio to 1 worker | nodes used |")
    print("|---|---|---|---|---|")
    for r in result["rows"]:
        print(
            f"| {r['solution']} | {r['workers']} | {r['exec_per_s']:.3f} | {r['ratio_to_1']:.2f} | {r['nodes_used']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
