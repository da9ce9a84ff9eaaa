"""Red team, round two (issue 10): the five holes and their neighbours, on every backend here.

1. the sandbox must not be host root: ``/proc/sys`` read-only, keyrings out of reach, per-user
   kernel quotas charged to a sandbox user, no signals to host processes;
2. (test labels inside the libraries: ``test_label_recovery.py``);
3. a solution cannot turn its own failure into a ``harness_error`` (grade "unknown");
4. big and sparse submissions cost the trusted side a bounded amount;
5. CPU pinning holds, staged public data cannot be poisoned, host paths stay out of the mount table.

Every backend runs for real: bubblewrap, Docker (CI starts an engine) and the subprocess backend
where the attack applies to it (it stays unisolated, but must not harm the host's root or later
isolated runs).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from wmrl.autoresearch.sandbox import Limits

REPO = Path(__file__).resolve().parents[2]
LIMITS = Limits(wall_time_s=20, memory_mb=1024, max_processes=64, threads=1, disk_mb=64, file_size_mb=64)
ALL = [
    pytest.param("bwrap", marks=pytest.mark.bwrap),
    pytest.param("docker", marks=pytest.mark.docker),
    "subprocess",
]
ISOLATING = ALL[:2]


@pytest.fixture(params=ALL)
def sb(request, sandboxes):
    return sandboxes(request.param)


@pytest.fixture(params=ISOLATING)
def isolating(request, sandboxes):
    return sandboxes(request.param)


@pytest.fixture
def data(tmp_path) -> Path:
    d = tmp_path / "public"
    d.mkdir()
    (d / "train.csv").write_text("id,x,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(30)))
    (d / "test.csv").write_text("id,x\n" + "".join(f"{i},{i % 3}\n" for i in range(100, 110)))
    (d / "sample_submission.csv").write_text("id,y\n" + "".join(f"{i},0\n" for i in range(100, 110)))
    return d


def run(sb, code: str, data: Path, limits: Limits = LIMITS):
    return sb.run(textwrap.dedent(code), data, limits)


def as_root() -> bool:
    return os.geteuid() == 0


# -- hole 1: the sandbox is not host root ------------------------------------------------------------

PROC_SYS = """
import json
out = {}
for p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/swappiness", "/proc/sys/kernel/hostname",
          "/proc/sys/fs/inotify/max_user_instances", "/proc/sysrq-trigger"):
    try:
        with open(p, "w") as f:
            f.write("")
        out[p] = "opened for writing"
    except OSError as e:
        out[p] = type(e).__name__
print(json.dumps(out))
"""


def test_proc_sys_is_not_writable(sb, data):
    """Regression (hole 1): as host root, /proc/sys/kernel/core_pattern opened for writing inside
    bubblewrap -- code execution as root at the next crash on the host."""
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    res = run(sb, PROC_SYS, data)
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    assert "opened for writing" not in seen.values(), seen
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def _host_uids_of(marker: str, seconds: float) -> set[int]:
    """Real host uids of the processes whose command line holds ``marker``, seen while they run."""
    seen: set[int] = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("Uid:"):
                        seen.add(int(line.split()[1]))
            except OSError:
                continue
        time.sleep(0.05)
    return seen


def _marked_sleeper(marker: str, seconds: float) -> str:
    """A solution that re-executes itself with ``marker`` in its command line, then sleeps."""
    return (
        "import os, sys, time\n"
        f"if sys.argv[-1] != {marker!r}:\n"
        f"    os.execv(sys.executable, [sys.executable, sys.argv[0], {marker!r}])\n"
        f"time.sleep({seconds})\n"
    )


def _watch(sb, data, markers: list[str]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    runs = [threading.Thread(target=run, args=(sb, _marked_sleeper(m, 2.5), data)) for m in markers]
    for t in runs:
        t.start()
    watchers = [
        threading.Thread(target=lambda m=m: found.__setitem__(m, _host_uids_of(m, 2.0))) for m in markers
    ]
    for t in watchers:
        t.start()
    for t in [*runs, *watchers]:
        t.join()
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root trainer has a root to protect from")
def test_solution_is_not_host_root(sb, data):
    """Regression (hole 1): the solution's uid mapped to host uid 0 under bubblewrap."""
    marker = f"WMRL-UID-{uuid.uuid4().hex}"
    uids = _watch(sb, data, [marker])[marker]
    assert uids and 0 not in uids, uids


@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated users need a root trainer")
def test_concurrent_executions_get_different_host_users(sb, data):
    """Per-user kernel quotas (inotify, keys, processes) are per execution, not shared."""
    markers = [f"WMRL-UID-{uuid.uuid4().hex}" for _ in range(2)]
    found = _watch(sb, data, markers)
    a, b = (found[m] for m in markers)
    assert len(a) == 1 and len(b) == 1 and a != b, found


KEYRING_WRITE = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
SYS_add_key, SYS_keyctl, SYS_request_key = 248, 250, 249
KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING = -4, -3
out = {}
for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING):
    out[str(ring)] = libc.syscall(SYS_add_key, b"user", b"NAME", b"rollout-secret", 14, ring)
out["errno"] = ctypes.get_errno()
out["keyctl"] = libc.syscall(SYS_keyctl, 0, -4, 0)  # KEYCTL_GET_KEYRING_ID
out["proc_keys"] = open("/proc/keys").read()
print(json.dumps(out))
"""


def test_kernel_keyrings_are_no_channel_between_rollouts(sb, data):
    """Regression (hole 1): one run added a key that a later run on another task read."""
    name = f"wmrl-rt-{uuid.uuid4().hex[:12]}"
    first = run(sb, KEYRING_WRITE.replace("NAME", name), data)
    assert first.status == "ok", first
    seen = json.loads(first.stdout_tail)
    assert seen["-4"] == -1 and seen["-3"] == -1 and seen["keyctl"] == -1, seen  # seccomp: EPERM
    second = run(sb, "print(open('/proc/keys').read())", data)
    assert name not in second.stdout_tail
    assert name not in Path("/proc/keys").read_text()


def test_host_roots_keys_are_not_visible(sb, data):
    libc = ctypes.CDLL(None, use_errno=True)
    name = f"wmrl-host-{uuid.uuid4().hex[:12]}".encode()
    serial = libc.syscall(248, b"user", name, b"host-secret", 11, -4)  # add_key to root's @u
    if serial < 0:
        pytest.skip("this host refuses add_key to the test itself")
    try:
        res = run(sb, "print(open('/proc/keys').read())", data)
        assert res.status == "ok", res
        assert name.decode() not in res.stdout_tail
    finally:
        libc.syscall(250, 3, serial)  # KEYCTL_REVOKE


def _inotify_instances_free() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


INOTIFY_HOG = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while True:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
print(len(held), flush=True)
time.sleep(3)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the per-user quota belongs to root only when we are root")
def test_a_solution_exhausting_inotify_does_not_starve_host_root(sb, data):
    """Neighbour (hole 1): per-user counters are charged to the sandbox user, not to root. Since
    round three the filter refuses inotify altogether (a watch on a shared inode sees other
    rollouts' accesses), so the hog holds none."""
    assert _inotify_instances_free()
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", run(sb, INOTIFY_HOG, data)))
    worker.start()
    time.sleep(2.0)  # the solution holds every instance its user may have
    free_during = _inotify_instances_free()
    worker.join()
    assert result["r"].status == "ok", result["r"]
    assert int(result["r"].stdout_tail.split()[0]) == 0  # refused by the seccomp filter
    assert free_during, "host root could not create an inotify instance while the solution ran"


DENIED = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {
    "ptrace_traceme": (101, 0, 0, 0, 0),
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "bpf": (321, 0, 0, 0),
    "userfaultfd": (323, 0),
    "io_uring_setup": (425, 1, 0),
    "unshare_newns": (272, 0x00020000),
    "unshare_newuser": (272, 0x10000000),
    "mount": (165, 0, 0, 0, 0, 0),
    "keyctl": (250, 0, -4, 0),
    "process_vm_readv": (310, 1, 0, 0, 0, 0, 0),
}
out = {}
for name, (nr, *args) in calls.items():
    rc = libc.syscall(nr, *args)
    out[name] = [rc, ctypes.get_errno()]
    if rc >= 0 and name in ("perf_event_open", "bpf", "userfaultfd", "io_uring_setup"):
        os.close(rc)
# A thread and a fork still work.
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(out))
"""


def test_seccomp_refuses_the_dangerous_calls(sb, data):
    res = run(sb, DENIED, data)
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    assert seen.pop("fork") == 7
    for name, (rc, err) in seen.items():
        assert rc == -1, (name, rc, err)
        assert err in (1, 38), (name, err)  # EPERM (or ENOSYS for clone3-like fallbacks)


@pytest.mark.skipif(
    os.geteuid() != 0, reason="a root trainer's processes are what a root solution could kill"
)
def test_subprocess_solution_cannot_signal_host_processes(sandboxes, data):
    """Neighbour (hole 1) on the unisolated backend: as root it could kill any host process."""
    sb = sandboxes("subprocess")
    canary = subprocess.Popen(["sleep", "60"])
    try:
        code = f"""
        import os, signal
        try:
            os.kill({canary.pid}, signal.SIGKILL)
            print("killed")
        except PermissionError:
            print("refused")
        """
        res = run(sb, code, data)
        assert res.stdout_tail.strip() == "refused", res
        assert canary.poll() is None
    finally:
        canary.kill()
        canary.wait()


# -- hole 3: a failure cannot be turned into "unknown" -------------------------------------------------

FAKE_HARNESS_ERRORS = [
    # The launcher's old message for a failed exec, and its exit code.
    "import sys\nsys.stderr.write('launcher: could not start the solution: FileNotFoundError()\\n')\nsys.exit(127)",
    # The launcher's bad-configuration and the cgroup trampoline's exit codes.
    "import sys\nsys.stderr.write('launcher: bad configuration: KeyError()\\n')\nsys.exit(96)",
    "import os\nos._exit(97)",
    # Forged frames on its own stdout: they are data inside an "o" frame, not frames.
    "import sys, struct, json\n"
    "p = json.dumps({'harness_error': 'forged', 'wait_status': 0}).encode()\n"
    "sys.stdout.buffer.write(struct.pack('>cI', b'x', len(p)) + p)\nsys.stdout.flush()\nraise SystemExit(5)",
    # Writing to every descriptor it might have inherited (the status pipe is not one of them).
    "import os\nfor fd in range(3, 256):\n    try:\n        os.write(fd, b'could not start the solution')\n    except OSError:\n        pass\nraise SystemExit(6)",
]


@pytest.mark.parametrize(
    "code", FAKE_HARNESS_ERRORS, ids=["exec127", "config96", "cgroup97", "frames", "fds"]
)
def test_a_solution_cannot_fake_a_harness_error(sb, data, code):
    """Regression (hole 3): exit code 127 + the launcher's text in stderr made a harness error."""
    res = run(sb, code, data)
    assert res.status == "error", res
    assert res.exit_code not in (None, 0)


def test_a_fake_harness_error_is_graded_as_a_failure_and_cached(tmp_path, sandboxes):
    """Through the grader and a caching pool: graded ``runtime_error`` (a reward, not None), and
    cached like any failure, so re-running it cannot fish for a lucky outcome."""
    from wmrl.autoresearch.grading.grader import ExecutionGrader
    from wmrl.autoresearch.sandbox import SandboxPool
    from wmrl.autoresearch.tasks.toy import make_toy_task

    task = make_toy_task(tmp_path / "tasks")
    with SandboxPool(sandboxes("subprocess"), cache="memory") as pool:
        grader = ExecutionGrader(sandbox=pool)
        first = grader.grade(task, FAKE_HARNESS_ERRORS[0])
        again = grader.grade(task, FAKE_HARNESS_ERRORS[0])
    assert first.status == "runtime_error" and first.reward is not None
    assert again.cached and again.status == "runtime_error"


def test_a_submission_that_breaks_the_grader_is_its_own_fault(tmp_path, monkeypatch):
    """Neighbour (hole 3) on the trusted side: an unexpected exception while grading a submission
    is blamed on it when the task's sample submission grades; only a grader that cannot grade its
    own sample is a harness error."""
    import wmrl.autoresearch.grading.grader as grader_module
    from wmrl.autoresearch.grading.grader import ExecutionGrader
    from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task

    task = make_toy_task(tmp_path / "tasks")
    real = grader_module.score_submission

    def fragile(path, task_, answers=None):
        if path is not None and "BOOM" in Path(path).read_text():
            raise ZeroDivisionError("a grader bug this submission found")
        return real(path, task_, answers)

    monkeypatch.setattr(grader_module, "score_submission", fragile)
    boom = TOY_SOLUTION + "\nopen(os.environ['SUBMISSION_PATH'], 'a').write('BOOM')\n"
    grader = ExecutionGrader(backend="subprocess")
    got = grader.grade(task, "import os\n" + boom)
    assert (
        got.status == "invalid_submission" and got.reward is not None and got.submission_error == "ungradable"
    )
    monkeypatch.setattr(grader_module, "score_submission", lambda *a, **k: 1 / 0)
    broken = ExecutionGrader(backend="subprocess").grade(task, "import os\n" + boom)
    assert broken.status == "harness_error" and broken.reward is None


# -- hole 4: big submissions ----------------------------------------------------------------------------

SPARSE = """
import os
with open(os.environ["SUBMISSION_PATH"], "wb") as f:
    f.write(b"id,y\\n")
    f.truncate({size})
"""


def test_sparse_submission_is_refused_before_copying(sb, data):
    """Regression (hole 4): a sparse file costs the solution nothing and the host a real copy."""
    res = run(sb, SPARSE.format(size=48 << 20), data)
    assert res.status == "ok", res
    assert res.submission is None and "sparse" in (res.submission_error or ""), res
    leftovers = [p for p in sb.output_root.rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]
    assert leftovers == []


def test_over_cap_submission_is_refused_before_copying(sb, data):
    code = "import os\nopen(os.environ['SUBMISSION_PATH'], 'wb').write(b'x' * (3 << 20))"
    res = run(sb, code, data, LIMITS.replace(submission_mb=2))
    assert res.status == "ok"
    assert res.submission is None and "limit" in res.submission_error
    assert not any(p.is_file() and p.stat().st_size > 1 << 20 for p in sb.output_root.rglob("*"))


MEASURE = """
import json, resource, sys, time
from pathlib import Path
from wmrl.autoresearch.grading.validation import SubmissionError, validate_submission
from wmrl.autoresearch.tasks.suite import load_bundled_dir
task = load_bundled_dir(Path(sys.argv[1]))
t0 = time.monotonic()
try:
    validate_submission(sys.argv[2], task)
    code = "valid"
except SubmissionError as e:
    code = e.code
print(json.dumps({"code": code, "s": time.monotonic() - t0,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _measure(task_dir: Path, submission: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(task_dir), str(submission)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_grader_memory_is_bounded_by_the_task_not_the_submission(tmp_path):
    """Regression (hole 4): 12 million rows (132 MB) drove the grader to 1.8 GB and 10 s."""
    from wmrl.autoresearch.tasks.toy import make_toy_task

    task = make_toy_task(tmp_path / "tasks", n_test=9)
    baseline = _measure(task.public_dir.parent, task.sample_submission_path)
    big = tmp_path / "big.csv"
    with open(big, "w") as f:
        f.write("id,y\n")
        block = "".join(f"{i},0.5\n" for i in range(100_000))
        for _ in range(120):
            f.write(block)
    assert big.stat().st_size > 100 << 20
    got = _measure(task.public_dir.parent, big)
    assert got["code"] == "unreadable" and got["s"] < 1.0, got
    assert got["rss_mb"] < baseline["rss_mb"] + 50, (got, baseline)
    # Within the size limit but far too many rows: read up to 2n+1 rows, then refused.
    many = tmp_path / "many.csv"
    many.write_text("id,y\n" + "".join(f"{i},0.5\n" for i in range(60_000)))
    got = _measure(task.public_dir.parent, many)
    assert got["code"] == "wrong_row_count" and got["s"] < 1.0, got
    assert got["rss_mb"] < baseline["rss_mb"] + 50, (got, baseline)


def test_grader_deletes_submission_copies_and_never_caches_invalid_bytes(tmp_path, sandboxes):
    """Regression (hole 4): copies stayed until the process exited; the cache held their bytes."""
    from wmrl.autoresearch.grading.grader import ExecutionGrader
    from wmrl.autoresearch.sandbox import SandboxPool
    from wmrl.autoresearch.tasks.toy import TOY_SOLUTION, make_toy_task

    task = make_toy_task(tmp_path / "tasks")
    sb = sandboxes("subprocess")
    garbage = "import os\nopen(os.environ['SUBMISSION_PATH'], 'w').write('id,y\\n' + 'x,1\\n' * 500)\n"
    with SandboxPool(sb, cache="memory") as pool:
        grader = ExecutionGrader(sandbox=pool)
        bad = grader.grade(task, garbage)
        good = grader.grade(task, TOY_SOLUTION)
        bad_again = grader.grade(task, garbage)
        stored = {k: len(sub or b"") for k, (_, sub) in pool._memory.items()}
    assert bad.status == "invalid_submission" and good.status == "valid"
    assert bad_again.cached and bad_again.status == "invalid_submission"
    assert bad_again.submission_error == bad.submission_error and bad_again.reason == bad.reason
    assert sorted(stored.values())[0] == 0  # the invalid entry holds no bytes
    assert not list(sb.output_root.rglob("submission.csv")), "a submission copy outlived its grading"


# -- hole 5: CPUs, staged data, mount table ----------------------------------------------------------------

REPIN = """
import json, os
before = sorted(os.sched_getaffinity(0))
try:
    os.sched_setaffinity(0, range(os.cpu_count()))
    how = "set"
except OSError as e:
    how = e.errno
print(json.dumps({"before": before, "after": sorted(os.sched_getaffinity(0)), "how": how}))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="pinning needs two cores to be observable")
def test_cpu_pinning_cannot_be_undone(sb, data):
    """Regression (hole 5): the solution re-pinned itself onto every core."""
    res = run(sb, REPIN, data, LIMITS.replace(threads=1, cpus=1))
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    assert len(seen["before"]) == 1 and seen["after"] == seen["before"], seen


def test_subprocess_run_cannot_poison_staged_public_data(tmp_path, sandboxes):
    """Regression (hole 5): a subprocess-backend run wrote into the staged public data, which
    later isolated runs reused without checking."""
    from wmrl.autoresearch.grading.staging import staged_public_dir
    from wmrl.autoresearch.tasks import load_bundled

    task = load_bundled("wine-cultivar")
    staged = staged_public_dir(task.id, task.public_dir)
    original = (staged / "train.csv").read_bytes()
    code = f"""
    import os
    out = []
    for name in ("train.csv", "test.csv"):
        p = os.path.join({str(staged)!r}, name)
        try:
            with open(p, "a") as f:
                f.write("poison\\n")
            out.append("wrote")
        except OSError as e:
            out.append(type(e).__name__)
        try:
            os.chmod(p, 0o666)
            out.append("chmod")
        except OSError as e:
            out.append(type(e).__name__)
    print(out)
    """
    res = sandboxes("subprocess").run(textwrap.dedent(code), task.public_dir, LIMITS)
    assert res.status == "ok", res
    if as_root():
        assert "wrote" not in res.stdout_tail and "chmod" not in res.stdout_tail, res.stdout_tail
    again = staged_public_dir(task.id, task.public_dir)
    assert (again / "train.csv").read_bytes() == original == (task.public_dir / "train.csv").read_bytes()


def test_altered_staged_copy_is_made_again(tmp_path):
    """Neighbour (hole 5): whoever alters a staged copy (root can), the next reuse notices."""
    from wmrl.autoresearch.sandbox.staging import StagingArea

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.csv").write_text("id,y\n1,2\n")
    area = StagingArea(tmp_path / "area")
    first = area.stage("t-1", src)
    os.chmod(first / "a.csv", 0o644)
    (first / "a.csv").write_text("id,y\n1,999\n")
    os.chmod(first / "a.csv", 0o444)
    second = area.stage("t-1", src)
    assert (second / "a.csv").read_text() == "id,y\n1,2\n" and area.restaged == 1
    # A staging root someone else may write is not used at all.
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    assert StagingArea(shared).root != shared


def test_mount_table_shows_no_checkout_or_staging_path(isolating, data):
    """Regression (hole 5): the mount table showed the checkout and the staging folder."""
    res = run(isolating, "print(open('/proc/self/mountinfo').read())", data)
    assert res.status == "ok", res
    table = res.stdout_tail
    assert str(REPO) not in table, table
    assert str(isolating.output_root) not in table or isolating.name == "docker"
    assert "/sandbox/code/solution.py" in table


def test_cleanup_never_follows_the_solutions_links(sb, data):
    """Neighbour: the host removes what a run left; links there must not make it touch the host."""
    targets = ["/", "/etc", "/usr", str(data)]
    modes = {t: os.stat(t).st_mode for t in targets}
    code = f"""
    import os, tempfile
    for i, t in enumerate({targets!r}):
        for where in (".", tempfile.gettempdir()):
            os.symlink(t, os.path.join(where, f"link{{i}}"))
    os.symlink("/", os.environ["SUBMISSION_PATH"])
    """
    res = run(sb, code, data)
    assert res.status == "ok", res
    assert {t: os.stat(t).st_mode for t in targets} == modes
