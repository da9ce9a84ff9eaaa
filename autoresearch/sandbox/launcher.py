"""In-sandbox launcher: runs one solution and reports on a framed channel. Standard library only.

This file runs *inside* the sandbox (bubblewrap binds it read-only; Docker mounts it; the subprocess
backend runs it in place), with the sandbox's interpreter and environment, before any untrusted
code. It must not import WMRL. It:

1. forks the solution (``python solution.py``) into its own process group, with its stdout and
   stderr on pipes owned by the launcher, stdin from ``/dev/null``, resource limits applied in the
   child (``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE``, optionally ``RLIMIT_AS`` and
   ``RLIMIT_NPROC``), pinned to the given CPUs, switched to the given unprivileged user (subprocess
   backend), under the seccomp filter the host compiled (installed last, right before ``exec``),
   with every other file descriptor closed. Whether that set-up and the ``exec`` succeeded comes
   back on a close-on-exec *status pipe* that only the launcher holds: a failure there is ours
   (``harness_error`` in the exit frame), and nothing the solution prints or returns can look
   like one;
2. relays the solution's output to its own stdout as frames, so the solution can never forge a
   frame (it never holds the launcher's stdout);
3. enforces the wall-time limit (kills the solution's process group) — the host keeps a harder
   deadline of its own in case this process is stopped; under bubblewrap and Docker it is PID 1
   of the namespace, which the solution cannot signal: the kernel drops signals to a
   namespace's init that it has no handler for (so it restores SIGINT's default), and the
   seccomp filter refuses every signal, pidfd and ``prlimit`` aimed at PID 1. It is made
   non-dumpable so the solution cannot ptrace it or open its descriptors, and it reaps orphans.
   It sends ``started`` *before* the solution may ``exec``: a launcher that stops without its exit
   frame after that is the solution's failure, never the harness's;
4. after the solution ends, kills whatever is left in its process group, then streams a copy of
   the submission file (a regular file only, never through a symlink, not sparse, at most
   ``submission_cap`` bytes: a bigger or sparse one is refused before a byte is sent) and a final
   exit frame with the wait status, ``rusage`` and the status pipe's verdict.

Frame: one kind byte, a 4-byte big-endian payload length, the payload. Kinds: ``s`` started
(JSON), ``o`` stdout bytes, ``e`` stderr bytes, ``f`` submission bytes, ``x`` exit (JSON, last).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import time

FRAME = struct.Struct(">cI")
KIND_STARTED = b"s"
KIND_STDOUT = b"o"
KIND_STDERR = b"e"
KIND_SUBMISSION = b"f"
KIND_EXIT = b"x"
CHUNK = 65536
# After the solution exits, how long to keep reading output that its leftover children may
# still be writing to the inherited pipes, before the launcher stops listening.
DRAIN_GRACE_S = 0.2
EXIT_CODE_BAD_CONFIG = 96
EXIT_CODE_EXEC_FAILED = 127
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
SECCOMP_MODE_FILTER = 2
CLONE_NEWIPC = 0x08000000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 1 << 18
MNT_DETACH = 2


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]


def send(kind: bytes, payload: bytes) -> None:
    """Write one frame to fd 1 (the host's pipe)."""
    _write_all(1, FRAME.pack(kind, len(payload)) + payload)


def _rusage_dict(ru) -> dict:
    return {"utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss}


def _seccomp_loader(program: bytes | None):
    """A function that installs ``program`` (classic BPF from libseccomp) in the calling process.

    Everything that allocates is done here, before the fork; the returned call only makes two
    ``prctl`` calls.
    """
    if not program:
        return None
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

    def install() -> None:
        keep = (buf, prog)  # noqa: F841 - the buffers must outlive the call
        if prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

    return install


def _child(cfg: dict, out_w: int, err_w: int, status_w: int, go_r: int, install_filter) -> None:
    """In the forked child: set up limits and descriptors, then exec the solution. Never returns.

    ``status_w`` is close-on-exec: it closes by itself when ``exec`` succeeds, and carries the
    reason when anything before it fails. ``go_r`` gives one byte once the launcher has sent its
    ``started`` frame: no solution code runs before the host knows it started, so whatever stops
    the launcher from then on is the solution's doing (see ``supervisor.classify``).
    """
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        keep = sorted((status_w, go_r))
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, 65536)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for name, value in (cfg.get("rlimits") or {}).items():
            if value is not None:
                resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        try:
            # Make the solution the first choice of the OOM killer, not the launcher.
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        drop = cfg.get("drop_privileges")
        if drop:
            os.setgroups([])
            os.setresgid(drop[1], drop[1], drop[1])
            os.setresuid(drop[0], drop[0], drop[0])
            if os.getuid() != drop[0] or os.geteuid() != drop[0]:
                raise OSError("the user switch did not take effect")
        os.chdir(cfg["cwd"])
        argv = [cfg["python"], *cfg.get("python_args", []), cfg["solution"]]
        if os.read(go_r, 1) != b"g":
            raise OSError("the launcher did not confirm the start")
        os.close(go_r)
        if install_filter is not None:
            install_filter()
        os.execv(cfg["python"], argv)
    except BaseException as exc:  # report on the status pipe and leave without running more Python
        try:
            os.write(status_w, f"could not start the solution: {exc!r}".encode()[:4000])
        finally:
            os._exit(EXIT_CODE_EXEC_FAILED)


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _private_ipc() -> str | None:
    """Move this process (and so the solution) into a new IPC namespace; ``None`` or why not.

    For the subprocess backend running as root: System V IPC and POSIX message queues made by the
    solution then die with the namespace instead of outliving the execution on the host.
    """
    try:
        ctypes, libc = _libc()
        if libc.unshare(CLONE_NEWIPC) != 0:
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError, ImportError) as exc:
        return repr(exc)
    return None


def _private_tmp(size_bytes: int, keep: list[str]) -> str | None:
    """Give this process (and so the solution) its own empty ``/tmp`` and ``/dev/shm``; ``None`` or why not.

    A new mount namespace (nothing propagates back to the host) with a tmpfs of ``size_bytes`` on
    each; the folders in ``keep`` that lay under them (the execution's own stage: work dir, code,
    data copy) are bound back at their paths. What the solution leaves there dies with the
    namespace. For the subprocess backend running as root.
    """
    try:
        ctypes, libc = _libc()
        libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

        def mount(source, target, fstype, flags, data=None) -> None:
            enc = [x.encode() if isinstance(x, str) else x for x in (source, target, fstype, data)]
            if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
                raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")

        hidden = [h for h in ("/tmp", "/dev/shm") if os.path.isdir(h)]
        below = [k for k in keep if any(k == h or k.startswith(h + "/") for h in hidden)]
        if libc.unshare(CLONE_NEWNS) != 0:
            return f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        # Held open (in this namespace) before the tmpfs hides them; bound back through /proc.
        held = {k: os.open(k, os.O_PATH | os.O_DIRECTORY) for k in below}
        mounted = []
        try:
            for target in hidden:
                mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(size_bytes)},mode=1777")
                mounted.append(target)
            for path, fd in held.items():
                os.makedirs(path, mode=0o711, exist_ok=True)
                mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        except OSError:
            for target in reversed(mounted):  # back to the host's view: the run goes on without
                libc.umount2(target.encode(), MNT_DETACH)
            raise
        finally:
            for fd in held.values():
                os.close(fd)
    except (OSError, AttributeError, ImportError) as exc:
        return str(exc)
    return None


def _prctl(option: int, value: int) -> None:
    """``prctl(option, value)`` on this process, best effort (a kernel without it changes nothing)."""
    try:
        _, libc = _libc()
        libc.prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass


def _become_subreaper() -> None:
    """Orphans of the solution become this process's children, reaped in its loop.

    Under bubblewrap and Docker the launcher is PID 1 and this changes nothing; on the subprocess
    backend orphans went to the host's init, which may reap late, and until then they count
    against the sandbox uid's ``RLIMIT_NPROC`` (round three: 63 zombies left a later run unable to
    fork).
    """
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _make_undumpable() -> None:
    """Forbid the (same-uid) solution to ptrace the launcher or read its memory via /proc."""
    _prctl(PR_SET_DUMPABLE, 0)


def _copy_submission(path: str, cap: int) -> dict:
    """Stream the submission file as ``f`` frames; return its summary for the exit frame."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {"present": False}
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return {
                "present": True,
                "error": "the submission path is a symbolic link; only a regular file is accepted",
            }
        return {"present": True, "error": f"could not open the submission: {exc.strerror}"}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {"present": True, "error": "the submission path is not a regular file"}
        if st.st_size > cap:
            return {
                "present": True,
                "error": f"the submission is {st.st_size} bytes, over the {cap}-byte limit",
            }
        # A sparse file costs the solution nothing and the host a real copy: refuse it unread.
        # SEEK_HOLE finds the first hole (the end of the file when there is none).
        try:
            hole = os.lseek(fd, 0, os.SEEK_HOLE)
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            hole = st.st_size
        if hole < st.st_size:
            return {
                "present": True,
                "error": f"the submission is a sparse file (a hole at byte {hole} of {st.st_size}); "
                "write it normally",
            }
        sent = 0
        while sent <= cap:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            sent += len(chunk)
            if sent > cap:  # grew while we read it
                return {
                    "present": True,
                    "error": f"the submission is over the {cap}-byte limit",
                    "bytes": sent,
                }
            send(KIND_SUBMISSION, chunk)
        return {"present": True, "bytes": sent}
    finally:
        os.close(fd)


def run(cfg: dict) -> int:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    # Python handles SIGINT itself; as PID 1 of a namespace the launcher is immune only to the
    # signals it leaves at their default disposition (the kernel drops those from inside).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _become_subreaper()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    wake_r, wake_w = os.pipe()
    for fd in (out_r, err_r, wake_r, wake_w):
        os.set_inheritable(fd, False)
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    started: dict[str, bool | str] = {}
    if cfg.get("private_ipc"):
        problem = _private_ipc()
        started["private_ipc"] = problem is None
        if problem is not None:
            started["private_ipc_problem"] = problem
    if cfg.get("private_tmp"):
        problem = _private_tmp(int(cfg["private_tmp"]["size_bytes"]), list(cfg["private_tmp"]["keep"]))
        started["private_tmp"] = problem is None
        if problem is not None:
            started["private_tmp_problem"] = problem
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    program = bytes.fromhex(cfg["seccomp"]) if cfg.get("seccomp") else None
    install_filter = _seccomp_loader(program)
    start = time.monotonic()
    deadline = start + float(cfg["wall_time_s"])
    pid = os.fork()
    if pid == 0:
        _child(cfg, out_w, err_w, status_w, go_r, install_filter)
    _make_undumpable()
    os.close(out_w)
    os.close(err_w)
    os.close(status_w)
    os.close(go_r)
    # The host hears "started" before the child may exec: from here on, a launcher that stops
    # without its exit frame was stopped by the solution, never by the harness.
    send(KIND_STARTED, json.dumps({"pid": pid, "pgid": pid, **started}).encode())
    _write_all(go_w, b"g")
    os.close(go_w)
    # EOF on the status pipe: exec succeeded (the child's copy closed with it); bytes: it failed.
    failure = b""
    while True:
        try:
            chunk = os.read(status_r, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        failure += chunk
    os.close(status_r)
    # A SIGCHLD wakes the select below at once, so a finished solution is noticed without polling.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)

    open_fds = {out_r: KIND_STDOUT, err_r: KIND_STDERR}
    status = rusage = None
    timed_out = False
    drain_until = None
    while True:
        # Reap every child that ended: the solution, and (as PID 1 of bubblewrap's namespace)
        # orphans re-parented to us, which would otherwise stay zombies and count as tasks.
        while True:
            try:
                got, st, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                got = 0
                if status is None:  # cannot happen unless someone else reaped it
                    status, rusage = 0, None
                    drain_until = time.monotonic() + DRAIN_GRACE_S
            if got == 0:
                break
            if got == pid:
                status, rusage = st, ru
                drain_until = time.monotonic() + DRAIN_GRACE_S
                # Noticed only now, past the deadline: the solution outran its wall time while
                # this process was kept from checking (it never gets the benefit of the doubt).
                timed_out = timed_out or time.monotonic() > deadline
        now = time.monotonic()
        if status is None and now >= deadline:
            timed_out = True
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                with contextlib.suppress(ProcessLookupError):
                    kill()
            _, status, rusage = os.wait4(pid, 0)
            drain_until = time.monotonic() + DRAIN_GRACE_S
            now = time.monotonic()
        if not open_fds and status is not None:
            break
        if drain_until is not None and now >= drain_until:
            break
        limit = drain_until if drain_until is not None else deadline
        try:
            ready, _, _ = select.select([*open_fds, wake_r], [], [], max(0.0, limit - now))
        except InterruptedError:
            continue
        for fd in ready:
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                continue
            data = os.read(fd, CHUNK)
            if data:
                send(open_fds[fd], data)
            else:
                os.close(fd)
                del open_fds[fd]
    # Leftovers that stayed in the solution's process group die with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for fd in open_fds:
        os.close(fd)
    submission = _copy_submission(cfg["submission_path"], int(cfg["submission_cap"]))
    exit_info = {
        "harness_error": failure.decode("utf-8", "replace") if failure else None,
        "wait_status": status,
        "timed_out": timed_out,
        "solution_wall_s": time.monotonic() - start,
        "rusage": _rusage_dict(rusage) if rusage is not None else None,
        "submission": submission,
    }
    send(KIND_EXIT, json.dumps(exit_info).encode())
    return 0


def main(argv: list[str]) -> int:
    try:
        cfg = json.loads(argv[1])
        for key in ("python", "solution", "cwd", "wall_time_s", "submission_path", "submission_cap"):
            if key not in cfg:
                raise KeyError(key)
    except (IndexError, ValueError, KeyError) as exc:
        sys.stderr.write(f"launcher: bad configuration: {exc!r}\n")
        return EXIT_CODE_BAD_CONFIG
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
