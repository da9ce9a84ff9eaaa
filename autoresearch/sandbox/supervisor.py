"""Host side of one execution: spawn, read the launcher's frames, enforce limits, collect.

Every local backend (bubblewrap, subprocess) hands this module a command line whose last stage
is :mod:`.launcher`; the supervisor

- spawns it in a new session, first joining the execution's cgroup (if any) through an ``sh``
  trampoline so that no process of the execution ever runs outside the group;
- reads the launcher's stdout as frames through a pipe, keeping only the tail of the solution's
  stdout/stderr and counting the total — never buffering more than ``Limits.tail_bytes`` per
  stream — and writes submission frames straight into the copy's file;
- kills the execution (through the backend's ``kill`` callable, then the cgroup) when the
  output passes ``Limits.output_bytes``, when the host deadline (wall time + grace) passes
  because the launcher did not stop the solution itself, when the cgroup reports that the task
  limit was hit, or — without a cgroup — when the polled process tree has too many tasks or too
  much resident memory;
- reaps the spawned process with ``wait4`` for its ``rusage``.

:func:`classify` then turns the raw outcome into the status of the result (pure, tested alone).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from . import procscan
from .cgroups import CgroupStats, ExecutionCgroup
from .launcher import (
    FRAME,
    KIND_EXIT,
    KIND_STARTED,
    KIND_STDERR,
    KIND_STDOUT,
    KIND_SUBMISSION,
)
from .limits import Limits

if TYPE_CHECKING:
    import resource

__all__ = ["Classification", "RawOutcome", "SpawnSpec", "Tail", "classify", "supervise"]

# Exit code of the cgroup trampoline when it cannot join the group (a harness error).
TRAMPOLINE_JOIN_FAILED = 97
_TRAMPOLINE = (
    'n=$1; shift; i=0; while [ "$i" -lt "$n" ]; do echo $$ > "$1" || exit '
    + str(TRAMPOLINE_JOIN_FAILED)
    + "; "
    'shift; i=$((i+1)); done; exec "$@"'
)
_MAX_JSON_FRAME = 1 << 20
_MAX_FRAME = 1 << 24
_LAUNCHER_STDERR_TAIL = 16384
_WATCHDOG_INTERVAL_S = 0.05
_CGROUP_POLL_INTERVAL_S = 0.1
_KILL_GRACE_S = 10.0


class Tail:
    """The last ``size`` bytes of a stream, and how many bytes it had in all."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.total = 0
        self._buf = bytearray()

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self._buf += data
        if len(self._buf) > 2 * self.size:
            del self._buf[: len(self._buf) - self.size]

    def bytes(self) -> bytes:
        return bytes(self._buf[-self.size :]) if self.size else b""

    def text(self) -> str:
        return self.bytes().decode("utf-8", errors="replace")


@dataclass
class SpawnSpec:
    """What a backend asks the supervisor to run.

    Attributes:
        argv: the command (its last stage must be the launcher).
        env: the complete environment of the spawned command.
        cwd: host working directory of the spawned command.
        kill: kills the whole execution given the spawned pid and the launcher's ``started``
            frame (or ``None`` before it arrived); must be idempotent.
        after: called once the spawned process was reaped (stray-process cleanup); returns warnings.
        pass_fds: descriptors the spawned command inherits (bubblewrap's ``--args`` pipe); the
            supervisor closes its own copies once the command was spawned (or failed to be).
    """

    argv: list[str]
    env: dict[str, str]
    cwd: str
    kill: Callable[[int, dict | None], None]
    after: Callable[[dict | None], list[str]] | None = None
    pass_fds: tuple[int, ...] = ()


@dataclass
class RawOutcome:
    """Everything observed about one execution, before classification."""

    spawn_error: str | None = None
    wait_status: int | None = None
    host_rusage: resource.struct_rusage | None = None
    wall_s: float = 0.0
    started: dict | None = None
    exit_info: dict | None = None
    stdout: Tail | None = None
    stderr: Tail | None = None
    launcher_stderr: Tail = field(default_factory=lambda: Tail(_LAUNCHER_STDERR_TAIL))
    host_kill: tuple[str, str] | None = None  # (kind, message): kind in timeout/output/memory/processes
    protocol_error: str | None = None
    submission_bytes: int = 0
    submission_over_cap: bool = False
    cgroup_stats: CgroupStats | None = None
    watchdog_max_tasks: int | None = None
    warnings: list[str] = field(default_factory=list)


class _FrameReader:
    """Incremental parser of the launcher's frames."""

    def __init__(self, out: RawOutcome, submission_dest: Path, submission_cap: int) -> None:
        self.out = out
        self.buf = bytearray()
        self.dest = submission_dest
        self.cap = submission_cap
        self._file: IO[bytes] | None = None

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= FRAME.size:
            kind, length = FRAME.unpack_from(self.buf)
            if length > _MAX_FRAME:
                raise ValueError(f"launcher frame of {length} bytes")
            if len(self.buf) < FRAME.size + length:
                return
            payload = bytes(self.buf[FRAME.size : FRAME.size + length])
            del self.buf[: FRAME.size + length]
            self._frame(kind, payload)

    def _frame(self, kind: bytes, payload: bytes) -> None:
        # supervise() and the Docker backend build every RawOutcome they read frames into with both tails
        assert self.out.stdout is not None and self.out.stderr is not None
        if kind == KIND_STDOUT:
            self.out.stdout.add(payload)
        elif kind == KIND_STDERR:
            self.out.stderr.add(payload)
        elif kind == KIND_SUBMISSION:
            if self.out.submission_over_cap:
                return
            if self.out.submission_bytes + len(payload) > self.cap:
                self.out.submission_over_cap = True
                return
            if self._file is None:
                self.dest.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.dest, "wb")  # noqa: SIM115 - closed in close()
            self._file.write(payload)
            self.out.submission_bytes += len(payload)
        elif kind in (KIND_STARTED, KIND_EXIT):
            if len(payload) > _MAX_JSON_FRAME:
                raise ValueError("oversized JSON frame")
            info = json.loads(payload)
            if kind == KIND_STARTED:
                self.out.started = info
            else:
                self.out.exit_info = info
        else:
            raise ValueError(f"unknown launcher frame kind {kind!r}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.buf and self.out.protocol_error is None and self.out.host_kill is None:
            self.out.protocol_error = f"{len(self.buf)} bytes of an incomplete launcher frame"


def relay_chunk(
    out: RawOutcome, reader: _FrameReader, data: bytes, limits: Limits, kill: Callable[[str, str], None]
) -> None:
    """Feed one chunk of the launcher's framed stream; kill on a forged frame or too much output.

    Shared by every backend's host side. After a kill the rest of the stream is drained and ignored.
    """
    if out.host_kill is not None:
        return
    try:
        reader.feed(data)
    except ValueError as exc:
        out.protocol_error = f"bad launcher frame: {exc}"
        kill("protocol", out.protocol_error)
        return
    assert out.stdout is not None and out.stderr is not None  # as in _FrameReader._frame
    if out.stdout.total + out.stderr.total > limits.output_bytes:
        kill(
            "output",
            f"output limit: the solution wrote more than {limits.output_bytes} bytes to stdout/stderr",
        )


def host_deadline_s(limits: Limits) -> float:
    """Seconds after spawn at which the host kills an execution the launcher did not stop.

    Wall time plus room for the sandbox to start (bubblewrap, interpreter) and to copy the
    submission out after a launcher-side timeout.
    """
    return limits.wall_time_s + 5.0 + 0.1 * limits.wall_time_s


def supervise(  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    spec: SpawnSpec,
    limits: Limits,
    *,
    submission_dest: Path,
    cgroup: ExecutionCgroup | None,
    watchdog: bool,
) -> RawOutcome:
    """Run one execution to its end. Never raises for anything the solution does."""
    out = RawOutcome(
        stdout=Tail(limits.tail_bytes),
        stderr=Tail(limits.tail_bytes),
    )
    argv = list(spec.argv)
    if cgroup is not None:
        files = cgroup.procs_files
        argv = ["/bin/sh", "-c", _TRAMPOLINE, "sh", str(len(files)), *files, *argv]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=spec.env,
            cwd=spec.cwd,
            pass_fds=spec.pass_fds,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        out.spawn_error = f"could not start {argv[0]!r}: {exc}"
        return out
    finally:
        for fd in spec.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    reader = _FrameReader(out, submission_dest, limits.submission_bytes)
    killed_at: float | None = None

    def kill(kind: str, message: str) -> None:
        nonlocal killed_at
        if out.host_kill is None:
            out.host_kill = (kind, message)
        if killed_at is None:
            killed_at = time.monotonic()
        with contextlib.suppress(Exception):
            spec.kill(proc.pid, out.started)
        if cgroup is not None:
            cgroup.kill_all(timeout_s=2.0)

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPEs (Popen above)
    fd_out, fd_err = proc.stdout.fileno(), proc.stderr.fileno()
    sel.register(fd_out, selectors.EVENT_READ)
    sel.register(fd_err, selectors.EVENT_READ)
    open_fds = {fd_out, fd_err}
    deadline = t0 + host_deadline_s(limits)
    poll_every = (
        _WATCHDOG_INTERVAL_S if watchdog else (_CGROUP_POLL_INTERVAL_S if cgroup is not None else None)
    )
    next_poll = t0 + (poll_every or 0.0)
    try:
        while open_fds:
            now = time.monotonic()
            if killed_at is not None and now - killed_at > _KILL_GRACE_S:
                out.warnings.append("the execution's output pipes stayed open after it was killed")
                break
            wait = deadline - now if killed_at is None else _KILL_GRACE_S
            if poll_every is not None and killed_at is None:
                wait = min(wait, max(0.0, next_poll - now))
            for key, _ in sel.select(timeout=max(0.0, wait)):
                fd = key.fd
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if fd == fd_err:
                    out.launcher_stderr.add(data)
                    continue
                relay_chunk(out, reader, data, limits, kill)
            now = time.monotonic()
            if killed_at is None and now >= deadline:
                kill(
                    "timeout",
                    f"wall time: the execution ran past {limits.wall_time_s:g} s and was killed by the host",
                )
            if poll_every is not None and killed_at is None and now >= next_poll:
                next_poll = now + poll_every
                if cgroup is not None:
                    stats = cgroup.stats()
                    if stats.pids_limit_hits > 0:
                        kill(
                            "processes",
                            f"process limit: the execution tried to hold more than {limits.max_processes} tasks (processes + threads)",
                        )
                elif watchdog:
                    tree = procscan.descendants(proc.pid)
                    # The spawned process itself (the launcher, or bubblewrap) is ours, not the
                    # solution's: counted, it made a solution at exactly its task limit (which
                    # RLIMIT_NPROC enforces for a dedicated user) look one over, at random.
                    tasks = sum(p.threads for p in tree if p.pid != proc.pid)
                    rss = sum(p.rss_bytes for p in tree)
                    out.watchdog_max_tasks = max(out.watchdog_max_tasks or 0, tasks)
                    if tasks > limits.max_processes:
                        kill("processes", f"process limit (watchdog): {tasks} tasks > {limits.max_processes}")
                    elif rss > limits.memory_bytes:
                        kill(
                            "memory",
                            f"memory limit (watchdog): resident {rss / 2**20:.0f} MiB > {limits.memory_mb} MiB",
                        )
    finally:
        sel.close()
        reader.close()
        if open_fds:  # gave up on the pipes: make sure nothing of the execution survives
            kill(
                out.host_kill[0] if out.host_kill else "timeout",
                out.host_kill[1] if out.host_kill else "pipes held open",
            )
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.wall_s = time.monotonic() - t0
        out.wait_status, out.host_rusage = status, rusage
        proc.stdout.close()
        proc.stderr.close()
        if cgroup is not None:
            if cgroup.pids():
                cgroup.kill_all()
            out.cgroup_stats = cgroup.stats()
        if spec.after is not None:
            out.warnings.extend(spec.after(out.started))
    if out.host_kill is not None or out.exit_info is None:
        # No trustworthy submission without the launcher's final word.
        with contextlib.suppress(FileNotFoundError):
            submission_dest.unlink()
        out.submission_bytes = 0
    return out


# -- classification ------------------------------------------------------------------------------

_MEMORY_RE = re.compile(r"^[\w.]*MemoryError\b")
_FSIZE_RE = re.compile(r"\[Errno 27\]|File too large")
_DISK_RE = re.compile(r"\[Errno 28\]|No space left on device")


@dataclass(frozen=True)
class Classification:
    status: str
    reason: str | None
    exit_code: int | None
    signal: int | None


def _last_line(text: str) -> str:
    for line in reversed(text.strip().splitlines()):
        if line.strip():
            return line.strip()
    return ""


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def classify(out: RawOutcome, limits: Limits) -> Classification:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    """Map a raw outcome to (status, reason, exit code, signal). See :mod:`.result`."""
    if out.spawn_error is not None:
        return Classification("harness_error", out.spawn_error, None, None)
    stats = out.cgroup_stats
    oom = stats is not None and stats.oom_kills > 0
    if out.host_kill is not None:
        kind, message = out.host_kill
        if kind == "protocol":
            if out.started is not None:  # the solution runs only after "started" (see above)
                return Classification(
                    "killed",
                    f"{message} after the solution started; the solution is held responsible",
                    None,
                    None,
                )
            return Classification("harness_error", message, None, None)
        return Classification("timeout" if kind == "timeout" else "killed", message, None, None)
    info = out.exit_info
    if info is None:
        if oom:
            return Classification(
                "killed", "memory limit: the cgroup's OOM killer ended the execution", None, signal.SIGKILL
            )
        if out.started is not None:
            # The launcher sends "started" before the solution may exec: once it did, only the
            # solution can have stopped it (a signal, a lowered limit, a crash it provoked). A
            # harness error here would grade the rollout "unknown" and drop it from training: a
            # lever a policy under RL finds.
            how = (
                f"killed by {_signame(os.WTERMSIG(out.wait_status))}"
                if out.wait_status is not None and os.WIFSIGNALED(out.wait_status)
                else out.protocol_error or "ended"
            )
            return Classification(
                "killed",
                f"the launcher stopped ({how}) after the solution started and before it reported; "
                "the solution is held responsible",
                None,
                None,
            )
        host_code = os.waitstatus_to_exitcode(out.wait_status) if out.wait_status is not None else None
        diag = out.launcher_stderr.text().strip()[-2000:]
        if host_code == TRAMPOLINE_JOIN_FAILED:
            why = "could not join the execution's cgroup"
        else:
            why = (
                out.protocol_error or f"the sandbox exited with code {host_code} before the launcher reported"
            )
        return Classification("harness_error", f"{why}. {diag}".strip(), None, None)
    if info.get("harness_error"):
        # Reported on the launcher's status pipe, which the solution never holds: its set-up or
        # exec failed before any solution code ran.
        return Classification("harness_error", f"launcher: {info['harness_error']}", None, None)
    ws = info.get("wait_status")
    if info.get("timed_out"):
        return Classification(
            "timeout",
            f"wall time: the solution ran past {limits.wall_time_s:g} s; its process group was killed",
            None,
            None,
        )
    if ws is None:
        return Classification("harness_error", "the launcher reported no wait status", None, None)
    if os.WIFSIGNALED(ws):
        sig = os.WTERMSIG(ws)
        if sig == signal.SIGKILL and oom:
            return Classification(
                "killed", "memory limit: the cgroup's OOM killer killed the solution", -sig, sig
            )
        if sig == signal.SIGXFSZ:
            return Classification(
                "killed", f"file size limit: a file grew past {limits.file_size_mb} MiB", -sig, sig
            )
        return Classification("killed", f"killed by {_signame(sig)}", -sig, sig)
    code = os.WEXITSTATUS(ws) if os.WIFEXITED(ws) else None
    if code == 0:
        return Classification("ok", None, 0, None)
    stderr_tail = out.stderr.text() if out.stderr is not None else ""
    if oom:
        return Classification(
            "killed", "memory limit: the cgroup's OOM killer killed a process of the solution", code, None
        )
    if stats is not None and stats.pids_limit_hits > 0:
        return Classification(
            "killed",
            f"process limit: the solution tried to hold more than {limits.max_processes} tasks",
            code,
            None,
        )
    last = _last_line(stderr_tail)
    if _MEMORY_RE.search(last):
        return Classification(
            "killed", f"memory limit: the solution ran out of memory ({last[:200]})", code, None
        )
    if _FSIZE_RE.search(last):
        return Classification(
            "killed",
            f"file size limit: a write past {limits.file_size_mb} MiB failed ({last[:200]})",
            code,
            None,
        )
    if _DISK_RE.search(last):
        return Classification(
            "killed",
            f"disk limit: the scratch space ({limits.disk_mb} MiB) is full ({last[:200]})",
            code,
            None,
        )
    return Classification("error", None, code, None)
