"""Everything a dedicated sandbox uid owns on the host, removed before that uid runs again.

A solution on the subprocess backend shares the host's ``/tmp``, ``/dev/shm`` and (without a
private IPC namespace) its System V IPC: what it leaves there outlives the execution and its
cgroup, stays resident, and is charged to a uid that a later execution -- an isolated one too --
reuses (round three of the red team). The isolated backends give each execution private copies
of all of these; the purge is what makes a reused uid start clean whatever ran as it before.

:func:`purge_uid` kills the uid's processes, removes its System V shared memory, message queues
and semaphore sets, and deletes every file and folder it owns in the host's world-writable
folders (:data:`WORLD_WRITABLE_ROOTS`, and any world-writable folder below them: those are the
only places an unprivileged uid can create entries that outlive its own folders). It runs as
root, never follows a symbolic link, and never enters a folder the uid could not write.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import procscan

__all__ = ["WORLD_WRITABLE_ROOTS", "Purged", "purge_uid", "remove_tree", "sysv_objects"]

#: Host folders any user may create entries in (the sticky temp folders, POSIX shared memory
#: and message queues, lock folders).
WORLD_WRITABLE_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock", "/var/lock")
_IPC_RMID = 0
# /proc/sysvipc/<kind>: the column of the object's id, and the control call that removes it.
_SYSV = {"shm": ("shmid", "shmctl"), "msg": ("msqid", "msgctl"), "sem": ("semid", "semctl")}
# How deep the file sweep goes below a root (a solution could nest world-writable folders).
_MAX_DEPTH = 32
# A tree bigger than this takes a solution longer to make than its own wall time allows.
_REMOVE_TIMEOUT_S = 300


@dataclass
class Purged:
    """What :func:`purge_uid` removed (counts), and what it could not remove (messages)."""

    processes: int = 0
    ipc_objects: int = 0
    paths: int = 0
    unreaped: int = 0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str | None:
        """One line for the execution's warnings, or ``None`` when nothing was left behind."""
        if not (self.processes or self.ipc_objects or self.paths or self.failures or self.unreaped):
            return None
        text = (
            f"removed what the sandbox user left on the host: {self.processes} process(es), "
            f"{self.ipc_objects} System V IPC object(s), {self.paths} file(s) or folder(s)"
        )
        if self.unreaped:
            text += f"; {self.unreaped} dead process(es) not yet reaped by their parent"
        return text + (f"; could not remove: {'; '.join(self.failures[:5])}" if self.failures else "")


def sysv_objects(uid: int) -> list[tuple[str, int]]:
    """``(kind, id)`` of every System V IPC object of this IPC namespace owned or created by ``uid``."""
    found = []
    for kind, (id_column, _) in _SYSV.items():
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        header = lines[0].split()
        try:
            at_id, at_uid, at_cuid = header.index(id_column), header.index("uid"), header.index("cuid")
        except ValueError:
            continue
        for line in lines[1:]:
            cols = line.split()
            with contextlib.suppress(IndexError, ValueError):
                if uid in (int(cols[at_uid]), int(cols[at_cuid])):
                    found.append((kind, int(cols[at_id])))
    return found


def _remove_sysv(kind: str, ident: int) -> str | None:
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, _SYSV[kind][1])
    rc = call(ident, 0, _IPC_RMID, None) if kind == "sem" else call(ident, _IPC_RMID, None)
    if rc != 0:
        err = ctypes.get_errno()
        return f"{kind} {ident}: {os.strerror(err)}"
    return None


def remove_tree(path: str | os.PathLike, *, dir_fd: int | None = None) -> str | None:
    """Remove ``path`` (a file, a link or a whole folder); ``None``, or why it could not. Never raises.

    Through coreutils' ``rm -rf --one-file-system``, not ``shutil.rmtree``: on Python 3.11 that
    (and ``os.walk``) recurses once per level, and a solution's tree a few thousand folders deep
    raised ``RecursionError`` out of the cleanup -- a harness error on demand, and a uid that was
    never handed back (round three). ``rm`` walks iteratively and never follows a link below the
    name it is given; without root, ``chmod -R u+rwX`` first makes read-only folders (data
    copies) removable (``-R`` does not follow links either).

    With ``dir_fd``, ``path`` is a plain name in the folder that descriptor holds, and ``rm``
    starts there (its working folder is the descriptor itself, never a path looked up again): a
    folder on the way that someone swaps for a link cannot send it elsewhere.
    """
    path = os.fspath(path)
    if dir_fd is not None and ("/" in path or path in ("", ".", "..")):
        raise ValueError(f"with dir_fd, path must be a plain name; got {path!r}")
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    where: dict[str, Any] = (
        {"cwd": f"/proc/self/fd/{dir_fd}", "pass_fds": (dir_fd,)} if dir_fd is not None else {}
    )
    steps = [["rm", "-rf", "--one-file-system", "--", path]]
    if os.geteuid() != 0 and not stat.S_ISLNK(st.st_mode):
        steps.insert(0, ["chmod", "-R", "u+rwX", "--", path])
    for argv in steps:
        try:
            subprocess.run(argv, capture_output=True, timeout=_REMOVE_TIMEOUT_S, check=False, **where)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{argv[0]}: {exc}"
    try:
        os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError:
        pass
    return f"{path} is still there"


def _sweep(folder_fd: int, where: str, uid: int, gid: int, out: Purged, depth: int) -> None:
    """Delete ``uid``'s entries in the folder ``folder_fd`` holds; enter folders the uid (or anyone)
    may write. Every step is relative to a descriptor opened without following links: a folder
    that a solution swaps for a link while this runs is never followed (round three: a concurrent
    run swapped one and ``rm`` removed a root-owned tree the link pointed at)."""
    try:
        names = [entry.name for entry in os.scandir(folder_fd)]
    except OSError:
        return
    for name in names:
        try:
            st = os.lstat(name, dir_fd=folder_fd)
        except OSError:
            continue
        if st.st_uid == uid:
            problem = remove_tree(name, dir_fd=folder_fd)
            if problem is None:
                out.paths += 1
            else:
                out.failures.append(f"{where}/{problem}")
            continue
        writable_by_uid = st.st_mode & stat.S_IWOTH or (st.st_gid == gid and st.st_mode & stat.S_IWGRP)
        if stat.S_ISDIR(st.st_mode) and writable_by_uid and depth < _MAX_DEPTH:
            try:
                inner = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd
                )
            except OSError:
                continue  # swapped for something else meanwhile: not entered
            try:
                _sweep(inner, f"{where}/{name}", uid, gid, out, depth + 1)
            finally:
                os.close(inner)


def _wait_for_no_processes(uid: int, timeout_s: float) -> list[int]:
    """Wait until no process of ``uid`` is left, zombies included; the ones still there after
    ``timeout_s`` (a parent that does not reap them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = procscan.find_by_uid(uid, zombies=True)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def purge_uid(
    uid: int, gid: int, roots: tuple[str, ...] = WORLD_WRITABLE_ROOTS, *, zombie_wait_s: float = 1.0
) -> Purged:
    """Remove everything ``uid`` left on this host (see the module docstring). Root only.

    Args:
        uid, gid: the dedicated sandbox user (never an account: the caller holds it exclusively).
        roots: the world-writable folders to sweep.
        zombie_wait_s: how long to wait for the uid's dead processes to be reaped by their parents
            (``Purged.unreaped`` counts those still there).
    """
    if os.geteuid() != 0:
        raise PermissionError("purging a sandbox user's leftovers needs root")
    if uid < 1000:
        raise ValueError(f"refusing to purge uid {uid}: not a dedicated sandbox user")
    out = Purged()
    strays = procscan.find_by_uid(uid)
    if strays:
        procscan.kill_pids(strays)
        out.processes = len(strays)
    for kind, ident in sysv_objects(uid):
        problem = _remove_sysv(kind, ident)
        if problem is None:
            out.ipc_objects += 1
        else:
            out.failures.append(problem)
    for root in roots:
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # not on this machine (or a link: never followed)
        try:
            _sweep(fd, root, uid, gid, out, 0)
        finally:
            os.close(fd)
    # A zombie still counts against the uid's RLIMIT_NPROC (the subprocess backend's hard task
    # bound): until its parent reaps it, a run handed this uid could fork that many fewer tasks.
    out.unreaped = len(_wait_for_no_processes(uid, timeout_s=zombie_wait_s))
    return out
