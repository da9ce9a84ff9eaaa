"""The seccomp filter every solution runs under, compiled by libseccomp (through ``pyseccomp``).

The filter is a *deny list* on top of the namespaces and the unprivileged user: the system calls
below fail with ``EPERM`` (``clone3`` with ``ENOSYS``, so that the C library falls back to
``clone``, whose flags a filter can inspect -- Docker's default profile does the same). Docker's
default profile (moby ``profiles/seccomp/default.json``) is the reference; it blocks these too,
except ``ptrace`` (allowed there on kernels >= 4.8) and the affinity call. Unlike Docker's profile,
which allows a list and refuses the rest, unknown system calls are allowed here: the list says
what the filter stops, the kernel's namespaces and permissions are the boundary for everything
else (``docs/sandbox.md``).

The host compiles the filter to classic BPF once per configuration (libseccomp adds the
architecture check: i386/x32 system calls kill the caller) and hands the bytes to the in-sandbox
launcher, which installs them with ``prctl(PR_SET_SECCOMP)`` in the solution's process right
before ``exec`` -- after its own set-up (limits, CPU pinning, dropping privileges) is done.
"""

from __future__ import annotations

import errno
import functools
import tempfile

__all__ = ["CLONE_NAMESPACE_FLAGS", "DENIED_SYSCALLS", "compile_filter", "seccomp_problem"]

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
}
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
    denied = [*DENIED_SYSCALLS, *([AFFINITY_SYSCALL] if deny_affinity else [])]
    for name in denied:
        try:
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):
            continue  # a call this architecture does not have (iopl on arm64, ...)
    # One rule per flag: libseccomp compares (arg & mask) == value, so "any flag set" is 7 rules.
    for bit in range(32):
        flag = 1 << bit
        if CLONE_NAMESPACE_FLAGS & flag:
            flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        program = f.read()
    if not program or len(program) % 8:
        raise RuntimeError(f"libseccomp exported {len(program)} bytes, not a whole BPF program")
    return program
