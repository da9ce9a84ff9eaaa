"""Unit tests of the sandbox's pure parts: limits, results, classification, framing, cgroups, docker kwargs.

Executions of real solutions are in ``test_sandbox.py``; attacks in ``test_redteam.py``.
"""

from __future__ import annotations

import json
import os
import signal
import struct
from pathlib import Path

import pytest

from wmrl.autoresearch.sandbox import (
    STATUSES,
    THREAD_ENV_VARS,
    CpuAllocator,
    ExecutionResult,
    Limits,
    Resources,
    available_libraries,
    cache_key,
    launcher,
    make_sandbox,
)
from wmrl.autoresearch.sandbox import cgroups as cg
from wmrl.autoresearch.sandbox.base import _parse_cpu_list, machine_cores
from wmrl.autoresearch.sandbox.supervisor import RawOutcome, Tail, _FrameReader, classify

# -- Limits ----------------------------------------------------------------------------------------


def test_limits_defaults_and_roundtrip():
    lim = Limits(wall_time_s=30, memory_mb=512, gpu=(0, 1))
    assert Limits.from_dict(lim.to_dict()) == lim
    assert lim.to_dict()["gpu"] == [0, 1]
    assert lim.memory_bytes == 512 * 2**20
    assert json.loads(lim.key()) == lim.to_dict()
    assert Limits(threads=3).thread_env() == dict.fromkeys(THREAD_ENV_VARS, "3")
    assert {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"} <= set(THREAD_ENV_VARS)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"wall_time_s": 0}, ValueError, "wall_time_s"),
        ({"wall_time_s": float("inf")}, ValueError, "wall_time_s"),
        ({"wall_time_s": "10"}, TypeError, "wall_time_s"),
        ({"memory_mb": 1.5}, TypeError, "memory_mb"),
        ({"memory_mb": 10}, ValueError, "memory_mb"),
        ({"max_processes": 2}, ValueError, "max_processes"),
        ({"threads": True}, TypeError, "threads"),
        ({"output_bytes": -1}, ValueError, "output_bytes"),
        ({"cpus": 0}, ValueError, "cpus"),
        ({"gpu": ()}, ValueError, "gpu"),
        ({"gpu": (0, 0)}, ValueError, "duplicate"),
        ({"gpu": (-1,)}, ValueError, "gpu"),
        ({"gpu": "all"}, TypeError, "gpu"),
    ],
)
def test_limits_reject_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        Limits(**kwargs)


def test_limits_reject_unknown_keys_and_are_frozen():
    with pytest.raises(ValueError, match="unknown keys"):
        Limits.from_dict({"wall_time_s": 5, "walltime": 5})
    with pytest.raises(TypeError):
        Limits(walltime=5)  # type: ignore[call-arg]
    lim = Limits()
    with pytest.raises(AttributeError):
        lim.wall_time_s = 1  # type: ignore[misc]
    assert lim.replace(wall_time_s=7).wall_time_s == 7
    with pytest.raises(ValueError):
        lim.replace(wall_time_s=-1)


def test_limits_effective_cpus():
    assert Limits(threads=4).effective_cpus(2) == 2
    assert Limits(threads=1).effective_cpus(8) == 1
    assert Limits(threads=1, cpus=3).effective_cpus(8) == 3


# -- results ---------------------------------------------------------------------------------------


def test_result_roundtrip_and_status_validation(tmp_path):
    res = ExecutionResult(
        status="killed",
        exit_code=-9,
        signal=9,
        submission=tmp_path / "s.csv",
        resources=Resources(wall_s=1.5, cpu_s=0.5, peak_rss_mb=30.0, peak_memory_mb=40.0, max_tasks=3),
        warnings=["w"],
        reason="memory",
        limits=Limits(gpu=(1,)),
    )
    again = ExecutionResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert again == res
    copy = res.copy()
    copy.warnings.append("x")
    copy.resources.wall_s = 99
    assert res.warnings == ["w"] and res.resources.wall_s == 1.5
    with pytest.raises(ValueError, match="status"):
        ExecutionResult(status="crashed")
    with pytest.raises(ValueError, match="unknown keys"):
        ExecutionResult.from_dict({"status": "ok", "colour": "red"})
    assert set(STATUSES) == {"ok", "error", "timeout", "killed", "harness_error"}


# -- classification (pure) ------------------------------------------------------------------------


def _outcome(
    wait_status=None,
    *,
    stderr=b"",
    timed_out=False,
    host_kill=None,
    oom=0,
    pids_hits=0,
    exit_info=True,
    harness_error=None,
):
    out = RawOutcome(stdout=Tail(1000), stderr=Tail(1000))
    out.stderr.add(stderr)
    out.host_kill = host_kill
    if exit_info:
        out.exit_info = {
            "wait_status": wait_status,
            "timed_out": timed_out,
            "submission": {"present": False},
            "harness_error": harness_error,
        }
    out.cgroup_stats = cg.CgroupStats(
        cpu_s=0.1, peak_memory_bytes=1, oom_kills=oom, pids_peak=1, pids_limit_hits=pids_hits
    )
    return out


def _exited(code):
    return code << 8


LIM = Limits(file_size_mb=8, disk_mb=16)


@pytest.mark.parametrize(
    ("outcome", "status", "reason_has", "exit_code"),
    [
        (_outcome(_exited(0)), "ok", None, 0),
        (_outcome(_exited(3)), "error", None, 3),
        (_outcome(_exited(1), stderr=b"Traceback...\nValueError: bad\n"), "error", None, 1),
        (_outcome(_exited(1), stderr=b"Traceback...\nMemoryError\n"), "killed", "memory", 1),
        (
            _outcome(
                _exited(1), stderr=b"numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8 GiB\n"
            ),
            "killed",
            "memory",
            1,
        ),
        (_outcome(_exited(1), stderr=b"OSError: [Errno 27] File too large\n"), "killed", "file size", 1),
        (_outcome(_exited(1), stderr=b"OSError: [Errno 28] No space left on device\n"), "killed", "disk", 1),
        (_outcome(signal.SIGSEGV), "killed", "SIGSEGV", -signal.SIGSEGV),
        (_outcome(signal.SIGKILL, oom=1), "killed", "memory", -signal.SIGKILL),
        (_outcome(signal.SIGXFSZ), "killed", "file size", -signal.SIGXFSZ),
        (_outcome(_exited(1), oom=1), "killed", "memory", 1),
        (_outcome(_exited(1), pids_hits=3), "killed", "process limit", 1),
        (_outcome(signal.SIGKILL, timed_out=True), "timeout", "wall time", None),
        (_outcome(None, host_kill=("output", "output limit: x")), "killed", "output", None),
        (_outcome(None, host_kill=("timeout", "wall time: host")), "timeout", "wall time", None),
        (_outcome(None, exit_info=False), "harness_error", "before the launcher reported", None),
        (_outcome(None, exit_info=False, oom=1), "killed", "memory", None),
        # Only the launcher's status pipe reports a harness failure (issue 10, hole 3): a solution
        # printing the launcher's old message and exiting 127 has failed, it is not "unknown".
        (
            _outcome(_exited(127), stderr=b"launcher: could not start the solution: FileNotFoundError()\n"),
            "error",
            None,
            127,
        ),
        (
            _outcome(_exited(127), harness_error="could not start the solution: FileNotFoundError()"),
            "harness_error",
            "could not start",
            None,
        ),
    ],
)
def test_classify(outcome, status, reason_has, exit_code):
    c = classify(outcome, LIM)
    assert c.status == status
    assert c.exit_code == exit_code
    if reason_has is None:
        assert c.reason is None
    else:
        assert reason_has in c.reason


def test_classify_spawn_error_is_harness_error():
    out = RawOutcome(spawn_error="could not start 'bwrap': No such file")
    c = classify(out, LIM)
    assert c.status == "harness_error" and "bwrap" in c.reason


def test_memory_heuristic_looks_only_at_the_last_line():
    # A solution that merely mentions MemoryError earlier and then fails otherwise is an error.
    out = _outcome(_exited(1), stderr=b"print: MemoryError happened once\nValueError: nope\n")
    assert classify(out, LIM).status == "error"


# -- output tail and frames -----------------------------------------------------------------------


def test_tail_keeps_only_the_end():
    t = Tail(10)
    for i in range(1000):
        t.add(str(i % 10).encode() * 7)
    assert t.total == 7000
    assert len(t.bytes()) == 10
    assert t.bytes() == b"888" + b"9" * 7
    t2 = Tail(4)
    t2.add(b"abcdef")
    t2.add(b"gh")
    assert t2.bytes() == b"efgh" and t2.total == 8
    assert len(t._buf) <= 20  # never grows past twice the tail


def _frame(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">cI", kind, len(payload)) + payload


def test_frame_reader_split_anywhere(tmp_path):
    stream = (
        _frame(launcher.KIND_STARTED, b'{"pid": 5, "pgid": 5}')
        + _frame(launcher.KIND_STDOUT, b"hello ")
        + _frame(launcher.KIND_STDERR, b"oops")
        + _frame(launcher.KIND_STDOUT, b"world")
        + _frame(launcher.KIND_SUBMISSION, b"id,y\n1,2\n")
        + _frame(
            launcher.KIND_EXIT,
            b'{"wait_status": 0, "timed_out": false, "submission": {"present": true, "bytes": 9}}',
        )
    )
    for step in (1, 3, 7, len(stream)):
        out = RawOutcome(stdout=Tail(100), stderr=Tail(100))
        dest = tmp_path / f"s{step}" / "submission.csv"
        r = _FrameReader(out, dest, submission_cap=100)
        for i in range(0, len(stream), step):
            r.feed(stream[i : i + step])
        r.close()
        assert out.stdout.bytes() == b"hello world" and out.stderr.bytes() == b"oops"
        assert out.started == {"pid": 5, "pgid": 5}
        assert out.exit_info["wait_status"] == 0
        assert dest.read_bytes() == b"id,y\n1,2\n"
        assert out.protocol_error is None


def test_frame_reader_caps_submission_and_rejects_garbage(tmp_path):
    out = RawOutcome(stdout=Tail(10), stderr=Tail(10))
    r = _FrameReader(out, tmp_path / "x" / "s.csv", submission_cap=5)
    r.feed(_frame(launcher.KIND_SUBMISSION, b"123") + _frame(launcher.KIND_SUBMISSION, b"456"))
    assert out.submission_over_cap
    with pytest.raises(ValueError, match="unknown"):
        r.feed(_frame(b"Z", b""))
    r.close()


# -- launcher config checking ---------------------------------------------------------------------


def test_launcher_rejects_bad_config(capsys):
    assert launcher.main(["launcher.py"]) == launcher.EXIT_CODE_BAD_CONFIG
    assert launcher.main(["launcher.py", "{not json"]) == launcher.EXIT_CODE_BAD_CONFIG
    assert launcher.main(["launcher.py", json.dumps({"python": "x"})]) == launcher.EXIT_CODE_BAD_CONFIG
    assert "bad configuration" in capsys.readouterr().err


# -- CPU allocation ---------------------------------------------------------------------------------


def test_cpu_allocator_spreads_concurrent_executions():
    alloc = CpuAllocator([0, 1, 2, 3])
    a = alloc.acquire(1)
    b = alloc.acquire(1)
    c = alloc.acquire(2)
    assert a != b and not set(c) & (set(a) | set(b))
    alloc.release(a)
    assert alloc.acquire(1) == a
    assert len(alloc.acquire(99)) == 4


def test_cpu_allocator_restricted_to_named_cores():
    alloc = CpuAllocator([0, 1])
    alloc.restrict([1])
    assert alloc.cores == [1] and alloc.acquire(2) == [1]
    with pytest.raises(RuntimeError, match="while executions hold"):
        alloc.restrict([0])
    alloc.release([1])
    with pytest.raises(ValueError, match="distinct"):
        alloc.restrict([])
    with pytest.raises(ValueError, match="distinct"):
        alloc.restrict([0, 0])
    with pytest.raises(ValueError, match="not cores this machine lets"):
        alloc.restrict([max(machine_cores()) + 5])
    assert alloc.cores == [1]  # a refused change leaves the allocator as it was


# -- cgroups ------------------------------------------------------------------------------------------


def test_cgroup_detection_matches_the_host():
    support = cg.detect()
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root (or a delegated v2 subtree) here")
    if support is None:
        pytest.skip("no writable cgroup hierarchy with memory+pids on this host")
    group = cg.ExecutionCgroup(support, memory_bytes=64 * 2**20, max_tasks=16)
    try:
        assert group.pids() == []
        dirs = list(group.dirs.values())
        assert all(d.is_dir() for d in dirs)
        if support.version == 1:
            assert int((group.dirs["memory"] / "memory.limit_in_bytes").read_text()) == 64 * 2**20
            assert (group.dirs["pids"] / "pids.max").read_text().strip() == "16"
        stats = group.stats()
        assert stats.oom_kills == 0 and stats.pids_limit_hits == 0
    finally:
        group.remove()
    assert not any(d.exists() for d in dirs)


# -- libraries and backends -----------------------------------------------------------------------


def test_available_libraries_reports_the_core_stack():
    libs = available_libraries()
    for name in ("numpy", "pandas", "scipy", "sklearn"):
        assert name in libs and libs[name][0].isdigit()


def test_make_sandbox_rejects_unknown_backend_and_options(tmp_path):
    with pytest.raises(ValueError, match="backend"):
        make_sandbox("firejail")
    with pytest.raises(TypeError, match="no backend takes"):
        make_sandbox("subprocess", colour="red")
    with pytest.raises(TypeError, match="does not take"):
        make_sandbox("subprocess", image="debian")


def test_missing_bwrap_is_a_harness_error(tmp_path):
    sb = make_sandbox("bwrap", bwrap=str(tmp_path / "no-such-bwrap"))
    assert sb.problem
    (tmp_path / "d").mkdir()
    res = sb.run("print(1)", tmp_path / "d")
    assert res.status == "harness_error" and res.reason and res.exit_code is None


def test_run_rejects_caller_mistakes(tmp_path):
    sb = make_sandbox("subprocess")
    with pytest.raises(TypeError, match="code"):
        sb.run(b"print(1)", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data_dir"):
        sb.run("print(1)", tmp_path / "missing")


def test_cache_key_changes_with_each_component():
    base = cache_key("t", "print(1)", Limits(), "bwrap")
    assert base == cache_key("t", "print(1)", Limits(), "bwrap")
    assert base != cache_key("u", "print(1)", Limits(), "bwrap")
    assert base != cache_key("t", "print(2)", Limits(), "bwrap")
    assert base != cache_key("t", "print(1)", Limits(wall_time_s=1), "bwrap")
    assert base != cache_key("t", "print(1)", Limits(), "subprocess")


def test_docker_create_kwargs_use_docker_py_types(tmp_path):
    """The Docker seam, checked against docker-py's real types (the engine tests run it for real)."""
    pytest.importorskip("docker")
    from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

    from wmrl.autoresearch.sandbox import DockerSandbox
    from wmrl.autoresearch.sandbox.users import SandboxUser

    sb = DockerSandbox(client=object())
    if sb.solution_env is None:
        pytest.skip(sb.problem)
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "solution.py").write_text("print(1)")
    data = tmp_path / "data"
    data.mkdir()
    lim = Limits(memory_mb=512, max_processes=64, threads=2, disk_mb=100, gpu=(0, 2))
    user = SandboxUser(262150, 262150)
    kw = sb._create_kwargs(
        stage=stage, data_dir=data, limits=lim, execution_id="abc", user=user, cpus=[0, 1], image="img"
    )
    assert kw["network_mode"] == "none" and kw["read_only"] is True and kw["cap_drop"] == ["ALL"]
    assert kw["init"] is False  # the launcher must be PID 1
    assert kw["user"] == "262150:262150"  # never root (issue 10, hole 1)
    assert kw["mem_limit"] == kw["memswap_limit"] == 512 * 2**20
    assert kw["pids_limit"] == 64 and kw["nano_cpus"] == 2_000_000_000 and kw["cpuset_cpus"] == "0,1"
    assert kw["volumes"][str(data)] == {"bind": "/sandbox/data", "mode": "ro"}
    assert kw["volumes"][str(sb.solution_env.path)] == {"bind": "/opt/solution-env", "mode": "ro"}
    assert all(v["mode"] == "ro" for v in kw["volumes"].values())
    assert not any(v.startswith(str(Path(__file__).parents[2])) for v in kw["volumes"])  # no checkout path
    mounts = {m["Target"]: m for m in kw["mounts"]}
    assert all(isinstance(m, Mount) for m in kw["mounts"]) and set(mounts) == {
        "/sandbox/work",
        "/tmp",
        "/dev/pts",
    }
    assert mounts["/sandbox/work"]["TmpfsOptions"]["SizeBytes"] == 100 * 2**20
    assert mounts["/dev/pts"]["ReadOnly"] is True  # no pseudo-terminals (issue 35)
    assert isinstance(kw["log_config"], LogConfig) and kw["log_config"]["Type"] == "none"
    assert all(isinstance(u, Ulimit) for u in kw["ulimits"])
    (req,) = kw["device_requests"]
    assert (
        isinstance(req, DeviceRequest) and req["DeviceIDs"] == ["0", "2"] and req["Capabilities"] == [["gpu"]]
    )
    env = kw["environment"]
    assert env["DATA_DIR"] == "/sandbox/data" and env["OMP_NUM_THREADS"] == "2"
    cfg = json.loads(kw["command"][-1])
    assert (
        cfg["submission_path"] == env["SUBMISSION_PATH"] and cfg["python"] == "/opt/solution-env/bin/python"
    )
    assert bytes.fromhex(cfg["seccomp"])  # the launcher's filter, stacked on Docker's profile
    kw_cpu = sb._create_kwargs(
        stage=stage, data_dir=data, limits=Limits(), execution_id="abc", user=user, cpus=[0], image="img"
    )
    assert "device_requests" not in kw_cpu and kw_cpu["environment"]["CUDA_VISIBLE_DEVICES"] == ""
    assert Path(kw["command"][3]).name == "launcher.py"


def test_stale_cgroups_of_dead_owners_are_removed():
    import subprocess

    support = cg.detect()
    if support is None:
        pytest.skip("no writable cgroup hierarchy with memory+pids on this host")
    done = subprocess.Popen(["true"])
    done.wait()
    made = []
    for parent in support.parents.values():
        d = parent / f"wmrl-sandbox-{done.pid}-0-1"
        d.mkdir()
        made.append(d)
    mine = cg.ExecutionCgroup(support, memory_bytes=64 * 2**20, max_tasks=8)  # owner alive: kept
    try:
        assert cg.remove_stale(support) >= len(made)
        assert not any(d.exists() for d in made)
        assert all(d.exists() for d in mine.dirs.values())
    finally:
        mine.remove()


def test_cpu_lists_parse_as_the_kernel_writes_them():
    assert _parse_cpu_list("0-3,5\n") == {0, 1, 2, 3, 5}
    assert _parse_cpu_list("7") == {7} and _parse_cpu_list("") == set()
    assert machine_cores() >= set(os.sched_getaffinity(0))
