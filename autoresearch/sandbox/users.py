"""Unprivileged host users for solutions: one dedicated uid/gid per concurrent execution.

A solution must never run as host root: root in a user namespace is still host root to every
host-wide kernel object that is keyed by uid (``/proc/sys`` files, kernel keyrings, the per-user
inotify and key quotas, ``RLIMIT_NPROC``). When the trainer runs as root, every execution gets a
uid (and a gid of the same number) from a reserved range that no account uses, for the whole
execution:

- bubblewrap is started as that user (``setpriv``), so its user namespace maps the sandbox user
  to it, never to uid 0;
- Docker runs the container with ``user="<uid>:<gid>"``;
- the subprocess backend's launcher drops to it before running the solution.

Concurrent executions get *different* uids, so a per-user kernel quota exhausted by one rollout
(inotify instances, keys, processes) never fails another one, and a leftover process of an
execution is found by its uid alone. Allocation is exclusive across processes too: each uid is
held through an ``flock`` on a root-only lock file, so two trainers on one machine never share one.

When the trainer is not root it cannot switch users; executions then run as the trainer's own
(unprivileged) user, which is reported by :func:`user_policy`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .purge import purge_uid

__all__ = ["DEFAULT_UID_BASE", "DEFAULT_UID_COUNT", "SandboxUser", "UserPool", "user_policy"]

# systemd's uid map (docs/UIDS-GIDS.md) leaves 65536..524287 unused by any distribution; the
# classic subuid ranges start at 100000 in steps of 65536, so this block sits in their gap.
DEFAULT_UID_BASE = 262_144
DEFAULT_UID_COUNT = 64
log = logging.getLogger("wmrl.autoresearch.sandbox")
_LOCK_DIR = Path("/run/wmrl-sandbox-users") if os.path.isdir("/run") else Path("/tmp/wmrl-sandbox-users")


@dataclass(frozen=True)
class SandboxUser:
    """A host uid/gid a solution runs as. ``dedicated`` is False when it is the trainer's own user."""

    uid: int
    gid: int
    dedicated: bool = True


def user_policy() -> str:
    """How solutions are run on this host, in words (for ``protections()`` and the docs)."""
    if os.geteuid() == 0:
        return "dedicated unprivileged uid/gid per concurrent execution (never host root)"
    return f"the trainer's own unprivileged user (uid {os.geteuid()}); it cannot switch users"


class UserPool:
    """Hands out dedicated uids ``base .. base+count-1``; thread- and process-exclusive.

    Args:
        base: first uid (and gid) of the range; must be above every account on the host.
        count: size of the range = the most concurrent executions per host.
        lock_dir: where the root-only lock files live.
    """

    def __init__(self, base: int = DEFAULT_UID_BASE, count: int = DEFAULT_UID_COUNT, lock_dir=None) -> None:
        if isinstance(base, bool) or not isinstance(base, int) or base < 1000:
            raise ValueError(f"UserPool.base must be an int >= 1000 (never a system account); got {base!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"UserPool.count must be an int >= 1; got {count!r}")
        if base + count > 2**31 - 2:
            raise ValueError(f"UserPool range {base}..{base + count - 1} passes the largest valid uid")
        self.base = base
        self.count = count
        self.lock_dir = Path(lock_dir) if lock_dir is not None else _LOCK_DIR
        self._held: dict[int, int] = {}  # uid -> lock fd
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)

    @property
    def dedicated(self) -> bool:
        """Whether this process can switch users (runs as root)."""
        return os.geteuid() == 0

    def _try_lock(self, uid: int) -> int | None:
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(self.lock_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            # Someone else made it first (it may fall back under /tmp): they could hold our locks.
            raise PermissionError(
                f"the sandbox users' lock folder {self.lock_dir} must be a folder of uid {os.geteuid()} "
                f"that nobody else can open (found owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
            )
        # Root-only files: a solution (which never runs as root) cannot open one to hold its lock.
        fd = os.open(self.lock_dir / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def acquire(self, timeout_s: float | None = None) -> SandboxUser:
        """A free user (waits up to ``timeout_s`` when all are taken; ``TimeoutError`` after)."""
        if not self.dedicated:
            return SandboxUser(os.geteuid(), os.getegid(), dedicated=False)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._free:
            while True:
                for uid in range(self.base, self.base + self.count):
                    if uid in self._held:
                        continue
                    fd = self._try_lock(uid)
                    if fd is not None:
                        self._held[uid] = fd
                        # Whatever an earlier holder (another process, a crashed trainer) left
                        # as this uid goes before it runs again.
                        try:
                            purged = purge_uid(uid, uid)
                        except Exception:  # purge_uid reports what it cannot remove; this is a bug
                            log.exception("purging sandbox user %d failed", uid)
                        else:
                            leftovers = purged.summary()
                            if leftovers:
                                log.warning("sandbox user %d: %s", uid, leftovers)
                            if purged.unreaped:
                                # Its dead processes still count against RLIMIT_NPROC: a run
                                # given it now could fork fewer tasks than its limit says.
                                self._unlock(uid)
                                continue
                        return SandboxUser(uid, uid)
                # Another process may hold the rest: poll, and wake at once on a local release.
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"all {self.count} sandbox users ({self.base}..{self.base + self.count - 1}) are busy"
                    )
                self._free.wait(timeout=0.2)

    def release(self, user: SandboxUser) -> None:
        if not user.dedicated:
            return
        with self._free:
            self._unlock(user.uid)
            self._free.notify_all()

    def _unlock(self, uid: int) -> None:
        fd = self._held.pop(uid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


#: The pool every sandbox of this process shares (so concurrent executions never share a uid).
USERS = UserPool()
