"""Executions per minute through the sandbox: every backend against a *bare* subprocess.

Two solutions: a *trivial* one (copies the sample submission; measures the fixed cost of an
execution: namespaces, user switch, seccomp, interpreter start-up, launcher, teardown) and a
*typical* scikit-learn one (pandas read, a hold-out split, a random forest, a CSV written). Each
(solution, runner, slots) cell runs ``n`` executions through a :class:`SandboxPool` without a
cache, after one warm-up execution, and reports executions per minute. The runners:

- ``bare``: ``subprocess.run([python, solution.py])`` with the solution environment's
  interpreter, the same environment variables and a fresh work dir -- no launcher, no limits,
  no user switch, no filter: the reference;
- ``subprocess``: the (unisolated) subprocess backend: launcher, dedicated user, seccomp, cgroup;
- ``bwrap``: the bubblewrap backend; ``docker``: the Docker backend (where an engine answers).

``runner / bare`` is the cost of each backend; ``2 slots / 1 slot`` the gain of concurrency.

Run: ``python benchmarks/sandbox_throughput.py [--n-trivial 24] [--n-sklearn 8] [--rounds 4] [--json out.json]``
(a few minutes on 2 cores; set ``DOCKER_HOST`` to include Docker). The load average at start and
end is printed: on a shared machine the absolute numbers move with other work, the ratios much less.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.autoresearch.sandbox import (
    ExecutionResult,
    Limits,
    Resources,
    Sandbox,
    SandboxPool,
    available_libraries,
    backend_problems,
    make_sandbox,
)
from wmrl.autoresearch.sandbox.environment import sandbox_env

TRIVIAL = """
import os, shutil
shutil.copy(os.path.join(os.environ["DATA_DIR"], "sample_submission.csv"), os.environ["SUBMISSION_PATH"])
"""

SKLEARN = """
import os
import pandas as pd
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import accuracy_score
from sklearn.model_selection import train_test_split

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
features = [c for c in train.columns if c.startswith("f")]
x_tr, x_va, y_tr, y_va = train_test_split(train[features], train["target"], test_size=0.2, random_state=0)
model = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0, n_jobs=1).fit(x_tr, y_tr)
print("validation accuracy", accuracy_score(y_va, model.predict(x_va)))
model.fit(train[features], train["target"])
pd.DataFrame({"id": test["id"], "target": model.predict(test[features])}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
"""


def make_data(root: Path, n_train: int = 3000, n_test: int = 1000, n_features: int = 20) -> Path:
    """A synthetic tabular binary-classification task (public part only)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=n_features)
    public = root / "public"
    public.mkdir(parents=True)

    def table(n: int, start: int, with_target: bool) -> str:
        x = rng.normal(size=(n, n_features))
        y = (x @ w + rng.normal(scale=2.0, size=n) > 0).astype(int)
        head = ["id", *(f"f{i}" for i in range(n_features))] + (["target"] if with_target else [])
        rows = [",".join(head)]
        for i in range(n):
            vals = [str(start + i), *(f"{v:.5f}" for v in x[i])] + ([str(y[i])] if with_target else [])
            rows.append(",".join(vals))
        return "\n".join(rows) + "\n"

    (public / "train.csv").write_text(table(n_train, 0, True))
    (public / "test.csv").write_text(table(n_test, n_train, False))
    (public / "sample_submission.csv").write_text(
        "id,target\n" + "".join(f"{n_train + i},0\n" for i in range(n_test))
    )
    return public


class BareSubprocess(Sandbox):
    """The reference: the solution environment's interpreter run directly, nothing else."""

    name = "bare"

    def protections(self) -> dict[str, str]:
        return {"everything": "NO: a bare subprocess"}

    def _run(self, code, data_dir, limits, execution_id):
        work = self.output_root / execution_id
        work.mkdir()
        (work / "solution.py").write_text(code)
        env = sandbox_env(
            limits,
            data_dir=str(data_dir),
            submission_path=str(work / "submission.csv"),
            work_dir=str(work),
            tmp_dir=str(work),
            python_bin_dir=str(self.solution_env.python.parent),
            cuda_visible_devices="",
        )
        t0 = time.perf_counter()
        done = subprocess.run(
            [str(self.solution_env.python), "solution.py"], cwd=work, env=env, capture_output=True
        )
        wall = time.perf_counter() - t0
        shutil.rmtree(work, ignore_errors=True)
        return ExecutionResult(
            status="ok" if done.returncode == 0 else "error",
            exit_code=done.returncode,
            stderr_tail=done.stderr.decode(errors="replace")[-2000:],
            resources=Resources(wall_s=wall),
        )


def measure(pools: dict, code: str, data: Path, limits: Limits, n: int, rounds: int) -> dict:
    """Executions per minute of ``n`` runs of ``code`` per backend, interleaved.

    The ``n`` executions are split into ``rounds`` batches; each round runs one batch on every
    backend, alternating which goes first, so that a change in the machine's load during the
    measurement hits both backends alike.
    """
    elapsed = dict.fromkeys(pools, 0.0)
    results: dict[str, list] = {b: [] for b in pools}
    for b, pool in pools.items():
        warm = pool.run(code, data, limits)
        if warm.status != "ok":
            raise RuntimeError(f"{b}: warm-up failed: {warm.status} {warm.reason} {warm.stderr_tail[-500:]}")
    sizes = [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]
    done = 0
    for r, size in enumerate(sizes):
        order = list(pools) if r % 2 == 0 else list(pools)[::-1]
        for b in order:
            # A comment makes each code distinct, as an RL batch's solutions are.
            jobs = [
                {"code": code + f"\n# {done + i}\n", "data_dir": data, "limits": limits} for i in range(size)
            ]
            t0 = time.perf_counter()
            results[b] += pools[b].map(jobs)
            elapsed[b] += time.perf_counter() - t0
        done += size
    out = {}
    for b in pools:
        bad = [x for x in results[b] if x.status != "ok"]
        if bad:
            raise RuntimeError(f"{b}: {len(bad)} executions failed, e.g. {bad[0].status} {bad[0].reason}")
        out[b] = {
            "executions": n,
            "elapsed_s": round(elapsed[b], 3),
            "per_minute": round(60 * n / elapsed[b], 1),
            "mean_wall_s": round(float(np.mean([x.resources.wall_s for x in results[b]])), 3),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n-trivial", type=int, default=24, help="executions per cell for the trivial solution"
    )
    parser.add_argument(
        "--n-sklearn", type=int, default=8, help="executions per cell for the scikit-learn solution"
    )
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per cell")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    problems = backend_problems()
    runners = ["bare", *(b for b in ("subprocess", "bwrap", "docker") if problems[b] is None)]
    for b in ("bwrap", "docker"):
        if problems[b] is not None:
            print(f"{b} unavailable ({problems[b]}); not measured")
    limits = Limits(wall_time_s=120, memory_mb=2048, threads=1)
    print("note: the subprocess backend logs a no-isolation warning on every run; silenced here")
    logging.getLogger("wmrl.autoresearch.sandbox").setLevel(logging.ERROR)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="wmrl-bench-sandbox-") as tmp:
        data = make_data(Path(tmp))
        os.chmod(tmp, 0o755)  # the sandbox users read the data in place
        sandboxes = {
            b: BareSubprocess(output_root=Path(tmp) / "out-bare")
            if b == "bare"
            else make_sandbox(b, output_root=Path(tmp) / f"out-{b}")
            for b in runners
        }
        cells = {}
        for sol_name, code, n in (("trivial", TRIVIAL, args.n_trivial), ("sklearn", SKLEARN, args.n_sklearn)):
            for slots in args.slots:
                pools = {b: SandboxPool(s, slots=slots) for b, s in sandboxes.items()}
                try:
                    measured = measure(pools, code, data, limits, n, rounds=min(args.rounds, n))
                finally:
                    for p in pools.values():
                        p.close()
                for b, cell in measured.items():
                    cells[(sol_name, slots, b)] = cell
                    print(f"{sol_name:8s} slots={slots} {b:10s} {cell}", flush=True)
    load1 = os.getloadavg()

    print()
    print(f"host: {platform.node()} {os.cpu_count()} CPUs, load average {load0[0]:.2f} -> {load1[0]:.2f}")
    cg = {b: getattr(s, "cgroup_support", None) for b, s in sandboxes.items() if b in ("subprocess", "bwrap")}
    print("cgroups: " + ", ".join(f"{b}={'v' + str(c.version) if c else 'none'}" for b, c in cg.items()))
    others = runners[1:]
    print(
        "| solution | slots | bare exec/min | "
        + " | ".join(f"{b} exec/min | {b} / bare" for b in others)
        + " | mean wall bare (s) | "
        + " | ".join(f"mean wall {b} (s)" for b in others)
        + " |"
    )
    print("|" + "---|" * (4 + 3 * len(others)))
    rows = []
    for sol_name in ("trivial", "sklearn"):
        for slots in args.slots:
            bare = cells[(sol_name, slots, "bare")]
            row = {"solution": sol_name, "slots": slots, "bare": bare}
            for b in others:
                row[b] = cells[(sol_name, slots, b)]
                row[f"ratio_{b}_over_bare"] = round(row[b]["per_minute"] / bare["per_minute"], 3)
            rows.append(row)
            print(
                f"| {sol_name} | {slots} | {bare['per_minute']} | "
                + " | ".join(f"{row[b]['per_minute']} | {row[f'ratio_{b}_over_bare']:.2f}" for b in others)
                + f" | {bare['mean_wall_s']} | "
                + " | ".join(str(row[b]["mean_wall_s"]) for b in others)
                + " |"
            )
    if len(args.slots) > 1:
        print()
        for sol_name in ("trivial", "sklearn"):
            for b in runners:
                one, many = cells[(sol_name, args.slots[0], b)], cells[(sol_name, args.slots[-1], b)]
                print(
                    f"{sol_name} {b}: {args.slots[-1]} slots / {args.slots[0]} slot = {many['per_minute'] / one['per_minute']:.2f}x"
                )
    out = {
        "rows": rows,
        "load_average": [load0[0], load1[0]],
        "cpus": os.cpu_count(),
        "libraries": available_libraries(),
        "cgroups": {b: (c.version if c else None) for b, c in cg.items()},
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
