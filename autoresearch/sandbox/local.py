"""Plain-subprocess backend: a fallback that does NOT isolate.

The solution sees the host's whole filesystem (private answers included, where its user may read
them), the network and every process. What it does enforce: a dedicated unprivileged user when the
trainer is root (the launcher drops to it before the solution starts: it cannot signal the
launcher, write root's files or charge root's per-user kernel quotas), the same seccomp filter as
the isolating backends, the solution environment's interpreter, the wall time (process-group
kill, plus a sweep of every process of the sandbox user, or of an environment marker when there
is no dedicated user), the output limit, memory, task and CPU limits (a cgroup where the host
allows one, else ``RLIMIT_AS``, a polled watchdog and pinning), the file-size limit
(``RLIMIT_FSIZE``), a fresh work dir, a private ``TMPDIR``, a scrubbed environment and thread
caps. By default the public data is *copied* into a fresh root-owned read-only folder per
execution, so that a solution cannot alter it for the next one; staged copies of other
backends are root-owned and read-only too, and verified before each reuse.

Every result says ``isolated=False`` and carries a warning; every run logs one. Use it for
development and tests only, never for RL on untrusted policies.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
from pathlib import Path

from . import procscan
from .base import LAUNCHER_PATH, SUBMISSION_NAME, LocalSandbox, SandboxError, kill_process_group
from .environment import sandbox_env
from .limits import Limits
from .supervisor import SpawnSpec
from .users import SandboxUser, user_policy

__all__ = ["NO_ISOLATION_WARNING", "SubprocessSandbox"]

log = logging.getLogger("wmrl.autoresearch.sandbox")

NO_ISOLATION_WARNING = (
    "subprocess backend: NO ISOLATION - the solution ran on the host with the host's filesystem "
    "(private answers included, where its user may read them), network and processes visible; only "
    "its user, time, output, memory, task and file-size limits were enforced. Do not use it for untrusted code."
)
MARKER_VAR = "WMRL_SANDBOX_EXECUTION"


def _fingerprint(folder: Path) -> list[tuple[str, int, int]]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            p = Path(root) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            out.append((str(p.relative_to(folder)), st.st_size, st.st_mtime_ns))
    return out


def _read_only_copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)
    for root, _dirs, files in os.walk(dst):
        for name in files:
            p = Path(root) / name
            if not p.is_symlink():
                p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        Path(root).chmod(
            stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
        )


class SubprocessSandbox(LocalSandbox):
    """Runs solutions as plain child processes. NOT isolated (see the module docstring).

    Args:
        copy_data: present a fresh copy of the public data to each execution (default). With
            ``False`` the solution gets the original folder, and a modification is only detected
            afterwards (size/mtime fingerprint) and reported as a warning.
        allow_same_user: when the trainer is not root, solutions run as the trainer's own user and
            can write everything it can: the solution environment, the staging folders, shipped
            data -- and plant answers (which this backend can read) where later isolated runs on
            this machine find them. It is then refused wherever an isolating backend (bubblewrap,
            Docker) can run here, unless this is ``True`` (tests and development on a machine
            whose isolated runs you do not rely on).
        output_root, cgroups: see :class:`~.base.LocalSandbox`.
    """

    name = "subprocess"
    isolated = False

    def __init__(
        self,
        *,
        copy_data: bool = True,
        output_root=None,
        cgroups="auto",
        solution_env=None,
        seccomp=True,
        users=None,
        allow_same_user: bool = False,
    ) -> None:
        if not isinstance(allow_same_user, bool):
            raise TypeError(f"allow_same_user must be True or False; got {allow_same_user!r}")
        if os.geteuid() != 0 and not allow_same_user:
            from .factory import backend_problems

            isolating = [
                name for name, why in backend_problems().items() if name != "subprocess" and why is None
            ]
            if isolating:
                raise SandboxError(
                    f"the subprocess backend would run solutions as your own user (uid {os.geteuid()}) on a "
                    f"machine where isolated executions run ({', '.join(isolating)} works here): a solution "
                    "could plant answers in the solution environment or the staging folders they read. "
                    f"Use {isolating[0]!r}, run the trainer as root (solutions then get their own uid), "
                    "or pass allow_same_user=True for tests and development"
                )
        super().__init__(
            output_root=output_root, cgroups=cgroups, solution_env=solution_env, seccomp=seccomp, users=users
        )
        self.copy_data = copy_data
        log.warning(NO_ISOLATION_WARNING)

    def protections(self) -> dict[str, str]:
        cg = self.cgroup_support
        return {
            "filesystem": "NO: the host filesystem is visible and writable as the host user",
            "answers": "NO: readable if the sandbox user can read them",
            "user": user_policy(),
            "syscalls": "the same seccomp filter as bwrap" if self.seccomp else "NO seccomp filter",
            "launcher": "another uid (root) when the trainer is root; stopping it after the start is the solution's failure",
            "ipc": "when the trainer is root: a private IPC namespace and private /tmp and /dev/shm "
            "(tmpfs of disk_mb); always: everything the sandbox user still owns on the host purged "
            "after each run",
            "network": "NO",
            "processes": "process-group kill + environment-marker sweep"
            + (
                " + cgroup kill"
                if cg
                else " (a process that clears its environment and calls setsid escapes)"
            ),
            "wall_time": "launcher timer + host deadline",
            "memory": f"cgroup memory limit ({cg.describe()})"
            if cg
            else "RLIMIT_AS per process + tree-RSS watchdog (polled)",
            "process_count": "cgroup pids.max" if cg else "watchdog (polled task count of the process tree)",
            "file_size": "RLIMIT_FSIZE",
            "disk": "NO: only the per-file limit; the work dir is on the host disk",
            "output": "host counts relayed bytes and kills over the limit",
            "environment": "allow-list only",
            "threads": "thread-count variables + CPU affinity",
            "public_data": "fresh copy per execution"
            if self.copy_data
            else "NO: shared; modification detected afterwards",
        }

    def _pre_warnings(self, limits: Limits) -> list[str]:
        log.warning(NO_ISOLATION_WARNING)
        out = [NO_ISOLATION_WARNING]
        if limits.gpu is not False:
            out.append(
                "subprocess backend: GPUs are selected only through CUDA_VISIBLE_DEVICES, not isolated"
            )
        return out

    def _spawn_spec(
        self, *, stage, data_dir, limits, cpus, rlimits, execution_id, user: SandboxUser, seccomp
    ) -> SpawnSpec:
        work = stage / "work"
        tmp = stage / "tmp"
        code = stage / "code"
        for d in (work, tmp):
            d.mkdir(mode=0o700)
            if user.dedicated:
                os.chown(d, user.uid, user.gid)
        code.mkdir()
        (stage / "solution.py").rename(code / "solution.py")
        os.chmod(code, 0o555)
        if self.copy_data:
            data = stage / "data"
            _read_only_copy(data_dir, data)
            before = None
        else:
            data = data_dir
            before = _fingerprint(data_dir)
        if limits.gpu is False:
            cuda = ""
        elif limits.gpu is True:
            cuda = None
        else:
            cuda = ",".join(str(i) for i in limits.gpu)
        marker = f"{MARKER_VAR}={execution_id}"
        # run() never reaches _run without a solution environment (self.problem says why not)
        assert self.solution_env is not None
        python = str(self.solution_env.python)
        env = sandbox_env(
            limits,
            data_dir=str(data),
            submission_path=str(work / SUBMISSION_NAME),
            work_dir=str(work),
            tmp_dir=str(tmp),
            python_bin_dir=str(Path(python).parent),
            cuda_visible_devices=cuda,
            extra={MARKER_VAR: execution_id},
        )
        rlimits = dict(rlimits)
        if user.dedicated:
            # The uid is this execution's alone, so the per-user process count is a hard bound
            # on its tasks even without a cgroup (threads count too).
            rlimits["NPROC"] = limits.max_processes
        cfg = {
            "python": python,
            "solution": str(code / "solution.py"),
            "cwd": str(work),
            "wall_time_s": limits.wall_time_s,
            "submission_path": str(work / SUBMISSION_NAME),
            "submission_cap": limits.submission_bytes,
            "rlimits": rlimits,
            "cpus": cpus,
            "seccomp": seccomp,
            "drop_privileges": [user.uid, user.gid] if user.dedicated else None,
            # As root the launcher can give the solution its own System V IPC and message queues,
            # and its own /tmp and /dev/shm (the stage, and the data and interpreter wherever they
            # lie, bound back in).
            "private_ipc": os.geteuid() == 0,
            "private_tmp": {
                "size_bytes": limits.disk_bytes,
                "keep": sorted({str(stage), str(data), str(Path(python).parent.parent)}),
            }
            if os.geteuid() == 0
            else None,
        }

        def kill(pid: int, started: dict | None) -> None:
            kill_process_group(pid)
            if started and isinstance(started.get("pgid"), int):
                kill_process_group(started["pgid"])
            procscan.kill_pids(procscan.find_by_environ(marker))

        def after(started: dict | None) -> list[str]:
            warnings = []
            if started and started.get("private_ipc") is False:
                warnings.append(
                    f"no private IPC namespace ({started.get('private_ipc_problem')}): the solution's "
                    "System V IPC objects are purged after the run instead"
                )
            if started and started.get("private_tmp") is False:
                warnings.append(
                    f"no private /tmp and /dev/shm ({started.get('private_tmp_problem')}): what the "
                    "solution leaves there is purged after the run instead"
                )
            if started and isinstance(started.get("pgid"), int):
                kill_process_group(started["pgid"])
            strays = procscan.find_by_environ(marker)
            if strays:
                procscan.kill_pids(strays)
                warnings.append(
                    f"killed {len(strays)} stray process(es) the solution left running outside its process group"
                )
            if before is not None and _fingerprint(data_dir) != before:
                warnings.append(f"the public data folder {data_dir} was MODIFIED during this execution")
            # No chmod here: the work dir is the solution's, and os.chmod follows the links it
            # may have left there (a test once saw "/" become 0700). The base removes the stage.
            return warnings

        # The launcher itself runs with the trainer's interpreter (trusted code, stdlib only); the
        # solution with the solution environment's.
        argv = [sys.executable, "-I", "-S", str(LAUNCHER_PATH), json.dumps(cfg)]
        return SpawnSpec(
            argv=argv,
            env=env,
            cwd=str(work),
            kill=kill,
            after=after,
        )
