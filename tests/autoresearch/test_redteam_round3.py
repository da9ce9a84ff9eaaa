"""Red team, round three (issue 35): the six hole kinds and their neighbours, on every backend here.

1. a solution cannot make its failure "unknown" by attacking its launcher (signals, pidfds,
   ``prlimit``), and a launcher that stops after the solution started is the solution's failure;
2. socket families are an allow list (``AF_VSOCK`` and the rest are machine-wide);
3. host-wide kernel quotas (asynchronous I/O) are out of reach;
4. locks and watches on shared read-only inodes are no channel between concurrent rollouts;
5. nothing the trusted side reuses is taken on trust (the Ray pool's shipped data: in
   ``test_sandbox_ray.py``, which has the cluster), nor the sandbox users' lock folder;
6. nothing a solution leaves in the host's ``/tmp``, ``/dev/shm`` or System V IPC outlives it,
   and a reused uid starts clean.

And the neighbour found reading the code: only UTF-8 source runs (a coding cookie made the
interpreter run a program the syntax check never saw).

Every backend runs for real: bubblewrap, Docker (CI starts an engine) and the subprocess backend.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from wmrl.autoresearch.sandbox import Limits
from wmrl.autoresearch.sandbox.supervisor import RawOutcome, Tail, classify

LIMITS = Limits(wall_time_s=20, memory_mb=1024, max_processes=64, threads=1, disk_mb=64, file_size_mb=64)
ALL = [
    pytest.param("bwrap", marks=pytest.mark.bwrap),
    pytest.param("docker", marks=pytest.mark.docker),
    "subprocess",
]


@pytest.fixture(params=ALL)
def sb(request, sandboxes):
    return sandboxes(request.param)


@pytest.fixture
def data(tmp_path) -> Path:
    d = tmp_path / "public"
    d.mkdir()
    (d / "train.csv").write_text("id,x,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(30)))
    return d


def run(sb, code: str, data: Path, limits: Limits = LIMITS):
    return sb.run(textwrap.dedent(code), data, limits)


def report(result) -> dict:
    """The JSON object the probe printed last."""
    lines = [line for line in result.stdout_tail.splitlines() if line.startswith("{")]
    assert lines, (result.status, result.reason, result.stderr_tail[-2000:])
    return json.loads(lines[-1])


PROBE_HEADER = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def call(name, nr, *args):
    rc = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    out[name] = "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
"""

# -- hole 1: the launcher is out of the solution's reach -------------------------------------------

LAUNCHER_ATTACKS = (
    PROBE_HEADER
    + """
import resource, signal
parent = os.getppid()
for target in sorted({1, parent}):
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        call(f"kill {target} {sig.name}", 62, target, sig)
    call(f"kill {target} high bits", 62, (1 << 32) | target, signal.SIGINT)
    call(f"tkill {target}", 200, target, signal.SIGINT)
    call(f"tgkill {target}", 234, target, target, signal.SIGINT)
    call(f"pidfd_open {target}", 434, target, 0)
    for name, res in (("NOFILE", resource.RLIMIT_NOFILE), ("AS", resource.RLIMIT_AS), ("CPU", resource.RLIMIT_CPU)):
        try:
            resource.prlimit(target, res, (1, 1))
            out[f"prlimit {target} {name}"] = "ok"
        except OSError as exc:
            out[f"prlimit {target} {name}"] = errno.errorcode.get(exc.errno, exc.errno)
# a pidfd by the /proc folder of PID 1
try:
    fd = os.open("/proc/1", os.O_RDONLY | os.O_DIRECTORY)
    call("pidfd_send_signal /proc/1", 424, fd, signal.SIGINT, 0, 0)
except OSError as exc:
    out["pidfd_send_signal /proc/1"] = "open failed"
# its own limits stay its own to lower
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
out["own setrlimit"] = "ok"
print(json.dumps(out), flush=True)
raise SystemExit(1)  # a bad outcome it would like to see masked
"""
)


def test_a_solution_cannot_stop_its_launcher_to_mask_its_failure(sb, data):
    """Round three, hole 1: signalling the launcher (PID 1 of bwrap's and Docker's namespaces: Python's
    SIGINT handler made it killable) or lowering its limits with ``prlimit`` made it die before it
    reported, and the failure came back as a harness error, graded unknown."""
    res = run(sb, LAUNCHER_ATTACKS, data)
    assert res.status == "error" and res.exit_code == 1, (res.status, res.reason)
    got = report(res)
    assert got.pop("own setrlimit") == "ok"
    if sb.name == "subprocess" and os.geteuid() != 0:
        pytest.skip("without root the subprocess backend runs the solution as the launcher's own user")
    # A pidfd of a process it may not signal is harmless (every signal through a pidfd is refused);
    # for PID 1, the sandbox's launcher, the filter refuses the pidfd itself.
    reached = {
        k: v for k, v in got.items() if v == "ok" and not (k.startswith("pidfd_open") and k != "pidfd_open 1")
    }
    assert got["pidfd_send_signal /proc/1"] != "ok"
    assert not reached, reached


STARVE = (
    PROBE_HEADER
    + """
import os
for name, fn in (
    ("setpriority 1", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),
    ("setpriority pgrp 1", lambda: os.setpriority(os.PRIO_PGRP, 1, 19)),
    ("setpriority user", lambda: os.setpriority(os.PRIO_USER, 0, 19)),
    ("sched idle 1", lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))),
    ("sched param 1", lambda: os.sched_setparam(1, os.sched_param(0))),
    ("affinity 1", lambda: os.sched_setaffinity(1, {0})),
):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, exc.errno)
call("ioprio 1", 251, 1, 1, (3 << 13))
call("ioprio user", 251, 3, 0, (3 << 13))
os.nice(1)  # its own priority stays its own
out["own nice"] = "ok"
print(json.dumps(out), flush=True)
"""
)

STARVE_AND_OVERRUN = """
import os, time
t0, wall = time.time(), 4.0
for call in (lambda: os.setpriority(os.PRIO_PROCESS, 1, 19),
             lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))):
    try:
        call()
    except OSError:
        pass
for _ in range(40):
    if os.fork() == 0:
        while time.time() - t0 < wall + 2.5:
            pass
        os._exit(0)
while time.time() - t0 < wall + 2.0:
    time.sleep(0.05)
open(os.environ["SUBMISSION_PATH"], "w").write("id,y\\n1,0\\n")
os._exit(0)
"""


def test_the_launcher_cannot_be_starved(sb, data):
    """Round three (found by this round's own red team): lowering PID 1's priority (nice 19,
    ``SCHED_IDLE``) and keeping dozens of tasks busy kept the launcher from its wall-time check, and a
    solution that finished 2 s late came back ``ok``. Scheduling and I/O priority calls aimed at the
    launcher, or at every process of the uid, are refused; the solution's own stay its own."""
    res = run(sb, STARVE, data)
    assert res.status == "ok", (res.reason, res.stderr_tail[-2000:])
    got = report(res)
    assert got.pop("own nice") == "ok"
    if sb.name == "subprocess":  # the launcher is root there: refused by the kernel as well
        got = {k: v for k, v in got.items() if k.endswith(" 1") or "pgrp" in k}
    assert not {k: v for k, v in got.items() if v == "ok"}, got


@pytest.mark.parametrize("backend", ALL[:2])
def test_running_past_the_wall_time_is_a_timeout_even_with_a_busy_launcher(backend, sandboxes, data):
    res = run(sandboxes(backend), STARVE_AND_OVERRUN, data, LIMITS.replace(wall_time_s=4))
    assert res.status == "timeout", (res.status, res.reason, res.resources)


DEEP = """
import os
os.chdir({where!r})
os.mkdir("deep-{token}")
os.chdir("deep-{token}")
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
raise SystemExit(1)
"""


@pytest.mark.parametrize("where", ["work", "tmp"])
def test_a_deep_tree_cannot_turn_the_cleanup_into_a_harness_error(sb, data, where):
    """Round three (this round's red team): ``shutil.rmtree`` recurses once per level on Python 3.11;
    a tree 3,000 folders deep in the work dir or the host's ``/tmp`` made the clean-up raise
    ``RecursionError``: a harness error on demand, a uid never handed back, and a leftover that failed
    the next trainer's runs. It is the solution's own ``error``, and nothing of it stays."""
    token = uuid.uuid4().hex[:12]
    folder = "." if where == "work" else "/tmp"
    res = run(sb, DEEP.format(where=folder, token=token), data)
    assert res.status == "error" and res.exit_code == 1, (res.status, res.reason)
    assert not os.path.exists(f"/tmp/deep-{token}")
    again = run(sb, "print('clean')", data)
    assert again.status == "ok" and "clean" in again.stdout_tail


PAGE_CACHE = (
    PROBE_HEADER
    + """
import sys
path = os.path.realpath(sys.executable)
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # evict it for everyone (advice: ignored)
try:
    os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    out["nowait"] = "ok"
except OSError as exc:
    out["nowait"] = errno.errorcode.get(exc.errno, exc.errno)
call("cachestat", 451, fd, 0, 0, 0)
print(json.dumps(out), flush=True)
"""
)


def test_shared_files_page_cache_is_no_channel(sb, data):
    """Round three (this round's red team): a sender evicted shared files with ``fadvise(DONTNEED)``
    and a receiver tested them with ``RWF_NOWAIT`` reads: 24 bits across concurrent rollouts. The
    eviction is ignored (the host still finds the file cached), the probes are refused."""
    target = os.path.realpath(sb.solution_env.python) if sb.name == "subprocess" else None
    target = target or os.path.realpath(sb.solution_env.python)
    with open(target, "rb") as f:
        f.read()  # in the page cache now
    res = run(sb, PAGE_CACHE, data)
    assert res.status == "ok", (res.reason, res.stderr_tail[-2000:])
    got = report(res)
    assert got["nowait"] in ("EOPNOTSUPP", "ENOTSUP") and got["cachestat"] == "ENOSYS", got
    fd = os.open(target, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)  # raises BlockingIOError when evicted
    finally:
        os.close(fd)


def _outcome(*, started: bool, exit_info: dict | None, wait_status: int | None = 9) -> RawOutcome:
    return RawOutcome(
        stdout=Tail(100),
        stderr=Tail(100),
        started={"pid": 2, "pgid": 2} if started else None,
        exit_info=exit_info,
        wait_status=wait_status,
    )


def test_a_launcher_that_stops_after_the_start_is_the_solutions_failure():
    """Classification: once ``started`` arrived (it is sent before the solution may ``exec``), a
    launcher that never reports is ``killed``, never a harness error; before it, a harness error."""
    after = classify(_outcome(started=True, exit_info=None), LIMITS)
    assert after.status == "killed" and "held responsible" in after.reason
    assert "SIGKILL" in after.reason
    ended = classify(_outcome(started=True, exit_info=None, wait_status=1 << 8), LIMITS)
    assert ended.status == "killed"
    before = classify(_outcome(started=False, exit_info=None), LIMITS)
    assert before.status == "harness_error"
    protocol = _outcome(started=True, exit_info=None)
    protocol.host_kill = ("protocol", "bad launcher frame: unknown launcher frame kind b'z'")
    assert classify(protocol, LIMITS).status == "killed"
    protocol.started = None
    assert classify(protocol, LIMITS).status == "harness_error"


def test_the_started_frame_precedes_the_solutions_first_line(sb, data):
    """The solution's first statement interrupts what it can reach of its launcher (SIGINT: Python's
    handler once made PID 1 take it): whatever happens, the outcome is the solution's, never a
    harness error, on every backend."""
    code = "import os, signal\nfor p in (1, os.getppid()):\n    try:\n        os.kill(p, signal.SIGINT)\n    except OSError:\n        pass\nraise SystemExit(3)\n"
    res = run(sb, code, data)
    assert res.status != "harness_error", res.reason
    assert res.status in ("error", "killed"), res


# -- hole 2: socket families are an allow list ------------------------------------------------------

SOCKETS = (
    PROBE_HEADER
    + """
import socket
made = []
for family in range(64):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
        try:
            socket.socket(family, kind, 0).close()
            made.append(family)
            break
        except OSError:
            pass
out["families"] = sorted(set(made))
call("vsock high bits", 41, (1 << 32) | 40, 1, 0)
call("netlink uevent", 41, 16, 3, 15)
call("netlink route", 41, 16, 3, 0)
a, b = socket.socketpair()
out["socketpair"] = "ok"
out["getaddrinfo"] = bool(socket.getaddrinfo("localhost", 80))
print(json.dumps(out), flush=True)
"""
)


def test_only_the_allowed_socket_families_can_be_created(sb, data):
    """Round three, hole 2: from its private network namespace a solution bound a port in the
    machine-wide vsock space. Only AF_UNIX, AF_INET, AF_INET6 and routing netlink are allowed."""
    res = run(sb, SOCKETS, data)
    assert res.status == "ok", (res.reason, res.stderr_tail[-2000:])
    got = report(res)
    assert set(got["families"]) <= {1, 2, 10, 16}, got["families"]
    assert 40 not in got["families"]  # AF_VSOCK
    assert got["vsock high bits"] == "EAFNOSUPPORT"
    assert got["netlink uevent"] == "EPROTONOSUPPORT"
    assert got["netlink route"] == "ok" and got["socketpair"] == "ok" and got["getaddrinfo"]


# -- hole 3: host-wide quotas -------------------------------------------------------------------------

AIO = (
    PROBE_HEADER
    + """
ctx = ctypes.c_ulong(0)
call("io_setup", 206, 65536, ctypes.addressof(ctx))
print(json.dumps(out), flush=True)
"""
)


def test_asynchronous_io_contexts_are_refused(sb, data):
    """Round three, hole 3: ``/proc/sys/fs/aio-max-nr`` is one counter for the whole machine; a solution
    took it all and root on the host failed until the run ended."""
    res = run(sb, AIO, data)
    assert res.status == "ok", res.reason
    assert report(res)["io_setup"] == "ENOSYS"


PTYS = """
import json, os
out = {}
for path in ("/dev/ptmx", "/dev/pts/ptmx"):
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NOCTTY))
        out[path] = "opened"
    except OSError as exc:
        out[path] = exc.strerror
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("backend", ALL[:2])
def test_no_pseudo_terminals_from_the_machine_wide_count(backend, sandboxes, data):
    """Neighbour of hole 3 (the audit): ``kernel.pty.max`` counts every devpts instance on the machine
    (a sandbox opened hundreds of ptys and the machine-wide ``pty/nr`` rose with them). A solution
    needs none: the isolated backends show no ``ptmx``."""
    res = run(sandboxes(backend), PTYS, data)
    assert res.status == "ok", res.reason
    assert "opened" not in report(res).values()


# -- hole 4: locks and watches on shared inodes -------------------------------------------------------

LOCKS = (
    PROBE_HEADER
    + """
import fcntl, sys, time
fd = os.open(sys.executable, os.O_RDONLY)  # a shared read-only inode (the solution environment)
for name, fn in (
    ("flock", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)),
    ("lockf", lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
    ("ofd", lambda: fcntl.fcntl(fd, 37, bytes(32))),
    ("getlk", lambda: fcntl.fcntl(fd, fcntl.F_GETLK, bytes(32))),
    ("ofd getlk", lambda: fcntl.fcntl(fd, 36, bytes(32))),
    ("lease", lambda: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)),
    ("notify", lambda: fcntl.fcntl(os.open(os.path.dirname(sys.executable), os.O_RDONLY), fcntl.F_NOTIFY, 1)),
):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, exc.errno)
rc = libc.inotify_init1(0)
out["inotify"] = "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno())
print(json.dumps(out), flush=True)
time.sleep(1.5)  # hold the "lock" while the other rollout and the host look
"""
)


def _locks_on(inode: int) -> list[str]:
    return [line for line in Path("/proc/locks").read_text().splitlines() if f":{inode} " in line]


def test_concurrent_rollouts_cannot_signal_each_other_through_shared_inodes(sb, data):
    """Round three, hole 4: one rollout took a lock on a shared read-only inode and another observed
    it. Taking a lock now succeeds and does nothing (SQLite and filelock keep working): both
    rollouts get an exclusive lock on the same inode at once, the host's lock table never shows
    one, and testing for a lock, leases, directory notifications and inotify are refused."""
    results = [None, None]
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, run(sb, LOCKS, data))) for i in range(2)
    ]
    for t in threads:
        t.start()
    target = os.stat(os.path.realpath(sb.solution_env.python)).st_ino
    seen = []
    while any(t.is_alive() for t in threads):
        seen += _locks_on(target)
        threads[0].join(0.05)
    for t in threads:
        t.join()
    assert not seen, seen
    for res in results:
        assert res.status == "ok", (res.reason, res.stderr_tail[-2000:])
        got = report(res)
        assert got["flock"] == "ok" and got["lockf"] == "ok" and got["ofd"] == "ok", got  # no-ops
        assert got["getlk"] == got["ofd getlk"] == "ENOLCK", got
        assert got["lease"] != "ok" and got["notify"] != "ok", got
        assert got["inotify"] == "ENOSYS", got


COMMON_LIBRARIES = """
import json, os, sqlite3, sys
import numpy as np, pandas as pd
out = {}
X = np.random.RandomState(0).rand(300, 5); y = (X[:, 0] > 0.5).astype(int)
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import cross_val_score
out["loky"] = float(cross_val_score(RandomForestClassifier(n_estimators=10, n_jobs=2), X, y, cv=3, n_jobs=2).mean())
import multiprocessing as mp
with mp.Pool(2) as pool:
    out["pool"] = pool.map(abs, [-1, -2])
import torch
from torch.utils.data import DataLoader, TensorDataset
out["torch"] = sum(len(b[0]) for b in DataLoader(TensorDataset(torch.tensor(X)), batch_size=100, num_workers=2))
c = sqlite3.connect("db.sqlite"); c.execute("create table t(x)"); c.execute("insert into t values (1)"); c.commit()
out["sqlite"] = c.execute("select x from t").fetchone()[0]
from filelock import FileLock
with FileLock("x.lock", timeout=2):
    out["filelock"] = True
import lightgbm, xgboost
lightgbm.LGBMClassifier(n_estimators=5, verbose=-1).fit(X, y); xgboost.XGBClassifier(n_estimators=5).fit(X, y)
out["boosting"] = True
print(json.dumps(out), flush=True)
"""


def test_the_libraries_solutions_use_still_work_under_the_filter(sb, data):
    """The filter must not break correct solutions: joblib's process pool, multiprocessing, torch's
    DataLoader workers, SQLite on a file (its locks are no-ops now), filelock, LightGBM, XGBoost."""
    res = run(sb, COMMON_LIBRARIES, data, LIMITS.replace(wall_time_s=120, memory_mb=2048, threads=2))
    assert res.status == "ok", (res.reason, res.stderr_tail[-3000:])
    got = report(res)
    assert got["pool"] == [1, 2] and got["torch"] == 300 and got["sqlite"] == 1 and got["filelock"], got


# -- hole 5 (neighbour): the users' lock folder -------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated users exist only when the trainer is root")
def test_a_lock_folder_someone_else_made_is_refused(tmp_path):
    from wmrl.autoresearch.sandbox.users import UserPool

    planted = tmp_path / "locks"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    with pytest.raises(PermissionError, match="lock folder"):
        UserPool(base=300_000, count=1, lock_dir=planted).acquire()
    os.chown(planted, 300_001, 300_001)
    os.chmod(planted, 0o700)
    with pytest.raises(PermissionError, match="lock folder"):
        UserPool(base=300_000, count=1, lock_dir=planted).acquire()


# -- hole 6: nothing outlives an execution ------------------------------------------------------------

LEFTOVERS = """
import ctypes, json, os, sys
token = "{token}"
libc = ctypes.CDLL(None, use_errno=True)
made = {{}}
for folder in ("/tmp", "/var/tmp", "/dev/shm", os.environ.get("TMPDIR", "/tmp")):
    try:
        with open(os.path.join(folder, token), "w") as f:
            f.write("x" * 4096)
        made[folder] = True
    except OSError as exc:
        made[folder] = str(exc)
key = {key}
for name, rc in (
    ("shm", libc.shmget(key, 1 << 20, 0o1666)),
    ("msg", libc.msgget(key, 0o1666)),
    ("sem", libc.semget(key, 1, 0o1666)),
):
    made[name] = rc
print(json.dumps(made), flush=True)
"""


def _sysv_keys() -> set[int]:
    keys = set()
    for kind in ("shm", "msg", "sem"):
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        keys |= {int(line.split()[0]) for line in lines if line.split()}
    return keys


def test_nothing_a_solution_leaves_in_shared_folders_or_ipc_outlives_it(sb, data):
    """Round three, hole 6: on the subprocess backend System V shared memory and files in the host's
    ``/dev/shm`` and ``/tmp`` outlived the run and its cgroup, charged to a uid later runs reuse."""
    token = f"wmrl-leftover-{uuid.uuid4().hex}"
    key = 0x5A000000 + (uuid.uuid4().int % 0xFFFFFF)
    res = run(sb, LEFTOVERS.format(token=token, key=key), data)
    assert res.status == "ok", (res.reason, res.stderr_tail[-2000:])
    made = report(res)
    assert any(v is True for v in made.values()), made  # it did leave something somewhere
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not os.path.exists(os.path.join(folder, token)), f"{folder}/{token} outlived the run"
    assert key not in _sysv_keys(), "a System V IPC object of the solution outlived the run"


@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated users exist only when the trainer is root")
def test_a_reused_uid_starts_clean(tmp_path):
    """What an earlier holder of a uid left (a trainer that crashed mid-run) is purged when the uid
    is handed out again: files in the shared folders, nested ones included, and its System V IPC."""
    import ctypes

    from wmrl.autoresearch.sandbox.users import UserPool

    uid = 300_100
    token = f"wmrl-stale-{uuid.uuid4().hex}"
    stale = Path("/dev/shm") / token
    stale.write_bytes(b"x" * 4096)
    os.chown(stale, uid, uid)
    shared = Path("/tmp") / f"{token}-shared"  # a world-writable folder of someone else
    shared.mkdir()
    os.chmod(shared, 0o1777)
    nested = shared / "inner"
    nested.mkdir()
    os.chown(nested, uid, uid)
    (nested / "f").write_text("x")
    key = 0x5B000000 + (uuid.uuid4().int % 0xFFFFFF)
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:  # create the segment as that uid
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os._exit(0 if libc.shmget(key, 4096, 0o1600) >= 0 else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert key in _sysv_keys()
    try:
        pool = UserPool(base=uid, count=1, lock_dir=tmp_path / "locks")
        user = pool.acquire()
        pool.release(user)
        assert not stale.exists() and not nested.exists()
        assert shared.exists() and stat.S_IMODE(shared.stat().st_mode) == 0o1777  # not the uid's
        assert key not in _sysv_keys()
    finally:
        stale.unlink(missing_ok=True)
        import shutil

        shutil.rmtree(shared, ignore_errors=True)


# -- neighbour: only UTF-8 source runs ----------------------------------------------------------------

HIDDEN = "# -*- coding: utf-7 -*-\nx = 1 +ACM- print('hidden')\nraise SystemExit(0)\n"


def test_a_coding_cookie_other_than_utf8_is_refused(sb, data):
    """Decoded as UTF-7, ``+ACM-`` is ``#``... the other way round: text a reader sees as code can be a
    comment to the interpreter and back. Only UTF-8 source runs; anything else is the solution's error."""
    res = run(sb, HIDDEN, data)
    assert res.status == "error" and "only UTF-8 source is accepted" in res.reason, res
    assert res.stdout_tail == ""
    ok = run(sb, "# -*- coding: utf-8 -*-\nprint('fine')\n", data)
    assert ok.status == "ok" and "fine" in ok.stdout_tail


# -- the GPU items (reviewed from the code): a minimal /sys for a GPU slot under bubblewrap ----------


def test_a_gpu_slots_minimal_sys_view_leaves_out_the_rest_of_sys():
    """Issue 35: bwrap with a GPU bound the host's whole ``/sys``. The minimal view binds the driver
    modules, the PCI devices and the CPU/NUMA topology only; the whole ``/sys`` is bound only when
    CUDA initialises with it and not without it."""
    from wmrl.autoresearch.sandbox.bwrap import _sys_args

    minimal = _sys_args("minimal")
    targets = set(minimal[2::3])
    assert "/sys" not in targets and "/sys/devices/system/cpu" in targets and "/sys/bus/pci" in targets
    assert not any(t.startswith(("/sys/kernel", "/sys/firmware", "/sys/fs", "/sys/class")) for t in targets)
    assert _sys_args("full") == ["--ro-bind-try", "/sys", "/sys"]


@pytest.mark.parametrize(
    ("minimal", "full", "view"),
    [("0", None, "minimal"), ("no driver", None, "minimal"), ("304", "0", "full"), ("304", "304", "minimal")],
)
def test_the_gpu_sys_view_follows_what_cuinit_needs(minimal, full, view, monkeypatch, tmp_path):
    """``gpu_sys="auto"`` probes ``cuInit`` once, at the first GPU execution, and says so when it has to
    bind the whole ``/sys`` (every result's warnings); a probe that cannot tell keeps the minimal view."""
    from wmrl.autoresearch.sandbox.bwrap import BwrapSandbox

    sb = BwrapSandbox(output_root=tmp_path)
    calls = []

    def cuinit(args, limits):
        calls.append("full" if args[-3:] == ["--ro-bind-try", "/sys", "/sys"] else "minimal")
        return minimal if calls[-1] == "minimal" else full

    monkeypatch.setattr(sb, "_cuinit_under", cuinit)
    monkeypatch.setattr(
        sb, "_gpu_device_args", lambda limits: (["--dev-bind-try", "/dev/nvidia0", "/dev/nvidia0"], [])
    )
    warnings = sb._pre_warnings(Limits(gpu=(0,)))
    assert sb._gpu_sys_decided[0] == view
    assert any("whole /sys" in w for w in warnings) == (view == "full")
    args, problems = sb._gpu_args(Limits(gpu=(0,)))
    assert not problems and (("/sys" in args) == (view == "full"))
    assert len(calls) == (1 if minimal in ("0", "no driver") else 2)  # decided once, then kept
    sb._pre_warnings(Limits(gpu=(0,)))
    assert len(calls) == (1 if minimal in ("0", "no driver") else 2)
    assert ("whole /sys" if view == "full" else "a minimal /sys") in sb.protections()["gpu_sys"]


@pytest.mark.bwrap
def test_the_cuinit_probe_runs_in_a_real_sandbox_with_the_minimal_view(sandboxes):
    """The probe itself, for real: a bubblewrap sandbox with the minimal view sees the CPU topology and
    not the kernel's, firmware or cgroup folders, and (on a machine without a CUDA driver) says so."""
    from wmrl.autoresearch.sandbox.bwrap import _sys_args

    sb = sandboxes("bwrap")
    seen = sb._probe(
        _sys_args("minimal"),
        LIMITS,
        "import os\nprint(sorted(p for p in ('/sys/devices/system/cpu', '/sys/kernel', '/sys/firmware', "
        "'/sys/fs/cgroup', '/sys/class/net') if os.path.exists(p)))",
    )
    assert seen == "['/sys/devices/system/cpu']", seen
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")):
        assert sb._cuinit_under(_sys_args("minimal"), LIMITS) == "no driver"


# -- hole 5: the unisolated backend as the trainer's own user, beside isolated runs -----------------


@pytest.mark.parametrize("isolating_here", [True, False])
def test_a_same_user_subprocess_backend_is_refused_where_isolated_runs_happen(
    isolating_here, monkeypatch, tmp_path
):
    """Round three, hole 5's root: as the trainer's own (non-root) user, a subprocess-backend solution
    can write the solution environment and the staging folders that later isolated runs read, and
    plant answers there. It is refused where bubblewrap or Docker can run, unless asked for."""
    from wmrl.autoresearch.sandbox import SandboxError, factory
    from wmrl.autoresearch.sandbox.local import SubprocessSandbox

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    why = None if isolating_here else "not installed"
    monkeypatch.setattr(
        factory, "backend_problems", lambda: {"bwrap": why, "docker": "no engine", "subprocess": None}
    )
    if isolating_here:
        with pytest.raises(SandboxError, match="allow_same_user=True"):
            SubprocessSandbox(output_root=tmp_path / "a")
    else:
        SubprocessSandbox(output_root=tmp_path / "a")
    SubprocessSandbox(output_root=tmp_path / "b", allow_same_user=True)


# -- found by the third pass: the purge's own race, and zombies against RLIMIT_NPROC --------------


@pytest.mark.skipif(os.geteuid() != 0, reason="the purge runs as root")
def test_removal_stays_in_the_folder_it_was_given_when_the_path_is_swapped(tmp_path):
    """A concurrent run swapped a world-writable folder for a link between the sweep's look and
    ``rm``; root then removed the link target's tree. Removal works from the folder's descriptor."""
    from wmrl.autoresearch.sandbox.purge import remove_tree

    victim = tmp_path / "victim"
    (victim / "Q" / "sub").mkdir(parents=True)
    (victim / "Q" / "sub" / "f").write_text("root's")
    shared = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="wmrl-swap-"))
    try:
        (shared / "d").mkdir()
        (shared / "d" / "Q").write_text("the solution's")
        fd = os.open(shared / "d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            (shared / "d").rename(shared / "moved")  # the swap: d is now a link to the victim
            (shared / "d").symlink_to(victim)
            assert remove_tree("Q", dir_fd=fd) is None
        finally:
            os.close(fd)
        assert not (shared / "moved" / "Q").exists()  # what the descriptor held went
        assert (victim / "Q" / "sub" / "f").read_text() == "root's"  # what the link points at stayed
    finally:
        shutil.rmtree(shared, ignore_errors=True)


RACE_SWAPPER = """
import ctypes, os, time
libc = ctypes.CDLL(None); os.umask(0); n = 24
for i in range(n):
    os.mkdir(f"/var/tmp/{token}-d{{i}}", 0o777)
    os.symlink({victim!r}, f"/var/tmp/{token}-e{{i}}")
while not all(os.path.exists(f"/var/tmp/{token}-d{{i}}/Q") for i in range(n)):
    time.sleep(0.05)
end = time.time() + 6
while time.time() < end:
    for i in range(n):  # renameat2(RENAME_EXCHANGE): d{{i}} and the link trade places
        libc.syscall(316, -100, f"/var/tmp/{token}-d{{i}}".encode(), -100, f"/var/tmp/{token}-e{{i}}".encode(), 2)
"""
RACE_VICTIM_NAMER = """
import os, time
n = 24
while not all(os.path.isdir(f"/var/tmp/{token}-d{{i}}") for i in range(n)):
    time.sleep(0.05)
for i in range(n):
    open(f"/var/tmp/{token}-d{{i}}/Q", "w").write("x")
time.sleep(1)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated users exist only when the trainer is root")
def test_two_runs_cannot_steer_the_purge_into_a_host_folder(sandboxes, data, tmp_path):
    """The third pass's attack, end to end on the subprocess backend: one run keeps swapping its
    world-writable folders with links to a root-owned tree while another's purge removes its files
    in them. The root-owned tree stays whole."""
    victim = tmp_path / "victim"
    (victim / "Q" / "sub").mkdir(parents=True)
    (victim / "Q" / "sub" / "f").write_text("root's")
    token = f"wmrl-race-{uuid.uuid4().hex[:8]}"
    sb = sandboxes("subprocess")
    long = LIMITS.replace(wall_time_s=30)
    swapper = threading.Thread(
        target=lambda: run(sb, RACE_SWAPPER.format(token=token, victim=str(victim)), data, long)
    )
    swapper.start()
    try:
        time.sleep(0.5)
        named = run(sb, RACE_VICTIM_NAMER.format(token=token), data, long)
        assert named.status == "ok", named.reason
    finally:
        swapper.join()
        for leftover in Path("/var/tmp").glob(f"{token}-*"):
            subprocess.run(["rm", "-rf", "--one-file-system", "--", str(leftover)], check=False)
    assert (victim / "Q" / "sub" / "f").read_text() == "root's"


ZOMBIES = """
import os, time
print(os.getuid(), flush=True)
for _ in range(30):
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:  # an orphan that ends after its parent: a zombie of whoever adopts it
            time.sleep(0.3)
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
time.sleep(0.6)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated users exist only when the trainer is root")
def test_orphans_are_reaped_so_the_next_run_keeps_its_process_budget(sandboxes, data):
    """Orphans went to the host's init, which may reap late; as zombies they counted against the
    uid's RLIMIT_NPROC, and the next run on that uid could not fork. The launcher adopts them
    (a child subreaper) and reaps them: none is left when the run ends."""
    from wmrl.autoresearch.sandbox import procscan

    res = run(sandboxes("subprocess"), ZOMBIES, data)
    assert res.status == "ok", res.reason
    uid = int(res.stdout_tail.split()[0])
    assert procscan.find_by_uid(uid, zombies=True) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated users exist only when the trainer is root")
def test_a_uid_with_unreaped_processes_is_not_handed_out(tmp_path):
    """Whatever the cause, a uid whose dead processes are not reaped yet is skipped until they are."""
    from wmrl.autoresearch.sandbox.users import UserPool

    uid = 300_300
    pid = os.fork()
    if pid == 0:  # a zombie of uid: it exits, and this process does not reap it yet
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os._exit(0)
    time.sleep(0.2)
    pool = UserPool(base=uid, count=2, lock_dir=tmp_path / "locks")
    try:
        first = pool.acquire()
        assert first.uid == uid + 1  # the dirty one skipped
    finally:
        os.waitpid(pid, 0)
    pool.release(first)
    again = pool.acquire()
    assert again.uid == uid  # reaped: clean again
    pool.release(again)
