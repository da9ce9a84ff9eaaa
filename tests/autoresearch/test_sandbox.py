"""Real executions through every local backend: the solution's contract, statuses, resources, the pool.

Each backend runs for real: bubblewrap where installed, Docker where an engine answers (CI starts
one: ``.ci/docker-engine``), plain subprocess everywhere. Attacks live in ``test_redteam*.py``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import textwrap
import threading
import time
from pathlib import Path

import pytest

from wmrl.autoresearch.sandbox import (
    THREAD_ENV_VARS,
    ExecutionResult,
    Limits,
    SandboxPool,
    available_libraries,
    make_sandbox,
)

BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.bwrap),
    pytest.param("docker", marks=pytest.mark.docker),
    "subprocess",
]
FAST = Limits(wall_time_s=20, memory_mb=2048, threads=1)

# Variables a solution may see: the contract, the thread caps and a few interpreter settings.
ALLOWED_ENV = {
    "DATA_DIR",
    "SUBMISSION_PATH",
    "HOME",
    "TMPDIR",
    "PATH",
    "LANG",
    "LC_ALL",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONNOUSERSITE",
    "PYTHONUNBUFFERED",
    "MPLBACKEND",
    "MPLCONFIGDIR",
    "CUDA_VISIBLE_DEVICES",
    *THREAD_ENV_VARS,
}


@pytest.fixture(params=BACKENDS)
def sb(request, sandboxes):
    return sandboxes(request.param)


@pytest.fixture
def data(tmp_path) -> Path:
    """A tiny public data folder: train.csv, test.csv, sample_submission.csv."""
    d = tmp_path / "public"
    d.mkdir()
    rows = [(i, i % 3, (i * 7) % 11 / 10) for i in range(60)]
    (d / "train.csv").write_text("id,x,y\n" + "".join(f"{i},{x},{y}\n" for i, x, y in rows[:40]))
    (d / "test.csv").write_text("id,x\n" + "".join(f"{i},{x}\n" for i, x, _ in rows[40:]))
    (d / "sample_submission.csv").write_text("id,y\n" + "".join(f"{i},0.0\n" for i, _, _ in rows[40:]))
    return d


def run(sb, code: str, data: Path, limits: Limits = FAST) -> ExecutionResult:
    return sb.run(textwrap.dedent(code), data, limits)


def test_contract_environment_cwd_and_submission(sb, data, monkeypatch):
    monkeypatch.setenv("WMRL_TEST_API_KEY", "sk-do-not-leak-123")
    res = run(
        sb,
        """
        import json, os, sys, tempfile
        sub = os.environ["SUBMISSION_PATH"]
        info = {
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "cwd_listing": sorted(os.listdir(".")),
            "data_listing": sorted(os.listdir(os.environ["DATA_DIR"])),
            "sub_dir": os.path.dirname(sub),
            "stdin": sys.stdin.read(),
            "affinity": len(os.sched_getaffinity(0)),
        }
        with tempfile.NamedTemporaryFile(dir=os.environ["TMPDIR"]) as f:
            f.write(b"scratch")
        open("scratch.bin", "wb").write(b"x" * 1000)
        lines = open(os.path.join(os.environ["DATA_DIR"], "sample_submission.csv")).read().splitlines()
        with open(sub, "w") as f:
            f.write(lines[0] + "\\n" + "".join(l.split(",")[0] + ",1.5\\n" for l in lines[1:]))
        print(json.dumps(info))
        """,
        data,
    )
    assert res.status == "ok", res
    assert res.exit_code == 0 and res.reason is None
    info = json.loads(res.stdout_tail)
    env = info["env"]
    assert set(env) - {"PWD", "SHLVL", "_", "LC_CTYPE", "WMRL_SANDBOX_EXECUTION", "HOSTNAME"} <= ALLOWED_ENV
    assert "WMRL_TEST_API_KEY" not in env
    assert all(env[v] == "1" for v in THREAD_ENV_VARS)
    assert info["cwd_listing"] == [] and info["cwd"] == env["HOME"]
    assert info["sub_dir"] == info["cwd"]
    assert info["data_listing"] == ["sample_submission.csv", "test.csv", "train.csv"]
    assert info["stdin"] == ""
    assert info["affinity"] == 1
    text = res.submission.read_text()
    assert (
        text.splitlines()[0] == "id,y" and len(text.splitlines()) == 21 and text.splitlines()[1] == "40,1.5"
    )
    # The copy lives outside the sandbox, under the sandbox's output root.
    assert res.submission.is_relative_to(sb.output_root)
    assert res.isolated is (sb.name != "subprocess")
    assert res.backend == sb.name and res.limits == FAST
    assert res.resources.wall_s > 0 and res.resources.cpu_s > 0 and res.resources.peak_rss_mb > 5
    if sb.name == "subprocess":
        assert any("NO ISOLATION" in w for w in res.warnings)


def test_executions_run_on_the_cores_named(sb, data):
    """``sandbox.cores``: the executions run on the named cores only, whatever the trainer's own."""
    from wmrl.autoresearch.sandbox import execution_cores, set_execution_cores

    before = execution_cores()
    if len(before) < 2:
        pytest.skip("needs two cores to pin executions to one of them")
    try:
        set_execution_cores([before[-1]])
        res = run(sb, "import os, json; print(json.dumps(sorted(os.sched_getaffinity(0))))", data)
        assert res.status == "ok", res
        assert json.loads(res.stdout_tail) == [before[-1]]
    finally:
        set_execution_cores(before)


@pytest.mark.parametrize(
    ("code", "exit_code", "in_stderr"),
    [
        ("raise ValueError('broken pipeline')", 1, "ValueError: broken pipeline"),
        ("import sys; sys.exit(3)", 3, ""),
        ("def f(:\n  pass", 1, "SyntaxError"),
        ("import no_such_module_wmrl", 1, "ModuleNotFoundError"),
    ],
)
def test_failing_solutions_are_errors(sb, data, code, exit_code, in_stderr):
    res = run(sb, code, data)
    assert res.status == "error"
    assert res.exit_code == exit_code
    assert in_stderr in res.stderr_tail
    assert res.submission is None


def test_death_by_signal_is_killed(sb, data):
    res = run(
        sb, "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)", data
    )
    assert res.status == "killed" and res.signal == 11 and res.exit_code == -11
    assert "SIGSEGV" in res.reason and res.stdout_tail == "before\n"


def test_timeout(sb, data):
    t0 = time.monotonic()
    res = run(sb, "print('start', flush=True)\nwhile True: pass", data, FAST.replace(wall_time_s=1.5))
    assert res.status == "timeout" and "wall time" in res.reason
    assert res.stdout_tail == "start\n"
    assert 1.4 < res.resources.wall_s < 4.5 and time.monotonic() - t0 < 6


def test_submission_written_before_timeout_is_kept(sb, data):
    code = "import os\nopen(os.environ['SUBMISSION_PATH'], 'w').write('id,y\\n')\nwhile True: pass"
    res = run(sb, code, data, FAST.replace(wall_time_s=1.0))
    assert res.status == "timeout"
    assert res.submission is not None and res.submission.read_text() == "id,y\n"


def test_file_size_limit(sb, data):
    res = run(sb, "open('big.bin', 'wb').write(b'x' * (6 << 20))", data, FAST.replace(file_size_mb=2))
    assert res.status == "killed" and "file size" in res.reason


def test_submission_must_be_a_regular_file(sb, data):
    res = run(sb, "import os\nos.mkdir(os.environ['SUBMISSION_PATH'])", data)
    assert res.status == "ok" and res.submission is None and "not a regular file" in res.submission_error
    res = run(
        sb,
        "import os\nos.symlink(os.path.join(os.environ['DATA_DIR'], 'train.csv'), os.environ['SUBMISSION_PATH'])",
        data,
    )
    assert res.status == "ok" and res.submission is None and "symbolic link" in res.submission_error
    res = run(sb, "import os\nopen(os.environ['SUBMISSION_PATH'], 'w').close()", data)
    assert res.submission is not None and res.submission.read_bytes() == b""


def test_output_tails_are_capped(sb, data):
    code = "import sys\nfor i in range(3000): print('line', i)\nsys.stderr.write('E' * 5000)"
    res = run(sb, code, data, FAST.replace(tail_bytes=100))
    assert res.status == "ok"
    assert len(res.stdout_tail.encode()) == 100 and res.stdout_tail.endswith("line 2999\n")
    assert res.stdout_bytes == sum(len(f"line {i}\n") for i in range(3000))
    assert res.stderr_tail == "E" * 100 and res.stderr_bytes == 5000


def test_scientific_stack_and_thread_caps(sb, data):
    libs = available_libraries()
    code = f"""
    import os, json
    import numpy as np, pandas as pd, scipy, sklearn
    from sklearn.linear_model import Ridge
    from threadpoolctl import threadpool_info
    extra = {{}}
    for name in {sorted(set(libs) & {"xgboost", "lightgbm"})!r}:
        extra[name] = __import__(name).__version__
    d = os.environ["DATA_DIR"]
    tr, te = pd.read_csv(f"{{d}}/train.csv"), pd.read_csv(f"{{d}}/test.csv")
    m = Ridge().fit(tr[["x"]], tr["y"])
    pd.DataFrame({{"id": te["id"], "y": m.predict(te[["x"]])}}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
    pools = {{p["internal_api"]: p["num_threads"] for p in threadpool_info()}}
    print(json.dumps({{"pools": pools, "extra": extra, "numpy": np.__version__}}))
    """
    res = run(sb, code, data, FAST.replace(threads=2, cpus=2))
    assert res.status == "ok", res.stderr_tail
    out = json.loads(res.stdout_tail)
    assert out["numpy"] == libs["numpy"]
    assert out["pools"] and all(n <= 2 for n in out["pools"].values())
    for name in {"xgboost", "lightgbm"} & set(libs):
        assert out["extra"][name] == libs[name]
    import pandas as pd

    sub = pd.read_csv(res.submission)
    assert list(sub.columns) == ["id", "y"] and len(sub) == 20


@pytest.mark.parametrize("cgroups", ["auto", False])
def test_resources_are_measured(sandboxes, data, cgroups):
    for name in ("bwrap", "subprocess"):
        if name == "bwrap" and shutil.which("bwrap") is None:
            continue
        sb = sandboxes(name, cgroups=cgroups)
        code = "import time\nx = b'x' * (150 << 20)\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
        res = run(sb, code, data)
        assert res.status == "ok", res
        r = res.resources
        assert 150 <= r.peak_rss_mb < 250, (name, r)
        assert 0.5 <= r.cpu_s < 3.0, (name, r)
        assert r.wall_s >= 0.5
        if sb.cgroup_support is not None:
            assert 150 <= r.peak_memory_mb < 300 and r.max_tasks >= 2
        else:
            assert r.peak_memory_mb is None


def test_work_dir_is_fresh_each_time(sb, data):
    first = run(
        sb,
        "open('left_behind.txt', 'w').write('x')\nimport os, tempfile\nopen(os.path.join(tempfile.gettempdir(), 't.txt'), 'w').write('y')",
        data,
    )
    assert first.status == "ok"
    second = run(
        sb,
        "import os, tempfile\nprint(sorted(os.listdir('.')), sorted(os.listdir(tempfile.gettempdir())))",
        data,
    )
    assert second.stdout_tail.strip() == f"[] {sb.tmp_mount_points()}"


def test_gpu_request(sb, data):
    lim = FAST.replace(gpu=(0,))
    res = run(sb, "import os\nprint(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))", data, lim)
    if sb.name == "subprocess":
        assert res.status == "ok" and res.stdout_tail.strip() == "'0'"
        assert any("GPU" in w for w in res.warnings)
    elif not glob.glob("/dev/nvidia[0-9]*"):
        assert res.status == "harness_error" and "GPU" in res.reason
    no_gpu = run(sb, "import os\nprint(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))", data)
    assert no_gpu.stdout_tail.strip() == "''"


# -- the pool ------------------------------------------------------------------------------------


def test_pool_runs_slots_concurrently(sandboxes, data):
    sb = sandboxes("subprocess")
    code = "import time\ntime.sleep(1.5)\nprint('done')"
    with SandboxPool(sb, slots=2) as pool:
        t0 = time.monotonic()
        results = pool.map([{"code": code + f"# {i}", "data_dir": data, "limits": FAST} for i in range(2)])
        elapsed = time.monotonic() - t0
    assert [r.status for r in results] == ["ok", "ok"]
    # In series they would take at least 3 s.
    assert elapsed < 2.7, f"two 1.5-s executions on 2 slots took {elapsed:.2f} s"


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_pool_cache_returns_independent_copies(sandboxes, data, tmp_path, store):
    sb = sandboxes("subprocess")
    cache = "memory" if store == "memory" else tmp_path / "cache"
    code = "import os, random\nprint(random.random())\nopen(os.environ['SUBMISSION_PATH'], 'w').write('id,y\\n1,2\\n')"
    with SandboxPool(sb, slots=1, cache=cache) as pool:
        first = pool.run(code, data, FAST, task_id="t1")
        hit = pool.run(code, data, FAST, task_id="t1")
        assert not first.cached and hit.cached
        assert hit.stdout_tail == first.stdout_tail  # same run, not re-executed
        assert hit.submission != first.submission and hit.submission.read_text() == "id,y\n1,2\n"
        # Corrupting what a caller got must not corrupt the cache.
        hit.submission.write_text("garbage")
        hit.warnings.append("mine")
        first.submission.unlink()
        again = pool.run(code, data, FAST, task_id="t1")
        assert again.submission.read_text() == "id,y\n1,2\n" and "mine" not in again.warnings
        other = pool.run(code, data, FAST.replace(wall_time_s=19), task_id="t1")
        assert not other.cached and other.stdout_tail != first.stdout_tail
        assert pool.hits == 2 and pool.misses == 2
    if store == "disk":
        with SandboxPool(sb, cache=cache) as fresh_pool:
            persisted = fresh_pool.run(code, data, FAST, task_id="t1")
        assert persisted.cached and persisted.stdout_tail == first.stdout_tail


def test_pool_does_not_cache_harness_errors_and_dedupes_inflight(tmp_path, data):
    broken = make_sandbox("bwrap", bwrap=str(tmp_path / "missing-bwrap"), output_root=tmp_path / "o")
    with SandboxPool(broken, cache="memory") as pool:
        assert pool.run("print(1)", data, FAST, task_id="t").status == "harness_error"
        assert pool.run("print(1)", data, FAST, task_id="t").status == "harness_error"
        assert pool.misses == 2 and pool.hits == 0
    sb = make_sandbox("subprocess", output_root=tmp_path / "o2")
    code = "import time, random, os\ntime.sleep(0.5)\nprint(random.random())\nopen(os.environ['SUBMISSION_PATH'], 'w').write('a')"
    with SandboxPool(sb, slots=2, cache="memory") as pool:
        futures = [pool.submit(code, data, FAST, task_id="same") for _ in range(3)]
        results = [f.result() for f in futures]
    assert pool.misses == 1 and pool.hits == 2
    assert len({r.stdout_tail for r in results}) == 1
    assert len({r.submission for r in results}) == 3


def test_concurrent_runs_on_one_sandbox_are_independent(sb, data):
    out: dict[int, ExecutionResult] = {}

    def go(i: int) -> None:
        out[i] = run(
            sb, f"import os\nprint({i})\nopen(os.environ['SUBMISSION_PATH'], 'w').write('{i}')", data
        )

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert (
            out[i].status == "ok"
            and out[i].stdout_tail == f"{i}\n"
            and out[i].submission.read_text() == str(i)
        )


def test_no_cgroups_left_behind(sandboxes):
    """Every execution's cgroup is removed afterwards."""
    pid = os.getpid()
    leftovers = glob.glob(f"/sys/fs/cgroup/**/wmrl-sandbox-{pid}-*", recursive=True)
    assert leftovers == []
