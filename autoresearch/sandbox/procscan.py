"""Reading the host's process table from ``/proc`` (Linux), without psutil.

Used to find every process of one execution (its descendants), to measure them (tasks, resident
memory) when no cgroup does it for us, and to find and kill stray processes by a marker.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

__all__ = [
    "ProcInfo",
    "descendants",
    "find_by_cmdline",
    "find_by_environ",
    "find_by_uid",
    "kill_pids",
    "read_proc",
    "snapshot",
    "uid_of",
]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class ProcInfo:
    """One process as read from ``/proc/<pid>/stat``. ``rss_bytes`` is the resident set."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    threads: int
    rss_bytes: int
    state: str


def read_proc(pid: int) -> ProcInfo | None:
    """Parse ``/proc/<pid>/stat``; ``None`` when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces and ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return ProcInfo(
            pid=pid,
            state=rest[0].decode(),
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            sid=int(rest[3]),
            threads=int(rest[17]),
            rss_bytes=int(rest[21]) * _PAGE,
        )
    except (IndexError, ValueError):
        return None


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def snapshot() -> dict[int, ProcInfo]:
    """Every live process on the host, by pid."""
    out = {}
    for pid in _pids():
        info = read_proc(pid)
        if info is not None:
            out[pid] = info
    return out


def descendants(root: int, table: dict[int, ProcInfo] | None = None) -> list[ProcInfo]:
    """``root`` and all its live descendants (zombies excluded)."""
    table = snapshot() if table is None else table
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    out, stack, seen = [], [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        node = table.get(pid)
        if node is not None and node.state != "Z":
            out.append(node)
        stack.extend(children.get(pid, ()))
    return out


def _read_nul_list(path: str) -> list[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def find_by_environ(entry: str) -> list[int]:
    """Pids whose initial environment contains the exact ``NAME=value`` entry."""
    needle = entry.encode()
    me = os.getpid()
    return [pid for pid in _pids() if pid != me and needle in _read_nul_list(f"/proc/{pid}/environ")]


def find_by_cmdline(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` as a substring (zombies have none and are skipped)."""
    needle = marker.encode()
    me = os.getpid()
    out = []
    for pid in _pids():
        if pid == me:
            continue
        if any(needle in part for part in _read_nul_list(f"/proc/{pid}/cmdline")):
            out.append(pid)
    return out


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to each pid; return how many were signalled."""
    n = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    return n


def uid_of(pid: int, *, zombies: bool = False) -> int | None:
    """The real uid of ``pid`` (``/proc/<pid>/status``); ``None`` when it is gone, or a zombie
    unless ``zombies``."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"State:") and line.split()[1] == b"Z" and not zombies:
                    return None  # dead, waiting to be reaped: nothing to kill
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def find_by_uid(uid: int, *, zombies: bool = False) -> list[int]:
    """Pids of processes whose real uid is ``uid``: live ones, and zombies too with ``zombies``
    (a zombie still counts against its uid's ``RLIMIT_NPROC`` until its parent reaps it)."""
    me = os.getpid()
    return [pid for pid in _pids() if pid != me and uid_of(pid, zombies=zombies) == uid]
