"""Per-execution control groups: hard bounds on memory and task count, and exact accounting.

Where the host lets us create cgroups (root on a cgroup v1 host such as this one, or a delegated
cgroup v2 subtree), each execution gets its own group, nested under the cgroup the host process
already lives in (so a parent's limits still apply):

- ``memory``: the limit covers every process of the execution *and* the tmpfs pages it wrote;
  exceeding it triggers the kernel OOM killer inside the group (detected via the OOM-kill counter).
- ``pids``: a hard bound on tasks (processes + threads). This, not ``RLIMIT_NPROC``, is what stops
  a fork bomb: ``RLIMIT_NPROC`` counts per *user*, and uid 0 (root, which bubblewrap's user
  namespace maps the sandbox user to when the host runs as root) is exempt from it entirely.
- ``cpuacct`` (v1) / ``cpu.stat`` (v2): CPU time of every process, including ones killed at a
  timeout that nobody reaped;
- ``cpuset`` and ``cpu`` where the host has them: the execution's CPUs as a hard set
  (``cpuset.cpus``: a solution cannot re-pin itself onto other cores) and a CFS quota of as many
  cores (``cpu.cfs_quota_us`` / ``cpu.max``). Without them the sandbox pins the solution with
  ``sched_setaffinity`` and its seccomp filter refuses that call to the solution.

A group is joined *before* the sandbox starts (the spawn goes through a tiny ``sh`` trampoline
that writes its own pid into ``cgroup.procs`` and then execs the sandbox), so no process of the
execution is ever outside it. When anything here fails the sandbox falls back to rlimits and a
polling watchdog, and says so in the result's warnings.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupError",
    "CgroupStats",
    "CgroupSupport",
    "ExecutionCgroup",
    "detect",
    "groups_of_pid",
    "remove_stale",
]

_counter = itertools.count()
_counter_lock = threading.Lock()


class CgroupError(RuntimeError):
    """A cgroup operation failed (not writable, controller missing...)."""


@dataclass(frozen=True)
class CgroupStats:
    """Accounting read from an execution's group after it ended."""

    cpu_s: float | None
    peak_memory_bytes: int | None
    oom_kills: int
    pids_peak: int | None
    pids_limit_hits: int


@dataclass(frozen=True)
class CgroupSupport:
    """Where per-execution groups can be created.

    Attributes:
        version: 1 or 2.
        parents: for v1, controller name (``memory``, ``pids``, ``cpuacct``, and ``cpu``/``cpuset``
            where present) -> the directory of the host process's current group in that
            controller's hierarchy; for v2, ``{"unified": dir}``.
    """

    version: int
    parents: dict[str, Path]

    def describe(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in sorted(self.parents.items()))
        return f"cgroup v{self.version} ({where})"

    @property
    def cpu_controllers(self) -> set[str]:
        """Which of ``cpuset`` and ``cpu`` (quota) this host lets us use."""
        if self.version == 1:
            return {c for c in ("cpuset", "cpu") if c in self.parents}
        unified = self.parents["unified"]
        try:
            available = set((unified / "cgroup.controllers").read_text().split())
        except OSError:
            return set()
        return {"cpuset", "cpu"} & available


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root, mountpoint, fstype, super options) for each cgroup mount."""
    out: list[tuple[str, str, str, set[str]]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype = rfields[0]
        if fstype in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4], fstype, set(rfields[2].split(","))))
    return out


def _own_groups() -> dict[str, str]:
    """controller -> path of our current group ('' key for the v2 unified hierarchy)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def _join(mountpoint: str, mount_root: str, path: str) -> Path | None:
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return Path(mountpoint + "/" + rel.lstrip("/")).resolve() if rel.strip("/") else Path(mountpoint)


def _probe(support: CgroupSupport) -> bool:
    """Create, configure and remove a throw-away group to prove we may."""
    try:
        group = ExecutionCgroup(
            support, memory_bytes=256 * 1024 * 1024, max_tasks=64, cpus=sorted(os.sched_getaffinity(0))[:1]
        )
        if group.cpu_problem is not None:
            group.remove()
            return False
    except CgroupError:
        return False
    group.remove()
    return True


def detect() -> CgroupSupport | None:
    """Find a cgroup setup we can create per-execution groups in, or ``None``."""
    if not Path("/proc/self/cgroup").exists():
        return None
    mounts = _mounts()
    own = _own_groups()
    v1: dict[str, Path] = {}
    for root, mountpoint, fstype, opts in mounts:
        if fstype != "cgroup":
            continue
        for controller in ("memory", "pids", "cpuacct", "cpu", "cpuset"):
            if controller in opts and controller in own and controller not in v1:
                where = _join(mountpoint, root, own[controller])
                if where is not None and where.is_dir() and os.access(where, os.W_OK):
                    v1[controller] = where
    if "memory" in v1 and "pids" in v1:
        support = CgroupSupport(1, v1)
        if _probe(support):
            remove_stale(support)
            return support
        # CPU controllers are optional: retry with memory/pids/cpuacct only.
        reduced = CgroupSupport(1, {k: v for k, v in v1.items() if k in ("memory", "pids", "cpuacct")})
        if _probe(reduced):
            remove_stale(reduced)
            return reduced
    for root, mountpoint, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        where = _join(mountpoint, root, own[""])
        if where is None or not where.is_dir():
            continue
        controllers = (
            set((where / "cgroup.controllers").read_text().split())
            if (where / "cgroup.controllers").exists()
            else set()
        )
        if {"memory", "pids"} <= controllers and os.access(where, os.W_OK):
            support = CgroupSupport(2, {"unified": where})
            if _probe(support):
                remove_stale(support)
                return support
    return None


_NAME_RE = re.compile(r"^wmrl-sandbox-(\d+)-\d+-\d+$")


def remove_stale(support: CgroupSupport) -> int:
    """Remove groups left by WMRL processes that died without cleaning up (killing what is in
    them). Returns how many were removed."""
    removed = 0
    for parent in support.parents.values():
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for d in entries:
            m = _NAME_RE.match(d.name)
            if m is None or not d.is_dir():
                continue
            try:
                os.kill(int(m.group(1)), 0)
                continue  # its owner is alive
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            for _ in range(100):
                try:
                    pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    pids = []
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    d.rmdir()
                    removed += 1
                    break
                except OSError:
                    time.sleep(0.01)
    return removed


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror}") from exc


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path: Path) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


class ExecutionCgroup:
    """One execution's group (in each v1 controller, or one v2 group).

    Args:
        support: from :func:`detect`.
        memory_bytes: memory limit (processes + tmpfs + page cache), bytes.
        max_tasks: ``pids.max``: processes + threads.
        cpus: the host cores of this execution: a cpuset of exactly these and a CPU quota of
            ``len(cpus)`` cores, where the host has the controllers (see :attr:`cpu_bound`).

    Attributes:
        cpu_bound: how the CPUs are bounded (``"cpuset 0-1 + quota 2 cores"``) or ``None``.
        cpuset_applied: whether a cpuset holds the execution to ``cpus``.
        cpu_problem: why a CPU controller could not be configured, or ``None``.
    """

    QUOTA_PERIOD_US = 100_000

    def __init__(
        self, support: CgroupSupport, *, memory_bytes: int, max_tasks: int, cpus: list[int] | None = None
    ) -> None:
        self.support = support
        with _counter_lock:
            n = next(_counter)
        self.name = f"wmrl-sandbox-{os.getpid()}-{n}-{time.monotonic_ns() % 10**9}"
        self.dirs: dict[str, Path] = {}
        self.cpu_bound: str | None = None
        self.cpuset_applied = False
        self.cpu_problem: str | None = None
        try:
            if support.version == 1:
                for controller, parent in support.parents.items():
                    d = parent / self.name
                    # Co-mounted controllers (cpu,cpuacct) share one directory.
                    if d not in self.dirs.values():
                        d.mkdir()
                    self.dirs[controller] = d
                mem = self.dirs["memory"]
                _write(mem / "memory.limit_in_bytes", str(memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():
                    # Count swap too, so a solution cannot page its way past the limit.
                    with contextlib.suppress(CgroupError):
                        _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(self.dirs["pids"] / "pids.max", str(max_tasks))
                if cpus:
                    self._cpu_v1(cpus)
            else:
                parent = support.parents["unified"]
                control = parent / "cgroup.subtree_control"
                enabled = set(control.read_text().split()) if control.exists() else set()
                missing = {"memory", "pids"} - enabled
                if missing:
                    _write(control, " ".join("+" + c for c in sorted(missing)))
                if cpus:
                    for c in sorted(support.cpu_controllers - set(control.read_text().split())):
                        with contextlib.suppress(CgroupError):
                            _write(control, "+" + c)
                d = parent / self.name
                d.mkdir()
                self.dirs["unified"] = d
                _write(d / "memory.max", str(memory_bytes))
                if (d / "memory.swap.max").exists():
                    with contextlib.suppress(CgroupError):
                        _write(d / "memory.swap.max", "0")
                _write(d / "pids.max", str(max_tasks))
                if cpus:
                    self._cpu_v2(cpus)
        except (OSError, CgroupError) as exc:
            self.remove()
            if isinstance(exc, CgroupError):
                raise
            raise CgroupError(f"cannot create cgroup {self.name}: {exc}") from exc

    def _cpu_v1(self, cpus: list[int]) -> None:
        bound = []
        try:
            if "cpuset" in self.dirs:
                d = self.dirs["cpuset"]
                # A v1 cpuset needs its memory nodes before a task may join: the parent's.
                mems = (d.parent / "cpuset.mems").read_text().strip() or "0"
                _write(d / "cpuset.mems", mems)
                _write(d / "cpuset.cpus", ",".join(str(c) for c in cpus))
                self.cpuset_applied = True
                bound.append(f"cpuset {','.join(str(c) for c in cpus)}")
            if "cpu" in self.dirs:
                d = self.dirs["cpu"]
                _write(d / "cpu.cfs_period_us", str(self.QUOTA_PERIOD_US))
                _write(d / "cpu.cfs_quota_us", str(self.QUOTA_PERIOD_US * len(cpus)))
                bound.append(f"CFS quota {len(cpus)} core(s)")
        except (OSError, CgroupError) as exc:
            self.cpu_problem = str(exc)
        self.cpu_bound = " + ".join(bound) or None

    def _cpu_v2(self, cpus: list[int]) -> None:
        d = self.dirs["unified"]
        bound = []
        try:
            if (d / "cpuset.cpus").exists():
                _write(d / "cpuset.cpus", ",".join(str(c) for c in cpus))
                self.cpuset_applied = True
                bound.append(f"cpuset {','.join(str(c) for c in cpus)}")
            if (d / "cpu.max").exists():
                _write(d / "cpu.max", f"{self.QUOTA_PERIOD_US * len(cpus)} {self.QUOTA_PERIOD_US}")
                bound.append(f"CFS quota {len(cpus)} core(s)")
        except (OSError, CgroupError) as exc:
            self.cpu_problem = str(exc)
        self.cpu_bound = " + ".join(bound) or None

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process must write its pid into to join this group."""
        return [str(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def pids(self) -> list[int]:
        seen: set[int] = set()
        for d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                seen.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return sorted(seen)

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; ``True`` when it emptied."""
        if self.support.version == 2 and (self.dirs["unified"] / "cgroup.kill").exists():
            with contextlib.suppress(CgroupError):
                _write(self.dirs["unified"] / "cgroup.kill", "1")
        end = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > end:
                return False
            time.sleep(0.005)

    def stats(self) -> CgroupStats:
        return stats_of(self.support.version, self.dirs)

    def remove(self) -> None:
        """Kill what is left and delete the group (its directories)."""
        if self.pids():
            self.kill_all()
        for d in list(dict.fromkeys(self.dirs.values())):
            for _ in range(200):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.005)  # zombies still being reaped
        self.dirs = {}


def stats_of(version: int, dirs: dict[str, Path]) -> CgroupStats:
    """Accounting of a group given its directory per controller (v1) or ``{"unified": dir}`` (v2)."""
    if version == 1:
        cpu = _read_int(dirs["cpuacct"] / "cpuacct.usage") if "cpuacct" in dirs else None
        mem, pids = dirs.get("memory"), dirs.get("pids")
        return CgroupStats(
            cpu_s=cpu / 1e9 if cpu is not None else None,
            peak_memory_bytes=_read_int(mem / "memory.max_usage_in_bytes") if mem else None,
            oom_kills=_read_keyed(mem / "memory.oom_control").get("oom_kill", 0) if mem else 0,
            pids_peak=_read_int(pids / "pids.peak") if pids else None,
            pids_limit_hits=_read_keyed(pids / "pids.events").get("max", 0) if pids else 0,
        )
    d = dirs["unified"]
    usage = _read_keyed(d / "cpu.stat").get("usage_usec")
    return CgroupStats(
        cpu_s=usage / 1e6 if usage is not None else None,
        peak_memory_bytes=_read_int(d / "memory.peak"),
        oom_kills=_read_keyed(d / "memory.events").get("oom_kill", 0),
        pids_peak=_read_int(d / "pids.peak"),
        pids_limit_hits=_read_keyed(d / "pids.events").get("max", 0),
    )


def groups_of_pid(pid: int) -> tuple[int, dict[str, Path]] | None:
    """``(version, {controller: directory})`` of the groups ``pid`` is in, as seen from here.

    Used for containers (whose engine made the groups): their accounting and the pids
    controller's refusals. ``None`` when the process is gone or its groups are not visible.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    own = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for c in parts[1].split(",") if parts[1] else [""]:
                own[c] = parts[2]
    dirs: dict[str, Path] = {}
    unified = None
    for root, mountpoint, fstype, opts in _mounts():
        if fstype == "cgroup":
            for c in ("memory", "pids", "cpuacct"):
                if c in opts and c in own and c not in dirs:
                    where = _join(mountpoint, root, own[c])
                    if where is not None and where.is_dir():
                        dirs[c] = where
        elif fstype == "cgroup2" and "" in own and unified is None:
            where = _join(mountpoint, root, own[""])
            if where is not None and (where / "memory.max").exists():
                unified = where
    if "memory" in dirs and "pids" in dirs:
        return 1, dirs
    if unified is not None:
        return 2, {"unified": unified}
    return None
