"""Red-team solutions against every backend available here (issue 3, section 5).

Each attack must end with a clear status, leak no answer, leave no process running, leave the
host unaffected, and leave the next execution clean. Bubblewrap must stop all of them. The
subprocess backend does not isolate: for it we assert that it *says so* (``isolated=False`` and
a warning), show that the answers are indeed reachable, and run only the attacks its limits can
honour (time, output, memory, process count, file size, detached children, public data copy).
Docker needs an engine; its attack subset skips without one.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import socket
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from wmrl.autoresearch.sandbox import ExecutionResult, Limits, make_sandbox

LIMITS = Limits(
    wall_time_s=15,
    memory_mb=1024,
    max_processes=64,
    threads=1,
    disk_mb=64,
    file_size_mb=16,
    output_bytes=1 << 20,
)
SECRET_COL = "wmrl_secret_answer_col_7f3a9"

ISOLATING = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
ALL = [*ISOLATING, "subprocess"]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(params=ALL)
def sb(request, sandboxes):
    return sandboxes(request.param)


@pytest.fixture(params=ISOLATING)
def isolating(request, sandboxes):
    return sandboxes(request.param)


class Task:
    """A task on the host: public data, private answers next to it, and a second copy of the
    answers elsewhere on the host (the attacker is told both exact paths)."""

    def __init__(self, root: Path) -> None:
        self.public = root / "task" / "public"
        self.private = root / "task" / "private"
        self.public.mkdir(parents=True)
        self.private.mkdir(parents=True)
        self.tokens = [f"ANS-{uuid.uuid4().hex}" for _ in range(10)]
        (self.public / "train.csv").write_text(
            "id,x,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(30))
        )
        (self.public / "test.csv").write_text("id,x\n" + "".join(f"{i},{i % 3}\n" for i in range(100, 110)))
        (self.public / "sample_submission.csv").write_text(
            "id,y\n" + "".join(f"{i},0\n" for i in range(100, 110))
        )
        answers = f"id,{SECRET_COL}\n" + "".join(f"{100 + i},{t}\n" for i, t in enumerate(self.tokens))
        self.answers = self.private / "answers.csv"
        self.answers.write_text(answers)
        self.elsewhere = Path("/tmp") / f"wmrl-redteam-{uuid.uuid4().hex}" / "answers.csv"
        self.elsewhere.parent.mkdir()
        self.elsewhere.write_text(answers)
        self.canary = root / "canary.txt"
        self.canary.write_text("host canary")
        self.public_hash = folder_hash(self.public)

    def leaked(self, *texts: str | None) -> bool:
        return any(t and any(tok in t for tok in self.tokens) for t in texts)

    def cleanup(self) -> None:
        shutil.rmtree(self.elsewhere.parent, ignore_errors=True)


@pytest.fixture
def task(tmp_path):
    t = Task(tmp_path)
    yield t
    t.cleanup()


def folder_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p.relative_to(folder)).encode())
        if p.is_file():
            h.update(p.read_bytes())
        h.update(oct(p.stat().st_mode).encode())
    return h.hexdigest()


def run(sb, code: str, task: Task, limits: Limits = LIMITS) -> ExecutionResult:
    return sb.run(textwrap.dedent(code), task.public, limits)


def with_marker(code: str, marker: str) -> str:
    """Prefix ``code`` with a re-exec so that the solution and every process it forks carry
    ``marker`` in their command line (how the host finds survivors)."""
    head = f"import os, sys\nif sys.argv[-1] != {marker!r}:\n    os.execv(sys.executable, [sys.executable, sys.argv[0], {marker!r}])\n"
    return head + textwrap.dedent(code)


def survivors(marker: str, wait_s: float = 2.0) -> list[int]:
    """Pids whose command line holds ``marker`` (retried briefly: zombies are being reaped)."""
    end = time.monotonic() + wait_s
    while True:
        found = []
        for p in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                if marker.encode() in Path(p).read_bytes():
                    found.append(int(p.split("/")[2]))
            except OSError:
                pass
        if not found or time.monotonic() > end:
            return found
        time.sleep(0.05)


CLEAN_CHECK = """
import hashlib, json, os, tempfile
d = os.environ["DATA_DIR"]
h = hashlib.sha256()
for root, dirs, files in os.walk(d):
    dirs.sort()
    for n in sorted(files):
        p = os.path.join(root, n)
        h.update(os.path.relpath(p, d).encode()); h.update(open(p, "rb").read())
print(json.dumps({"cwd": sorted(os.listdir(".")), "tmp": sorted(os.listdir(tempfile.gettempdir())),
                  "data": h.hexdigest(), "files": sorted(os.listdir(d))}))
"""


def assert_next_run_clean(sb, task: Task) -> None:
    """The execution after an attack starts from a clean slate with the original public data."""
    res = run(sb, CLEAN_CHECK, task)
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    assert seen["cwd"] == [] and seen["tmp"] == sb.tmp_mount_points()
    assert seen["files"] == ["sample_submission.csv", "test.csv", "train.csv"]
    h = hashlib.sha256()
    for p in sorted(task.public.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(task.public)).encode())
            h.update(p.read_bytes())
    assert seen["data"] == h.hexdigest()
    assert folder_hash(task.public) == task.public_hash
    assert task.canary.read_text() == "host canary"


# -- reading the answers -------------------------------------------------------------------------

PERFECT_CHEAT = """
import os, sys, glob
SECRET_COL = {secret_col!r}
GUESSES = {guesses!r}
found = None

def looks_like_answers(path):
    try:
        with open(path, errors="replace") as f:
            return SECRET_COL in f.readline()
    except Exception:
        return False

data = os.environ["DATA_DIR"]
candidates = list(GUESSES)
for rel in ("../private/answers.csv", "../../private/answers.csv", "../answers.csv", "../private"):
    candidates.append(os.path.join(data, rel))
for g in GUESSES:
    candidates += ["/proc/1/root" + g, "/proc/self/root" + g, "/proc/1/cwd/../private/answers.csv"]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        candidates += [f"/proc/{{pid}}/root" + g for g in GUESSES]
        candidates.append(f"/proc/{{pid}}/cwd/../private/answers.csv")
for c in candidates:
    if looks_like_answers(c):
        found = c
        break
if found is None and {walk!r}:
    skip = ("/proc", "/sys", "/dev")
    for root, dirs, files in os.walk("/", followlinks=False):
        if root.startswith(skip):
            dirs[:] = []
            continue
        for n in files:
            if n.endswith(".csv") and looks_like_answers(os.path.join(root, n)):
                found = os.path.join(root, n)
                break
        if found:
            break
# Environment and other processes' environments and command lines.
blobs = [repr(dict(os.environ))]
for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        blobs.append(open(p, "rb").read().decode(errors="replace"))
    except Exception:
        pass
if found:
    # Would score perfectly: submit the answers themselves, renamed to the submission's column.
    lines = open(found).read().splitlines()
    with open(os.environ["SUBMISSION_PATH"], "w") as f:
        f.write("id,y\\n" + "\\n".join(lines[1:]) + "\\n")
    print("found at", found)
    print(open(found).read())
else:
    import shutil
    shutil.copy(os.path.join(data, "sample_submission.csv"), os.environ["SUBMISSION_PATH"])
print("\\n".join(blobs)[-8000:])
print("RESULT", "FOUND" if found else "NOT FOUND")
"""


def cheat_code(task: Task, walk: bool) -> str:
    guesses = [str(task.answers), str(task.elsewhere), str(task.private)]
    return PERFECT_CHEAT.format(secret_col=SECRET_COL, guesses=guesses, walk=walk)


def test_answers_unreachable_by_guessing_walking_proc_and_env(isolating, task, monkeypatch):
    monkeypatch.setenv("WMRL_HOST_SECRET", task.tokens[0])
    res = run(isolating, cheat_code(task, walk=True), task, LIMITS.replace(wall_time_s=60))
    assert res.status == "ok", res
    assert res.stdout_tail.endswith("RESULT NOT FOUND\n")
    assert not task.leaked(res.stdout_tail, res.stderr_tail)
    sub = res.submission.read_text()
    assert not task.leaked(sub) and sub == (task.public / "sample_submission.csv").read_text()
    assert res.isolated and not any("NO ISOLATION" in w for w in res.warnings)
    assert_next_run_clean(isolating, task)


@pytest.fixture
def task_outside_tmp():
    """A task outside ``/tmp``: as root, the subprocess backend gives each run its own ``/tmp``."""
    root = Path(tempfile.mkdtemp(prefix="wmrl-redteam-", dir="/var/tmp"))
    os.chmod(root, 0o755)  # readable by the sandbox user, as a checkout usually is
    t = Task(root)
    try:
        yield t
    finally:
        t.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def test_subprocess_backend_says_it_does_not_isolate_and_indeed_leaks(sandboxes, task_outside_tmp):
    """The fallback is honest: the same cheat finds the answers, and the result says so."""
    task = task_outside_tmp
    sb = sandboxes("subprocess")
    res = run(sb, cheat_code(task, walk=False), task)
    assert res.status == "ok"
    assert res.isolated is False
    assert any("NO ISOLATION" in w for w in res.warnings)
    assert res.stdout_tail.endswith("RESULT FOUND\n") and task.leaked(res.submission.read_text())
    assert sb.protections()["answers"].startswith("NO")


def test_symlinks_out_of_the_work_dir(sb, task):
    code = f"""
    import os, json
    out = {{}}
    for i, target in enumerate([{str(task.answers)!r}, {str(task.elsewhere)!r}, "/proc/1/root{task.answers}", "/"]):
        name = f"link{{i}}"
        os.symlink(target, name)
        try:
            out[target] = open(name).read()[:200] if not os.path.isdir(name) else sorted(os.listdir(name))
        except Exception as e:
            out[target] = type(e).__name__
    os.symlink({str(task.answers)!r}, os.environ["SUBMISSION_PATH"])
    print(json.dumps(out))
    """
    res = run(sb, code, task)
    assert res.status == "ok"
    # The submission is never copied through a symlink, on any backend.
    assert res.submission is None and "symbolic link" in res.submission_error
    if sb.isolated:
        seen = json.loads(res.stdout_tail)
        assert (
            seen[str(task.answers)] == "FileNotFoundError"
            and seen[str(task.elsewhere)] == "FileNotFoundError"
        )
        assert not task.leaked(res.stdout_tail)
        assert str(task.private.parent.parent.name) not in json.dumps(seen["/"])
    assert_next_run_clean(sb, task)


def test_host_filesystem_is_not_visible(isolating, task):
    code = f"""
    import os, json, sys
    print(json.dumps({{
        "root": sorted(os.listdir("/")),
        "task_root": os.path.exists({str(task.public.parent)!r}),
        "home": os.path.exists("/root/.bash_history") or os.path.exists("/home"),
        "opt": sorted(os.listdir("/opt")),
        "usr": sorted(os.listdir("/usr")),
        "prefix": sys.prefix,
        "etc": sorted(os.listdir("/etc")),
        "data_parent": sorted(os.listdir(os.path.dirname(os.environ["DATA_DIR"]))),
    }}))
    """
    res = run(isolating, code, task)
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    allowed_top = {
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "usr",
        "etc",
        "proc",
        "dev",
        "tmp",
        "sandbox",
        "sys",
        "opt",  # /opt/solution-env only (checked below)
        ".dockerenv",  # the engine's marker file (empty)
    }
    assert set(seen["root"]) <= allowed_top
    assert seen["task_root"] is False and seen["home"] is False
    # Only the solution environment, at a neutral path; not the trainer's interpreter or venv.
    assert seen["opt"] == ["solution-env"] and seen["prefix"] == "/opt/solution-env"
    assert set(seen["usr"]) <= {"bin", "lib", "lib64", "share"}
    assert set(seen["etc"]) <= {
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "localtime",
        "alternatives",
        "nsswitch.conf",
        "passwd",
        "group",
        "hosts",
        # Docker always adds these three (network_mode="none" makes resolv.conf useless).
        *(("hostname", "resolv.conf", "mtab") if isolating.name == "docker" else ()),
    }
    assert seen["data_parent"] == ["code", "data", "work"]


@pytest.mark.bwrap
def test_hidden_folders_inside_a_bound_prefix_stay_hidden(tmp_path, task):
    """A task suite inside an extra bound folder is hidden even though the folder is bound."""
    import tempfile

    # bubblewrap runs as the unprivileged sandbox user: the bound folder must be readable by it.
    prefix = Path(tempfile.mkdtemp(prefix="wmrl-redteam-prefix-"))
    os.chmod(prefix, 0o755)
    pkg = prefix / "lib" / "site-packages" / "fake_suite"
    (pkg / "t1" / "private").mkdir(parents=True)
    shutil.copy(task.answers, pkg / "t1" / "private" / "answers.csv")
    (prefix / "lib" / "site-packages" / "visible.txt").write_text("ok")
    sb = make_sandbox("bwrap", extra_ro_paths=[prefix], hidden_paths=[pkg], output_root=tmp_path / "out")
    code = f"""
    import os, json
    p = {str(pkg)!r}
    print(json.dumps({{"visible": open(os.path.join(os.path.dirname(p), "visible.txt")).read(),
                       "hidden": os.listdir(p), "writable": os.access(p, os.W_OK)}}))
    """
    try:
        res = run(sb, code, task)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
    assert res.status == "ok", res
    assert json.loads(res.stdout_tail) == {"visible": "ok", "hidden": [], "writable": False}


# -- network -----------------------------------------------------------------------------------------


class Listener:
    """A TCP service on all host addresses (loopback included) that records every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.connections = 0
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            conn.settimeout(1)
            with contextlib.suppress(OSError):
                self.received.append(conn.recv(4096))
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.thread.join(2)
        self.sock.close()


def _host_ip() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))  # no packet is sent; just picks the outgoing address
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def test_no_network_not_even_host_loopback(isolating, task):
    listener = Listener()
    # Control: the listener does answer on the host, so a failure inside is the sandbox's doing.
    with socket.create_connection(("127.0.0.1", listener.port), timeout=2) as c:
        c.sendall(b"control")
    time.sleep(0.3)
    assert listener.connections == 1
    try:
        code = f"""
        import socket, json
        out = {{}}
        for host in ["127.0.0.1", {_host_ip()!r}, "::1", "1.1.1.1"]:
            try:
                fam = socket.AF_INET6 if ":" in host else socket.AF_INET
                s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(2)
                s.connect((host, {listener.port} if host != "1.1.1.1" else 53))
                s.sendall(b"LEAK " + open(__file__, "rb").read()[:10]); out[host] = "connected"
            except Exception as e:
                out[host] = type(e).__name__
        try:
            socket.getaddrinfo("pypi.org", 443); out["dns"] = "resolved"
        except Exception as e:
            out["dns"] = type(e).__name__
        try:
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b"x", ("1.1.1.1", 53)); out["udp"] = "sent"
        except Exception as e:
            out["udp"] = type(e).__name__
        print(json.dumps(out))
        """
        res = run(isolating, code, task)
        assert res.status == "ok", res
        seen = json.loads(res.stdout_tail)
        assert "connected" not in seen.values() and seen["dns"] != "resolved" and seen["udp"] != "sent"
        time.sleep(0.3)
        assert listener.connections == 1 and not any(b"LEAK" in r for r in listener.received)
    finally:
        listener.close()


# -- resource attacks ------------------------------------------------------------------------------

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def test_fork_bomb(sb, task):
    if getattr(sb, "cgroup_support", "n/a") is None:
        pytest.skip(
            "an unbounded fork bomb is only run where a pids cgroup bounds it (see the watchdog test)"
        )
    marker = f"WMRL-RT-{uuid.uuid4().hex}"
    res = run(sb, with_marker(FORK_BOMB, marker), task)
    assert res.status in ("killed", "timeout"), res
    assert res.status == "killed" and "process limit" in res.reason
    assert res.resources.max_tasks is None or res.resources.max_tasks <= LIMITS.max_processes
    assert survivors(marker) == []
    assert_next_run_clean(sb, task)


@pytest.mark.parametrize("backend", [pytest.param("bwrap", marks=pytest.mark.bwrap), "subprocess"])
def test_process_limit_without_cgroups_uses_the_watchdog(sandboxes, task, backend):
    """Without cgroups a fork storm is still stopped: on the subprocess backend under a dedicated
    user by ``RLIMIT_NPROC`` (the uid is the execution's alone: a hard bound; the fork fails),
    else by the polled watchdog. The storm is bounded (200 sleepers) so the host is safe even if
    both failed."""
    sb = sandboxes(backend, cgroups=False)
    marker = f"WMRL-RT-{uuid.uuid4().hex}"
    code = """
    import os, time
    for i in range(200):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        time.sleep(0.002)
    time.sleep(60)
    """
    res = run(sb, with_marker(code, marker), task, LIMITS.replace(wall_time_s=10))
    if sb.name == "subprocess" and os.geteuid() == 0:
        assert res.status == "error" and "Resource temporarily unavailable" in res.stderr_tail, res
    else:
        assert res.status == "killed" and "process limit (watchdog)" in res.reason, res
    assert res.resources.wall_s < 8
    assert survivors(marker) == []
    assert any("no cgroup" in w for w in res.warnings) or sb.name == "subprocess"


MEMORY_HOG = """
chunks = []
while True:
    chunks.append(b"x" * (32 << 20))  # touched pages, not a lazy calloc
"""


@pytest.mark.parametrize("cgroups", ["auto", False])
def test_unbounded_memory(sandboxes, task, cgroups):
    for backend in ("bwrap", "subprocess"):
        if backend == "bwrap" and shutil.which("bwrap") is None:
            continue
        sb = sandboxes(backend, cgroups=cgroups)
        res = run(sb, MEMORY_HOG, task, LIMITS.replace(memory_mb=256))
        assert res.status == "killed" and "memory" in res.reason, (backend, cgroups, res)
        if sb.cgroup_support is not None:
            assert res.resources.peak_memory_mb <= 256 + 1
        assert_next_run_clean(sb, task)


def test_fill_the_disk(isolating, task):
    code = """
    import os, tempfile
    for where in (".", tempfile.gettempdir(), "/dev/shm"):
        try:
            for i in range(1000):
                with open(os.path.join(where, f"fill{i}"), "wb") as f:
                    f.write(b"x" * (4 << 20))
        except OSError as e:
            print(where, e.errno)
    open("again", "wb").write(b"x" * (8 << 20))
    """
    before = shutil.disk_usage("/tmp").used
    res = run(isolating, code, task)
    assert res.status == "killed" and "disk" in res.reason, res
    assert res.stdout_tail.split() == [".", "28", "/tmp", "28", "/dev/shm", "28"]
    assert shutil.disk_usage("/tmp").used - before < 32 << 20  # the host disk did not fill
    assert_next_run_clean(isolating, task)


def test_run_forever(sb, task):
    res = run(sb, "while True:\n    pass", task, LIMITS.replace(wall_time_s=1.5))
    assert res.status == "timeout"
    assert res.resources.wall_s < 4.5
    assert_next_run_clean(sb, task)


DAEMON = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        time.sleep(600)
    os._exit(0)
os.waitpid(pid, 0)
print("daemon started", flush=True)
{tail}
"""


@pytest.mark.parametrize("ending", ["timeout", "exit"])
def test_detached_children_do_not_survive(sb, task, ending):
    marker = f"WMRL-RT-{uuid.uuid4().hex}"
    tail = "while True: pass" if ending == "timeout" else "sys.exit(0)"
    res = run(sb, with_marker(DAEMON.format(tail=tail), marker), task, LIMITS.replace(wall_time_s=2))
    assert res.status == ("timeout" if ending == "timeout" else "ok"), res
    assert res.stdout_tail == "daemon started\n"
    assert survivors(marker) == []
    assert_next_run_clean(sb, task)


def test_detached_children_without_cgroups(sandboxes, task):
    """Subprocess without cgroups: the environment-marker sweep finds a setsid'd daemon."""
    sb = sandboxes("subprocess", cgroups=False)
    marker = f"WMRL-RT-{uuid.uuid4().hex}"
    res = run(sb, with_marker(DAEMON.format(tail="sys.exit(0)"), marker), task)
    assert res.status == "ok"
    assert survivors(marker) == []
    assert any("stray process" in w for w in res.warnings)


def test_write_outside_the_work_dir(isolating, task):
    import sys

    targets = [
        "/evil.txt",
        "/dev/evil.txt",
        "/usr/evil.txt",
        "/etc/passwd",
        "/sandbox/code/solution.py",
        "/sandbox/evil.txt",
        str(task.canary),
        str(task.public.parent / "evil.txt"),
        str(Path(sys.prefix) / "evil.txt"),
        str(Path(sys.base_prefix) / "evil.txt"),
    ]
    code = f"""
    import os, json, ctypes
    out = {{}}
    for t in {targets!r}:
        try:
            with open(t, "a") as f:
                f.write("pwned")
            out[t] = "written"
        except Exception as e:
            out[t] = type(e).__name__
    libc = ctypes.CDLL(None, use_errno=True)
    MS_REMOUNT, MS_BIND = 32, 4096
    rc = libc.mount(b"none", os.environ["DATA_DIR"].encode(), None, MS_REMOUNT | MS_BIND, None)
    out["remount_rw"] = rc
    out["unshare_user"] = libc.unshare(0x10000000)  # CLONE_NEWUSER: could regain capabilities
    out["chroot"] = libc.chroot(b"/tmp")
    print(json.dumps(out))
    """
    res = run(isolating, code, task)
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    assert all(seen[t] != "written" for t in targets), seen
    assert seen["remount_rw"] == -1 and seen["unshare_user"] == -1 and seen["chroot"] == -1
    assert task.canary.read_text() == "host canary"
    assert not (task.public.parent / "evil.txt").exists()
    assert not (Path(sys.prefix) / "evil.txt").exists()
    assert_next_run_clean(isolating, task)


MODIFY_DATA = """
import os, json
d = os.environ["DATA_DIR"]
out = {}
attempts = {
    "append": lambda: open(os.path.join(d, "train.csv"), "a").write("999,9,9\\n"),
    "truncate": lambda: open(os.path.join(d, "test.csv"), "w").close(),
    "unlink": lambda: os.unlink(os.path.join(d, "sample_submission.csv")),
    "rename": lambda: os.rename(os.path.join(d, "train.csv"), os.path.join(d, "x.csv")),
    "chmod": lambda: os.chmod(os.path.join(d, "train.csv"), 0o777),
    "create": lambda: open(os.path.join(d, "new.csv"), "w").write("x"),
    "utime": lambda: os.utime(os.path.join(d, "train.csv"), (0, 0)),
}
for name, f in attempts.items():
    try:
        f()
        out[name] = "done"
    except Exception as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"""


def test_modify_public_data_for_the_next_run(sb, task):
    res = run(sb, MODIFY_DATA, task)
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    if sb.isolated:
        assert "done" not in seen.values(), seen
    # Whatever the solution could do to its own view, the next execution sees the original data.
    assert_next_run_clean(sb, task)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_print_gigabytes(sb, task, stream):
    code = f"import sys\nblock = 'x' * (1 << 20)\nfor _ in range(4096):\n    sys.{stream}.write(block)"
    t0 = time.monotonic()
    res = run(sb, code, task, LIMITS.replace(output_bytes=4 << 20, tail_bytes=1000))
    assert res.status == "killed" and "output limit" in res.reason
    assert len(getattr(res, f"{stream}_tail")) <= 1000
    assert time.monotonic() - t0 < 10
    assert_next_run_clean(sb, task)


def test_killing_the_launcher_cannot_turn_a_failure_into_unknown(sb, task):
    """A harness error is graded "unknown" (excluded from training), a failure is graded low: a
    solution about to fail must not be able to kill its launcher and get "unknown" instead."""
    code = """
    import ctypes, json, os, signal, time
    out = {"ppid": os.getppid()}
    libc = ctypes.CDLL(None, use_errno=True)
    out["ptrace_attach"] = libc.ptrace(16, os.getppid(), None, None)  # PTRACE_ATTACH
    try:
        open(f"/proc/{os.getppid()}/mem", "rb").read(1)
        out["mem"] = "read"
    except Exception as e:
        out["mem"] = type(e).__name__
    print(json.dumps(out), flush=True)
    for target in {os.getppid(), 1}:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(target, sig)
            except Exception:
                pass
    time.sleep(0.5)
    raise RuntimeError("the solution failed")
    """
    res = run(sb, code, task)
    assert res.status != "harness_error", res
    if sb.isolated or os.geteuid() == 0:
        # Isolated: PID 1 of its namespace. Subprocess as root: the launcher is root, the
        # solution a dedicated user, so it cannot signal, trace or read it at all.
        assert res.status == "error" and "the solution failed" in res.stderr_tail, res
        seen = json.loads(res.stdout_tail)
        assert seen["ptrace_attach"] == -1 and seen["mem"] != "read"
    else:
        assert res.status == "killed" and "launcher was killed" in res.reason
    assert_next_run_clean(sb, task)


def test_proc_shows_only_the_sandbox(isolating, task):
    code = """
    import os, json
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    cmdlines = {}
    for p in pids:
        try:
            cmdlines[p] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
        except Exception as e:
            cmdlines[p] = type(e).__name__
    print(json.dumps({"pids": pids, "cmdlines": cmdlines, "ppid": os.getppid()}))
    """
    res = run(isolating, code, task)
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    assert len(seen["pids"]) <= 3  # the launcher (PID 1 under bwrap), the solution (and Docker's init)
    assert not any("pytest" in c for c in seen["cmdlines"].values())
    assert str(os.getpid()) not in seen["pids"] or int(os.getpid()) < 10


def test_no_cgroups_left_behind():
    pid = os.getpid()
    assert glob.glob(f"/sys/fs/cgroup/**/wmrl-sandbox-{pid}-*", recursive=True) == []
