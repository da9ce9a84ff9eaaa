"""The sandbox interface and the machinery the local backends share.

A :class:`Sandbox` runs one untrusted solution (Python source) against one public data folder
under :class:`~.limits.Limits` and returns an :class:`~.result.ExecutionResult`. The solution's
contract is the same for every backend and is stated in the agent's prompt:

- ``DATA_DIR`` names the public data folder (read-only);
- ``SUBMISSION_PATH`` names the CSV file to write;
- the working directory is a fresh, empty, writable scratch folder (also ``HOME``), and ``TMPDIR``
  a private temporary folder.

``run`` never raises for anything the solution does; it raises ``TypeError``/``ValueError`` only
for a caller's mistake (code not a string, data folder missing). Everything else that goes wrong
on our side is a ``harness_error`` result with a reason.
"""

from __future__ import annotations

import atexit
import codecs
import contextlib
import hashlib
import io
import logging
import os
import shutil
import signal
import tempfile
import threading
import tokenize
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from . import launcher as _launcher_module
from .cgroups import CgroupError, CgroupSupport, ExecutionCgroup, detect
from .limits import Limits
from .purge import purge_uid, remove_tree
from .result import ExecutionResult, Resources
from .seccomp import compile_filter, seccomp_problem
from .solution_env import SolutionEnv, SolutionEnvError
from .staging import StagingArea, fingerprint, readable_by_others
from .supervisor import RawOutcome, SpawnSpec, classify, supervise
from .users import USERS, SandboxUser, UserPool

__all__ = [
    "LAUNCHER_PATH",
    "CpuAllocator",
    "LocalSandbox",
    "Sandbox",
    "SandboxError",
    "execution_cores",
    "purge_after_run",
    "set_execution_cores",
]

log = logging.getLogger("wmrl.autoresearch.sandbox")

LAUNCHER_PATH = Path(_launcher_module.__file__).resolve()
SUBMISSION_NAME = "submission.csv"


class SandboxError(RuntimeError):
    """A sandbox could not be constructed as asked (unknown backend, engine not answering...)."""


def _parse_cpu_list(text: str) -> set[int]:
    """``"0-3,5"`` -> ``{0, 1, 2, 3, 5}`` (the kernel's CPU list format)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def machine_cores() -> set[int]:
    """The cores processes here may be given: the cgroup's effective cpuset where there is one (a
    container's), else every core of the machine. Not this process's affinity, which ``taskset`` may
    have narrowed to the trainer's own cores."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"):
        try:
            cores = _parse_cpu_list(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if cores:
            return cores
    return set(range(os.cpu_count() or 1))


class CpuAllocator:
    """Hands out CPU cores to concurrent executions, least-used first.

    With N slots on N cores and ``cpus=1`` each concurrent execution gets its own core instead
    of all of them landing on core 0.
    """

    def __init__(self, cores: Sequence[int] | None = None) -> None:
        if cores is None:
            cores = (
                sorted(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity")
                else list(range(os.cpu_count() or 1))
            )
        self._use = dict.fromkeys(cores, 0)
        self._lock = threading.Lock()

    @property
    def cores(self) -> list[int]:
        return list(self._use)

    def acquire(self, n: int) -> list[int]:
        with self._lock:
            chosen = sorted(self._use, key=lambda c: (self._use[c], c))[: max(1, min(n, len(self._use)))]
            for c in chosen:
                self._use[c] += 1
            return sorted(chosen)

    def release(self, cores: Sequence[int]) -> None:
        with self._lock:
            for c in cores:
                if c in self._use and self._use[c] > 0:
                    self._use[c] -= 1

    def restrict(self, cores: Sequence[int]) -> None:
        """Hand out only ``cores`` from now on (executions off the cores the trainer computes on).

        Raises:
            ValueError: ``cores`` is empty, repeats a core or names one this machine lacks.
            RuntimeError: an execution holds cores now (its release would go astray).
        """
        wanted = list(cores)
        if not wanted or len(set(wanted)) != len(wanted):
            raise ValueError(f"execution cores must be distinct and at least one; got {wanted}")
        usable = machine_cores()
        bad = [c for c in wanted if isinstance(c, bool) or not isinstance(c, int) or c not in usable]
        if bad:
            raise ValueError(
                f"execution cores {bad} are not cores this machine lets its processes use ({sorted(usable)})"
            )
        with self._lock:
            if any(self._use.values()):
                raise RuntimeError("execution cores cannot change while executions hold some")
            self._use = dict.fromkeys(sorted(wanted), 0)


_CPUS = CpuAllocator()


def set_execution_cores(cores: Sequence[int]) -> None:
    """Run this process's local executions on ``cores`` only (every backend shares one allocator: the
    machine's cores are one resource); see :meth:`CpuAllocator.restrict`."""
    _CPUS.restrict(cores)


def execution_cores() -> list[int]:
    """The cores this process's local executions run on."""
    return _CPUS.cores


class Sandbox(ABC):
    """One way of running untrusted solutions. Thread-safe: ``run`` may be called concurrently.

    Args:
        output_root: where copies of submissions are kept (``<root>/<execution id>/submission.csv``).
            Default: a private temporary folder removed when the interpreter exits; pass a folder to
            keep them (the caller then owns it).
        solution_env: the solution environment (a :class:`~.solution_env.SolutionEnv` or its
            folder; default :func:`~.solution_env.default_path`). Without a valid one every run is
            a ``harness_error`` saying how to build it: solutions never fall back to the trainer's
            interpreter (whose packages carry the bundled suite's source datasets).
        seccomp: run solutions under the seccomp filter of :mod:`.seccomp` (default). ``False``
            only where libseccomp is missing and that is accepted; ``protections()`` says so.
        users: where dedicated sandbox users come from (default: the process-wide pool).
    """

    name: str = "abstract"
    isolated: bool = False
    #: Why this backend cannot run here (``None`` when it can); every run then is a harness_error.
    problem: str | None = None

    def __init__(
        self,
        *,
        output_root: str | os.PathLike | None = None,
        solution_env: SolutionEnv | str | os.PathLike | None = None,
        seccomp: bool = True,
        users: UserPool | None = None,
    ) -> None:
        if output_root is None:
            root = Path(tempfile.mkdtemp(prefix="wmrl-sandbox-out-"))
            atexit.register(shutil.rmtree, root, True)
        else:
            root = Path(output_root)
            root.mkdir(parents=True, exist_ok=True)
        self.output_root = root.resolve()
        if not isinstance(seccomp, bool):
            raise TypeError(f"seccomp must be True or False; got {seccomp!r}")
        if users is not None and not isinstance(users, UserPool):
            raise TypeError(f"users must be a UserPool; got {type(users).__name__}")
        self.seccomp = seccomp
        self.users = users if users is not None else USERS
        self.problem = None
        self.solution_env: SolutionEnv | None = None
        try:
            self.solution_env = (
                solution_env if isinstance(solution_env, SolutionEnv) else SolutionEnv.find(solution_env)
            )
        except SolutionEnvError as exc:
            self.problem = str(exc)
        if self.problem is None and seccomp:
            self.problem = seccomp_problem()

    def seccomp_program(self, *, deny_affinity: bool) -> str | None:
        """The filter for one execution as hex (for the launcher), or ``None`` when off."""
        return compile_filter(deny_affinity).hex() if self.seccomp else None

    # -- the interface ------------------------------------------------------------------------
    def run(self, code: str, data_dir: str | os.PathLike, limits: Limits | None = None) -> ExecutionResult:
        """Run ``code`` (Python source) with ``data_dir`` as its public data; see the module doc."""
        if not isinstance(code, str):
            raise TypeError(f"code must be Python source text (str); got {type(code).__name__}")
        limits = Limits() if limits is None else limits
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits; got {type(limits).__name__}")
        data = Path(data_dir)
        if not data.is_dir():
            raise ValueError(f"data_dir must be an existing folder; got {str(data)!r}")
        execution_id = uuid.uuid4().hex
        try:
            refused = source_encoding_problem(code)
            if refused is not None:
                result = ExecutionResult(status="error", reason=refused)
            elif self.problem is not None:
                result = ExecutionResult(status="harness_error", reason=self.problem)
            else:
                result = self._run(code, data.resolve(), limits, execution_id)
        except Exception as exc:  # our bug or an environment failure: never the solution's fault
            log.exception("sandbox %s failed to run execution %s", self.name, execution_id)
            result = ExecutionResult(status="harness_error", reason=f"{type(exc).__name__}: {exc}")
        result.backend = self.name
        result.isolated = self.isolated
        result.limits = limits
        result.execution_id = execution_id
        return result

    @abstractmethod
    def _run(self, code: str, data_dir: Path, limits: Limits, execution_id: str) -> ExecutionResult: ...

    def tmp_mount_points(self) -> list[str]:
        """Entries a fresh run finds in its temp folder that the sandbox itself put there.

        Empty for every backend except when a host folder the sandbox must bind (the interpreter,
        its packages) lives under ``/tmp`` on the host: bubblewrap then creates its parent folder in
        the sandbox's private ``/tmp`` as a mount point. Not state left by a solution.
        """
        return []

    @abstractmethod
    def protections(self) -> dict[str, str]:
        """Protection -> how this backend provides it here (or ``"NO: ..."``). For docs and logs."""

    def describe(self) -> str:
        return f"{self.name} (isolated={self.isolated})"

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release anything held (nothing for the local backends)."""


class LocalSandbox(Sandbox):
    """Shared flow of the backends that spawn a local process (bubblewrap, subprocess).

    Args:
        cgroups: ``"auto"`` (use per-execution cgroups when the host allows them), ``True``
            (require them: raise :class:`SandboxError` if unavailable) or ``False`` (never; rlimits
            and the polling watchdog only).
    """

    def __init__(
        self, *, output_root=None, cgroups: bool | str = "auto", solution_env=None, seccomp=True, users=None
    ) -> None:
        super().__init__(output_root=output_root, solution_env=solution_env, seccomp=seccomp, users=users)
        if cgroups not in ("auto", True, False):
            raise ValueError(f"cgroups must be 'auto', True or False; got {cgroups!r}")
        self._cgroups: CgroupSupport | None = detect() if cgroups in ("auto", True) else None
        if cgroups is True and self._cgroups is None:
            raise SandboxError(
                "cgroups=True but no writable cgroup hierarchy with memory and pids controllers was found"
            )
        self._scratch_root = Path(tempfile.mkdtemp(prefix=f"wmrl-sandbox-{self.name}-"))
        # Searchable, not listable: a sandbox user reaches its own execution's folder by name only.
        os.chmod(self._scratch_root, 0o711)
        atexit.register(_remove_tree, self._scratch_root)
        self._data_copies: StagingArea | None = None
        self._data_lock = threading.Lock()

    @property
    def cgroup_support(self) -> CgroupSupport | None:
        return self._cgroups

    # Hooks for the concrete backends ---------------------------------------------------------
    @abstractmethod
    def _spawn_spec(
        self,
        *,
        stage: Path,
        data_dir: Path,
        limits: Limits,
        cpus: list[int],
        rlimits: dict,
        execution_id: str,
        user: SandboxUser,
        seccomp: str | None,
    ) -> SpawnSpec:
        """The command that runs the launcher for this execution as ``user``."""

    def _pre_warnings(self, limits: Limits) -> list[str]:
        return []

    def data_view(self, data_dir: Path, user: SandboxUser) -> Path:
        """``data_dir``, or a verified read-only copy when ``user`` could not read it in place."""
        if not user.dedicated or readable_by_others(data_dir):
            return data_dir
        with self._data_lock:
            if self._data_copies is None:
                self._data_copies = StagingArea(self._scratch_root / "data")
        key = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16] + "-" + fingerprint(data_dir)
        return self._data_copies.stage(key, data_dir)

    def _run(self, code: str, data_dir: Path, limits: Limits, execution_id: str) -> ExecutionResult:
        stage = self._scratch_root / execution_id
        stage.mkdir()
        os.chmod(stage, 0o711)
        warnings = self._pre_warnings(limits)
        user = self.users.acquire()
        cpus = _CPUS.acquire(limits.effective_cpus(len(_CPUS.cores)))
        group = None
        try:
            if self._cgroups is not None:
                try:
                    group = ExecutionCgroup(
                        self._cgroups,
                        memory_bytes=limits.memory_bytes,
                        max_tasks=limits.max_processes,
                        cpus=cpus,
                    )
                except CgroupError as exc:
                    warnings.append(
                        f"no cgroup for this execution ({exc}); memory and task limits fall back to rlimits and a watchdog"
                    )
            if group is not None and group.cpu_problem:
                warnings.append(
                    f"the CPU controllers could not be set ({group.cpu_problem}); CPUs bounded by affinity"
                )
            # Without a cgroup, virtual memory per process is the only hard memory bound we have,
            # except on a GPU: CUDA maps far more address space than it uses (unified addressing),
            # and under RLIMIT_AS it does not initialise at all. A GPU execution without a cgroup
            # is bounded by the polled tree-RSS watchdog alone, and says so.
            address_space = group is None and limits.gpu is False
            if group is None and not address_space:
                warnings.append(
                    "no cgroup and a GPU: memory is bounded by the polled resident-memory watchdog only "
                    "(RLIMIT_AS would keep CUDA from initialising)"
                )
            rlimits = {
                "FSIZE": limits.file_size_bytes,
                "NOFILE": limits.open_files,
                "CORE": 0,
                "AS": limits.memory_bytes if address_space else None,
            }
            dest = self.output_root / execution_id / SUBMISSION_NAME
            (stage / "solution.py").write_text(code, encoding="utf-8")
            os.chmod(stage / "solution.py", 0o444)
            spec = self._spawn_spec(
                stage=stage,
                data_dir=self.data_view(data_dir, user),
                limits=limits,
                cpus=cpus,
                rlimits=rlimits,
                execution_id=execution_id,
                user=user,
                # A cpuset bounds the CPUs where there is one; else the pinning does, and the
                # solution may not undo it.
                seccomp=self.seccomp_program(deny_affinity=not (group is not None and group.cpuset_applied)),
            )
            outcome = supervise(spec, limits, submission_dest=dest, cgroup=group, watchdog=group is None)
        finally:
            _CPUS.release(cpus)
            try:
                if group is not None:
                    group.remove()
                warnings.extend(purge_after_run(user))
            finally:  # the uid and the stage go back whatever the clean-up met
                self.users.release(user)
                _remove_tree(stage)
        warnings.extend(outcome.warnings)
        return self._result(outcome, limits, dest, warnings)

    def _result(
        self, outcome: RawOutcome, limits: Limits, dest: Path, warnings: list[str]
    ) -> ExecutionResult:
        c = classify(outcome, limits)
        submission, submission_error = None, None
        info = outcome.exit_info or {}
        summary = info.get("submission") or {}
        if outcome.submission_over_cap:
            submission_error = f"the submission is over the {limits.submission_bytes}-byte limit"
        elif summary.get("error"):
            submission_error = summary["error"]
        elif summary.get("present") and dest.exists():
            submission = dest
        elif summary.get("present"):
            # An empty file sends no data frame; it is still the solution's (empty) submission.
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(b"")
            submission = dest
        if submission is None:
            with contextlib.suppress(FileNotFoundError):
                dest.unlink()
            with contextlib.suppress(OSError):
                dest.parent.rmdir()
        resources = measured_resources(outcome)
        stats = outcome.cgroup_stats
        if c.status == "ok" and stats is not None and stats.oom_kills:
            warnings.append(
                f"the cgroup OOM killer killed {stats.oom_kills} process(es) of this execution although it exited 0"
            )
        return ExecutionResult(
            status=c.status,
            exit_code=c.exit_code,
            signal=c.signal,
            reason=c.reason,
            stdout_tail=outcome.stdout.text() if outcome.stdout else "",
            stderr_tail=outcome.stderr.text() if outcome.stderr else "",
            stdout_bytes=outcome.stdout.total if outcome.stdout else 0,
            stderr_bytes=outcome.stderr.total if outcome.stderr else 0,
            submission=submission,
            submission_error=submission_error,
            resources=resources,
            warnings=warnings,
        )


def source_encoding_problem(code: str) -> str | None:
    """Why ``code`` is refused before it runs, or ``None``: only UTF-8 source is accepted.

    The solution file is written as UTF-8, but a PEP 263 cookie (``# -*- coding: utf-7 -*-``) makes
    the interpreter decode those bytes differently: it would run a program that a syntax check or
    a reader of the text never saw. A cookie naming anything but UTF-8 is the solution's error.
    """
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(code.encode("utf-8")).readline)
    except SyntaxError as exc:
        return f"the source declares an encoding Python cannot use ({exc}); only UTF-8 source is accepted"
    except UnicodeEncodeError:
        return "the source is not valid Unicode text (lone surrogates); only UTF-8 source is accepted"
    if codecs.lookup(encoding).name not in ("utf-8", "utf-8-sig"):
        return f"the source declares the encoding {encoding!r}; only UTF-8 source is accepted"
    return None


def measured_resources(outcome: RawOutcome) -> Resources:
    """Pick the best measurement of each resource.

    CPU: the cgroup's counter (every process, reaped or not), else the solution tree's ``rusage``
    reported by the launcher, else the host's ``rusage`` of the spawned command (a lower bound: it
    misses what was killed unreaped). Peak RSS: the launcher's report, else ``None`` (the host's
    own ``ru_maxrss`` starts at the size of the forked host interpreter, and processes inside a
    PID namespace do not pass their usage up to it).
    """
    stats = outcome.cgroup_stats
    host = outcome.host_rusage
    solution = (outcome.exit_info or {}).get("rusage") or None
    if stats is not None and stats.cpu_s is not None:
        cpu = stats.cpu_s
    elif solution is not None:
        cpu = float(solution.get("utime", 0.0)) + float(solution.get("stime", 0.0))
    else:
        cpu = host.ru_utime + host.ru_stime if host is not None else 0.0
    # Without the launcher's report (a host-side kill) there is no trustworthy per-process peak.
    peak_rss = float(solution.get("maxrss_kb", 0)) / 1024 if solution is not None else None
    peak_mem = stats.peak_memory_bytes if stats is not None else None
    return Resources(
        wall_s=round(outcome.wall_s, 4),
        cpu_s=round(cpu, 4),
        peak_rss_mb=round(peak_rss, 2) if peak_rss is not None else None,
        peak_memory_mb=round(peak_mem / 2**20, 2) if peak_mem else None,
        max_tasks=(stats.pids_peak if stats is not None else None) or outcome.watchdog_max_tasks,
    )


def purge_after_run(user: SandboxUser) -> list[str]:
    """The execution's warning about what its dedicated uid left behind (none for a shared uid).

    The uid is this execution's alone: whatever still runs as it, or is owned by it in the host's
    shared folders and IPC, is a leftover of this execution (:func:`~.purge.purge_uid`).
    """
    if not user.dedicated:
        return []
    leftovers = purge_uid(user.uid, user.gid).summary()
    return [f"sandbox user {user.uid}: {leftovers}"] if leftovers else []


def _remove_tree(path: Path) -> None:
    """Remove a folder the sandbox made, read-only parts (data copies) included; never raises.

    A solution shapes what is inside (links, a tree thousands of levels deep), so this is
    :func:`~.purge.remove_tree`: no link followed, no depth limit, a failure logged, never
    turned into the execution's harness error.
    """
    problem = remove_tree(path)
    if problem is not None:
        log.warning("could not remove %s: %s", path, problem)


def kill_process_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
