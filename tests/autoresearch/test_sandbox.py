"""Real executions through every local backend: the solution's contract, statuses, resources, the pool.

Each backend runs for real (bubblewrap where installed, plain subprocess everywhere); Docker
tests need an engine and skip without one. Attacks live in ``test_redteam.py``.
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

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), "subprocess"]
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
    assert set(env) - {"PWD", "SHLVL", "_", "LC_CTYPE", "WMRL_SANDBOX_EXECUTION"} <= ALLOWED_ENV
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
    assert res.isolated is (sb.name == "bwrap")
    assert res.backend == sb.name and res.limits == FAST
    assert res.resources.wall_s > 0 and res.resources.cpu_s > 0 and res.resources.peak_rss_mb > 5
    if sb.name == "subprocess":
        assert any("NO ISOLATION" in w for w in res.warnings)


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


@pytest.mark.docker
def test_docker_backend_runs_a_solution(data, tmp_path):
    sb = make_sandbox("docker", output_root=tmp_path / "out")
    res = run(
        sb,
        "import os\nprint(sorted(os.listdir(os.environ['DATA_DIR'])))\nopen(os.environ['SUBMISSION_PATH'], 'w').write('id,y\\n')",
        data,
    )
    if res.status == "harness_error" and "image" in (res.reason or ""):
        pytest.skip(res.reason)
    assert res.status == "ok", res
    assert res.isolated and res.submission.read_text() == "id,y\n"
    net = run(sb, "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)", data)
    assert net.status == "error"
    slow = run(sb, "while True: pass", data, FAST.replace(wall_time_s=1))
    assert slow.status == "timeout"


def test_no_cgroups_left_behind(sandboxes):
    """Every execution's cgroup is removed afterwards."""
    pid = os.getpid()
    leftovers = glob.glob(f"/sys/fs/cgroup/**/wmrl-sandbox-{pid}-*", recursive=True)
    assert leftovers == []


class _FakeDockerClient:
    """A stand-in for ``docker.DockerClient``, because no Docker engine can run on the development
    machine. It implements only what DockerSandbox calls (``images.get``, ``containers.create``,
    ``start``, ``logs``, ``wait``, ``kill``, ``reload``, ``attrs``, ``remove``) by running the
    container's command -- the real launcher and the real solution -- as a local process, with the
    container paths of its volumes and tmpfs mounts translated to host folders. It isolates
    nothing: it exercises the backend's host side (frames over ``logs``, status, kill, cleanup)."""

    def __init__(self, root: Path) -> None:
        import docker

        self.root = root
        self.created: list = []
        client = self

        class Images:
            def get(self, name):
                if name != "debian:bookworm-slim":
                    raise docker.errors.ImageNotFound(f"No such image: {name}")

        class Containers:
            def create(self, **kw):
                c = _FakeContainer(kw, client.root / f"c{len(client.created)}")
                client.created.append(c)
                return c

        self.images, self.containers = Images(), Containers()


class _FakeContainer:
    def __init__(self, kw: dict, root: Path) -> None:
        self.kw, self.removed, self.proc = kw, False, None
        self.attrs = {"State": {"OOMKilled": False}}
        self.map = {spec["bind"]: host for host, spec in kw["volumes"].items()}
        for inside in kw["tmpfs"]:
            host = root / inside.strip("/").replace("/", "_")
            host.mkdir(parents=True)
            self.map[inside] = str(host)

    def _host(self, value: str) -> str:
        for inside in sorted(self.map, key=len, reverse=True):
            if value == inside or value.startswith(inside + "/"):
                return self.map[inside] + value[len(inside) :]
        return value

    def start(self) -> None:
        import subprocess

        cmd = self.kw["command"]
        cfg = json.loads(cmd[-1])
        for key in ("solution", "cwd", "submission_path"):
            cfg[key] = self._host(cfg[key])
        env = {k: self._host(v) for k, v in self.kw["environment"].items()}
        argv = [self._host(x) for x in cmd[:-1]] + [json.dumps(cfg)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cfg["cwd"]
        )

    def logs(self, stdout=True, stderr=True, stream=False, follow=False, tail="all"):
        if stream:
            assert stdout and not stderr and follow
            return iter(lambda: self.proc.stdout.read1(65536), b"")
        return self.proc.stderr.read()

    def wait(self, timeout=None):
        rc = self.proc.wait(timeout)
        return {"StatusCode": rc if rc >= 0 else 128 - rc, "Error": None}

    def kill(self):
        self.proc.kill()

    def reload(self):
        pass

    def remove(self, force=False):
        self.removed = True


def test_docker_backend_host_side_with_a_fake_engine(tmp_path, data):
    pytest.importorskip("docker")
    from wmrl.autoresearch.sandbox import DockerSandbox

    fake = _FakeDockerClient(tmp_path / "engine")
    sb = DockerSandbox(client=fake, output_root=tmp_path / "out")
    ok = run(
        sb,
        "import os\nprint(sorted(os.listdir(os.environ['DATA_DIR'])))\nopen(os.environ['SUBMISSION_PATH'], 'w').write('id,y\\n')",
        data,
    )
    assert ok.status == "ok", ok
    assert ok.stdout_tail.strip() == "['sample_submission.csv', 'test.csv', 'train.csv']"
    assert ok.submission.read_text() == "id,y\n" and ok.backend == "docker" and ok.isolated
    assert ok.resources.peak_rss_mb > 5 and ok.resources.wall_s > 0
    assert run(sb, "raise SystemExit(4)", data).exit_code == 4
    assert run(sb, "while True: pass", data, FAST.replace(wall_time_s=1)).status == "timeout"
    flood = run(sb, "while True: print('x' * 10000)", data, FAST.replace(output_bytes=100_000))
    assert flood.status == "killed" and "output" in flood.reason
    assert all(c.removed for c in fake.created) and len(fake.created) == 4
    assert not list((tmp_path / "out").glob(".stage-*"))
    missing = DockerSandbox(client=fake, image="no/such:image", output_root=tmp_path / "out2")
    res = run(missing, "print(1)", data)
    assert res.status == "harness_error" and "not present" in res.reason
