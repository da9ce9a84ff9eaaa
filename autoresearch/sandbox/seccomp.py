"""The seccomp filter every solution runs under, compiled by libseccomp (through ``pyseccomp``).

The filter refuses, on top of the namespaces and the unprivileged user:

- **whole system calls** (:data:`DENIED_SYSCALLS`): they fail with ``EPERM`` (``clone3`` with
  ``ENOSYS``, so that the C library falls back to ``clone``, whose flags a filter can inspect --
  Docker's default profile does the same; the notification and asynchronous-I/O calls with
  ``ENOSYS``, so that libraries fall back to polling and plain I/O);
- **socket families by an allow list** (:data:`ALLOWED_SOCKET_FAMILIES`): ``socket`` and
  ``socketpair`` of any other family fail with ``EAFNOSUPPORT``. A network namespace covers the
  allowed ones; some families (``AF_VSOCK`` and others) are machine-wide whatever the namespace;
- **calls aimed at the launcher** (:data:`LAUNCHER_PID`, the PID-1 launcher of bubblewrap and
  Docker): no signal of any kind, no ``pidfd`` for it, no scheduling or I/O priority change of it
  (or of every process of the uid), and ``prlimit`` on any process but the caller itself. A
  solution that killed its launcher or lowered its limits used to turn its failure into a harness
  error (grade unknown, removed from training); one that starved it ran past its wall time;
- **page-cache probes and eviction** on shared files: ``fadvise(DONTNEED)`` and
  ``madvise(COLD/PAGEOUT)`` do nothing (advice may be ignored), ``RWF_NOWAIT`` reads fail with
  ``EOPNOTSUPP`` and ``cachestat`` with ``ENOSYS``;
- **locks and watches on shared inodes** (:data:`LOCK_FCNTL_COMMANDS`, ``flock``, ``inotify``):
  concurrent sandboxes share read-only inodes (``/usr``, the solution environment, staged public
  data); a lock or a watch needs only a read-only descriptor, so they were a channel between
  rollouts. Taking a lock (``flock``, ``F_SETLK``, OFD locks) succeeds and does nothing, so
  SQLite and ``filelock`` still work in a single process; testing for someone else's lock
  (``F_GETLK``) fails with ``ENOLCK``; leases, ``F_NOTIFY`` and ``inotify`` are refused.

Everything else is allowed: the kernel's namespaces and permissions are the boundary there. The
choice of a deny list of system calls over an allow list like Docker's default profile is argued
in ``docs/sandbox.md``: this filter stacks on Docker's profile where Docker runs, and an allow list
of its own would break scientific libraries on each kernel and C-library update for calls the
namespaces already confine. Arguments are compared as the kernel reads them: a 32-bit argument
(``pid_t``, ``int``, ``unsigned int``) through its low 32 bits, so a value with high bits set cannot
slip past an equality test.

The host compiles the filter to classic BPF once per configuration (libseccomp adds the
architecture check: i386/x32 system calls kill the caller) and hands the bytes to the in-sandbox
launcher, which installs them with ``prctl(PR_SET_SECCOMP)`` in the solution's process right
before ``exec`` -- after its own set-up (limits, CPU pinning, dropping privileges) is done.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = [
    "ALLOWED_SOCKET_FAMILIES",
    "CLONE_NAMESPACE_FLAGS",
    "DENIED_SYSCALLS",
    "LAUNCHER_PID",
    "LOCK_FCNTL_COMMANDS",
    "NOSYS_SYSCALLS",
    "compile_filter",
    "seccomp_problem",
]

# System call -> why a solution must not make it.
DENIED_SYSCALLS: dict[str, str] = {
    # Kernel keyrings are per *host* user: a channel between rollouts and a shared quota.
    "add_key": "kernel keyrings",
    "keyctl": "kernel keyrings",
    "request_key": "kernel keyrings",
    # Inspecting or steering other processes (the launcher included).
    "ptrace": "debugging other processes",
    "process_vm_readv": "reading another process's memory",
    "process_vm_writev": "writing another process's memory",
    "pidfd_getfd": "stealing another process's file descriptors",
    "kcmp": "comparing kernel objects of other processes",
    # Filesystems and namespaces: the sandbox's view must stay the one it was given.
    "mount": "mounting",
    "umount2": "unmounting",
    "pivot_root": "changing the root",
    "chroot": "changing the root",
    "move_mount": "mounting (new API)",
    "open_tree": "mounting (new API)",
    "fsopen": "mounting (new API)",
    "fsconfig": "mounting (new API)",
    "fsmount": "mounting (new API)",
    "fspick": "mounting (new API)",
    "mount_setattr": "mounting (new API)",
    "unshare": "new namespaces",
    "setns": "entering other namespaces",
    "open_by_handle_at": "opening files by handle, bypassing the mount view",
    "name_to_handle_at": "file handles",
    # Kernel attack surface no solution needs.
    "bpf": "eBPF programs",
    "perf_event_open": "performance counters (kernel attack surface, side channels)",
    "userfaultfd": "user-space page faults (a classic exploit primitive)",
    "io_uring_setup": "io_uring (kernel attack surface; bypasses this filter)",
    "io_uring_enter": "io_uring",
    "io_uring_register": "io_uring",
    "kexec_load": "loading a kernel",
    "kexec_file_load": "loading a kernel",
    "init_module": "kernel modules",
    "finit_module": "kernel modules",
    "delete_module": "kernel modules",
    "reboot": "rebooting",
    "swapon": "swap",
    "swapoff": "swap",
    "acct": "process accounting",
    "quotactl": "disk quotas",
    "quotactl_fd": "disk quotas",
    "lookup_dcookie": "kernel profiling",
    "syslog": "the kernel log",
    "iopl": "I/O ports",
    "ioperm": "I/O ports",
    "vhangup": "terminals",
    "settimeofday": "the host clock",
    "clock_settime": "the host clock",
    "clock_adjtime": "the host clock",
    "adjtimex": "the host clock",
    "uselib": "obsolete loader call",
    "nfsservctl": "obsolete NFS call",
    "fanotify_init": "watching the whole filesystem",
    "mbind": "NUMA memory placement",
    "set_mempolicy": "NUMA memory placement",
    "move_pages": "moving other processes' pages",
    "migrate_pages": "moving other processes' pages",
    # A pidfd reaches a process by a /proc/<pid> folder too, which the solution may open: the
    # launcher's included (round three). A solution signals its own children with kill().
    "pidfd_send_signal": "signalling through a pidfd (reaches the launcher via /proc/1)",
}
# Refused with ENOSYS (callers fall back): kernel objects whose quota or event stream is
# machine-wide, not per namespace or per user.
NOSYS_SYSCALLS: dict[str, str] = {
    # /proc/sys/fs/aio-max-nr is one counter for the whole machine (round three: a solution took
    # it all and root on the host failed until the run ended).
    "io_setup": "asynchronous I/O contexts (a machine-wide quota)",
    "io_destroy": "asynchronous I/O",
    "io_submit": "asynchronous I/O",
    "io_cancel": "asynchronous I/O",
    "io_getevents": "asynchronous I/O",
    "io_pgetevents": "asynchronous I/O",
    # A watch on a shared read-only inode sees other sandboxes open and read it.
    "inotify_init": "file watches (see other rollouts' accesses to shared files)",
    "inotify_init1": "file watches",
    "inotify_add_watch": "file watches",
    "cachestat": "page-cache state of any file it can open (a channel between rollouts)",
}
# socket()/socketpair() families a solution may create (everything else: EAFNOSUPPORT).
# AF_UNIX, AF_INET, AF_INET6: what Python, numpy's and torch's process pools and a local
# loopback need; the network namespace confines them. AF_NETLINK: the C library's
# getaddrinfo/getifaddrs ask the routing table of the (private) namespace, so only the
# NETLINK_ROUTE protocol is allowed; other netlink protocols reach machine-wide event streams.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
NETLINK_ROUTE = 0
ALLOWED_SOCKET_FAMILIES: dict[int, str] = {
    AF_UNIX: "AF_UNIX",
    AF_INET: "AF_INET",
    AF_INET6: "AF_INET6",
    AF_NETLINK: "AF_NETLINK (NETLINK_ROUTE only)",
}
# Every family number below this is listed one by one; anything at or above it is refused by one
# range rule (the kernel's AF_MAX is 46 in Linux 6.x).
_FAMILY_RULES_UP_TO = 64
# The launcher's PID inside bubblewrap's and Docker's PID namespaces.
LAUNCHER_PID = 1
# fcntl() commands that take, test or watch locks, leases and directory notifications.
# fcntl() commands on locks, leases and directory notifications, and what the filter makes of them.
# Taking or dropping a lock *succeeds and does nothing*: a lock on a private scratch file then
# behaves as in a single process (SQLite, filelock work), and a lock on a shared inode is seen by
# nobody. Testing for another's lock is refused (the kernel would have to answer "none"), and so
# are leases and notifications, which watch other processes' opens.
LOCK_NOOP, LOCK_REFUSED = 0, errno.ENOLCK
LOCK_FCNTL_COMMANDS: dict[int, tuple[str, int]] = {
    5: ("F_GETLK", LOCK_REFUSED),
    6: ("F_SETLK", LOCK_NOOP),
    7: ("F_SETLKW", LOCK_NOOP),
    36: ("F_OFD_GETLK", LOCK_REFUSED),
    37: ("F_OFD_SETLK", LOCK_NOOP),
    38: ("F_OFD_SETLKW", LOCK_NOOP),
    1024: ("F_SETLEASE", LOCK_REFUSED),
    1025: ("F_GETLEASE", LOCK_REFUSED),
    1026: ("F_NOTIFY", LOCK_REFUSED),
}
# Calls that name a target process in their first argument: refused when it is the launcher.
# Signals kill it; scheduling calls starve it until it misses its wall-time check (round three:
# nice 19 + SCHED_IDLE on PID 1 and 60 busy tasks turned a timeout into "ok").
_AIMED_AT_A_PROCESS = (
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "sched_setaffinity",
)
PRIO_USER = 2  # setpriority(): every process of a uid, the launcher's included
IOPRIO_WHO_USER = 3  # ioprio_set(): likewise
# Page-cache state of shared read-only files is a channel too (round three: one rollout evicted
# files with fadvise(DONTNEED), another tested them with RWF_NOWAIT reads). Eviction advice is
# ignored (the call succeeds and does nothing, which advice may do); the non-blocking probes are
# refused. mincore() already reports nothing for files the caller cannot write (Linux >= 5.2).
POSIX_FADV_DONTNEED = 4
MADV_COLD, MADV_PAGEOUT = 20, 21
RWF_NOWAIT = 0x8
_LOW32 = 0xFFFFFFFF
# Only where no cgroup cpuset bounds the CPUs: then the launcher's pinning is the bound, and the
# solution must not widen it (a red team re-pinned itself onto every core).
AFFINITY_SYSCALL = "sched_setaffinity"
# clone() flags that create namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
# NEWNET); a solution may fork and start threads, never make namespaces.
CLONE_NAMESPACE_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)


@functools.lru_cache(maxsize=1)
def seccomp_problem() -> str | None:
    """``None`` when filters can be compiled here, else why not (cached)."""
    try:
        compile_filter(deny_affinity=False)
    except ImportError:
        return "the seccomp filter needs pyseccomp (pip install pyseccomp) and libseccomp2 (apt-get install libseccomp2)"
    except Exception as exc:  # libseccomp missing or too old
        return f"cannot compile the seccomp filter: {type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=4)
def compile_filter(deny_affinity: bool) -> bytes:
    """The filter as classic BPF bytes for this machine's architecture (8 bytes per instruction).

    Args:
        deny_affinity: also refuse ``sched_setaffinity`` (when no cpuset bounds the CPUs).
    """
    import pyseccomp as sc

    flt = sc.SyscallFilter(defaction=sc.ALLOW)

    def rule(errno_value: int, name: str, *args: object) -> None:
        if args:  # a rule on arguments of a call every architecture has: it must take
            flt.add_rule(sc.ERRNO(errno_value), name, *args)
            return
        # a whole call this architecture may not have (iopl on arm64, ...)
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            flt.add_rule(sc.ERRNO(errno_value), name)

    for name in [*DENIED_SYSCALLS, *([AFFINITY_SYSCALL] if deny_affinity else [])]:
        rule(errno.EPERM, name)
    for name in NOSYS_SYSCALLS:
        rule(errno.ENOSYS, name)
    # One rule per flag: libseccomp compares (arg & mask) == value, so "any flag set" is 7 rules.
    for bit in range(32):
        flag = 1 << bit
        if CLONE_NAMESPACE_FLAGS & flag:
            rule(errno.EPERM, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    rule(errno.ENOSYS, "clone3")
    _socket_rules(sc, rule)
    _launcher_rules(sc, rule)
    _page_cache_rules(sc, rule)
    for command, (_, outcome) in LOCK_FCNTL_COMMANDS.items():
        rule(outcome, "fcntl", sc.Arg(1, sc.MASKED_EQ, _LOW32, command))
    rule(LOCK_NOOP, "flock")
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        program = f.read()
    if not program or len(program) % 8:
        raise RuntimeError(f"libseccomp exported {len(program)} bytes, not a whole BPF program")
    return program


def _socket_rules(sc: Any, rule: Callable[..., None]) -> None:
    """The allow list of socket families, as refusals of every other family number.

    libseccomp takes one comparison per argument and rule, so "not one of these" is written as
    one rule per refused number below :data:`_FAMILY_RULES_UP_TO` plus one for every value at or
    above it (that one compares all 64 bits: a family with high bits set is refused too).
    """
    for call in ("socket", "socketpair"):
        for family in range(_FAMILY_RULES_UP_TO):
            if family not in ALLOWED_SOCKET_FAMILIES:
                rule(errno.EAFNOSUPPORT, call, sc.Arg(0, sc.EQ, family))
        rule(errno.EAFNOSUPPORT, call, sc.Arg(0, sc.GE, _FAMILY_RULES_UP_TO))
        # Netlink: the routing protocol only (any other value, high bits included, is refused).
        rule(errno.EPROTONOSUPPORT, call, sc.Arg(0, sc.EQ, AF_NETLINK), sc.Arg(2, sc.NE, NETLINK_ROUTE))


def _launcher_rules(sc: Any, rule: Callable[..., None]) -> None:
    """No signal, pidfd or resource-limit change reaches the launcher (PID 1 of the sandbox)."""
    for call in _AIMED_AT_A_PROCESS:
        rule(errno.EPERM, call, sc.Arg(0, sc.MASKED_EQ, _LOW32, LAUNCHER_PID))
    # tgkill(tgid, tid, sig) names the thread second as well.
    rule(errno.EPERM, "tgkill", sc.Arg(1, sc.MASKED_EQ, _LOW32, LAUNCHER_PID))
    rule(errno.EPERM, "rt_tgsigqueueinfo", sc.Arg(1, sc.MASKED_EQ, _LOW32, LAUNCHER_PID))
    # prlimit on oneself (pid 0, which setrlimit() uses) only: lowering the launcher's limits
    # made it fail before it reported. Any other pid, however written, is refused.
    rule(errno.EPERM, "prlimit64", sc.Arg(0, sc.NE, 0))
    # Priorities: of PID 1 (or its process group 1), or of every process of the uid.
    for call, by_user in (("setpriority", PRIO_USER), ("ioprio_set", IOPRIO_WHO_USER)):
        rule(errno.EPERM, call, sc.Arg(1, sc.MASKED_EQ, _LOW32, LAUNCHER_PID))
        rule(errno.EPERM, call, sc.Arg(0, sc.MASKED_EQ, _LOW32, by_user))


def _page_cache_rules(sc: Any, rule: Callable[..., None]) -> None:
    """No eviction of, and no non-blocking probe into, the page cache of shared files."""
    rule(0, "fadvise64", sc.Arg(3, sc.MASKED_EQ, _LOW32, POSIX_FADV_DONTNEED))
    for advice in (MADV_COLD, MADV_PAGEOUT):
        rule(0, "madvise", sc.Arg(2, sc.MASKED_EQ, _LOW32, advice))
    for call in ("preadv2", "pwritev2"):
        rule(errno.EOPNOTSUPP, call, sc.Arg(5, sc.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT))
