"""Bubblewrap backend: every execution in fresh Linux namespaces (the default where it works).

What the solution sees (inside paths)::

    /usr/bin, /usr/lib/<arch>, /usr/lib64, the base interpreter's standard library,
    /usr/lib/locale, /usr/share/zoneinfo
                                      host system, read-only (not the rest of /usr); /bin, /lib*
                                      are the usual symbolic links into them
    /etc                              ld.so cache/config, localtime, alternatives (read-only) and a
                                      synthetic passwd/group/hosts; nothing else of the host's /etc
    /opt/solution-env                 the solution environment (its own interpreter and libraries,
                                      no dataset files), read-only
    /sandbox/data                     the public data folder, read-only (DATA_DIR)
    /sandbox/code                     the solution and the launcher, read-only (copied in)
    /sandbox/work                     empty tmpfs of ``disk_mb`` (cwd, HOME; SUBMISSION_PATH is here)
    /tmp, /dev/shm                    empty private tmpfs of ``disk_mb`` each (TMPDIR)
    /proc, /dev                       a fresh procfs of the new PID namespace (``/proc/sys``
                                      read-only); a minimal, sealed /dev

Nothing else of the host exists inside: no home directories, no task folders, no answers, not
the trainer's interpreter. bubblewrap itself runs as a dedicated unprivileged host user
(``setpriv`` drops root before it starts, see :mod:`.users`), so the sandbox user (uid 1000
inside) is that user outside, never root. Namespaces: user (no capabilities; no further user
namespaces), mount, PID (the launcher is PID 1; when it dies, the kernel kills every process in
the namespace, including ones that ``setsid``/double-forked away), network (only a private
loopback: the host's ``127.0.0.1`` services are unreachable), IPC, UTS. ``--die-with-parent``
ties the sandbox to the supervising Python process.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from .base import LAUNCHER_PATH, SUBMISSION_NAME, LocalSandbox, kill_process_group
from .environment import sandbox_env, system_paths
from .limits import Limits
from .solution_env import INSIDE_PATH
from .staging import readable_by_others
from .supervisor import SpawnSpec
from .users import DEFAULT_UID_BASE, SandboxUser, user_policy

__all__ = ["BwrapSandbox", "bwrap_problem"]

log = logging.getLogger("wmrl.autoresearch.sandbox")

INSIDE_ROOT = "/sandbox"
INSIDE_DATA = f"{INSIDE_ROOT}/data"
INSIDE_WORK = f"{INSIDE_ROOT}/work"
INSIDE_CODE = f"{INSIDE_ROOT}/code"
INSIDE_TMP = "/tmp"
SANDBOX_UID = 1000
# Top-level system folders: on a merged-/usr host they are links into /usr (re-created as links);
# otherwise bound read-only.
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/nsswitch.conf",
)
_PASSWD = f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{INSIDE_WORK}:/usr/sbin/nologin\n"
_GROUP = f"sandbox:x:{SANDBOX_UID}:\n"
_HOSTS = "127.0.0.1 localhost sandbox\n::1 localhost\n"


GpuSysView = Literal["auto", "minimal", "full"]
# What CUDA reads from /sys (sandbox projects that run CUDA under bubblewrap report these, and
# cuInit fails with CUDA_ERROR_OPERATING_SYSTEM without any /sys): the driver modules' state, the
# PCI devices (links under /sys/bus/pci into /sys/devices/pci*) and the CPU and NUMA topology.
# Not the rest of the host's /sys: firmware tables, the kernel's own folders, cgroups, network
# interfaces, block devices.
_GPU_SYS_MINIMAL = (
    "/sys/module/nvidia",
    "/sys/module/nvidia_uvm",
    "/sys/module/nvidia_modeset",
    "/sys/module/nvidia_drm",
    "/sys/bus/pci",
    "/sys/devices/system/cpu",
    "/sys/devices/system/node",
)
_CUINIT = (
    "import ctypes\n"
    "try:\n    lib = ctypes.CDLL('libcuda.so.1')\nexcept OSError:\n    print('no driver')\n"
    "else:\n    print(lib.cuInit(0))\n"
)


def _sys_args(view: str) -> list[str]:
    """bubblewrap arguments for a GPU execution's view of ``/sys`` (read-only either way)."""
    if view == "full":
        return ["--ro-bind-try", "/sys", "/sys"]
    paths = [*_GPU_SYS_MINIMAL, *sorted(glob.glob("/sys/devices/pci*"))]
    return [arg for path in paths for arg in ("--ro-bind-try", path, path)]


@functools.lru_cache(maxsize=8)
def bwrap_problem(binary: str | None = None) -> str | None:
    """``None`` when bubblewrap can create a sandbox here, else why not (cached)."""
    path = binary or shutil.which("bwrap")
    if path is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    # Probe the way executions run: as an unprivileged user when we are root (that needs
    # unprivileged user namespaces, which some hosts switch off).
    prefix = _as_user(DEFAULT_UID_BASE, DEFAULT_UID_BASE)
    cmd = [
        *(prefix if os.geteuid() == 0 else []),
        path,
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "true",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap failed to start: {exc}"
    if done.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()}"
    return None


def _setpriv() -> str:
    return shutil.which("setpriv") or "/usr/bin/setpriv"


def _as_user(uid: int, gid: int) -> list[str]:
    """The command prefix that drops root to ``uid``/``gid`` (no groups) before bubblewrap starts."""
    return [_setpriv(), f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _memfd(name: str, data: bytes) -> int:
    """An anonymous file holding ``data`` (bubblewrap copies it in: no host path is bound)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class BwrapSandbox(LocalSandbox):
    """Executions in bubblewrap namespaces. See the module docstring for the view inside.

    Args:
        bwrap: path of the ``bwrap`` binary (default: found on ``PATH``).
        hidden_paths: host folders to hide (an empty read-only tmpfs over them) should they fall
            inside a bound folder (one of ``extra_ro_paths``).
        extra_ro_paths: more host folders to bind read-only at their host paths (a folder of model
            weights). Never bind a folder that holds answers or datasets.
        output_root, cgroups, solution_env, seccomp, users: see :class:`~.base.LocalSandbox`.
    """

    name = "bwrap"
    isolated = True

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        hidden_paths: Iterable[str | os.PathLike] = (),
        extra_ro_paths: Iterable[str | os.PathLike] = (),
        output_root=None,
        cgroups="auto",
        solution_env=None,
        seccomp=True,
        users=None,
        gpu_sys: GpuSysView = "auto",
    ) -> None:
        super().__init__(
            output_root=output_root, cgroups=cgroups, solution_env=solution_env, seccomp=seccomp, users=users
        )
        if gpu_sys not in ("auto", "minimal", "full"):
            raise ValueError(f"gpu_sys must be 'auto', 'minimal' or 'full'; got {gpu_sys!r}")
        self.gpu_sys = gpu_sys
        # (view, why): decided at the first execution given a GPU ("auto"), then kept.
        self._gpu_sys_decided: tuple[str, str] | None = None if gpu_sys == "auto" else (gpu_sys, "configured")
        self._gpu_sys_lock = threading.Lock()
        self.bwrap = bwrap or shutil.which("bwrap")
        own = (
            bwrap_problem(self.bwrap)
            if self.bwrap
            else "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
        )
        self.problem = own or self.problem
        extra = [Path(os.path.realpath(p)) for p in extra_ro_paths]
        for p in extra:
            if not p.is_dir():
                raise ValueError(f"extra_ro_paths entry {p} is not an existing folder")
            if p == Path("/"):
                raise ValueError("extra_ro_paths must not contain / (that would expose the whole host)")
            if _inside(p, [Path(INSIDE_ROOT), Path(INSIDE_PATH)]):
                raise ValueError(f"extra_ro_paths entry {p} collides with the sandbox's own folders")
            if os.geteuid() == 0 and not readable_by_others(p):
                # bubblewrap runs as the unprivileged sandbox user and binds by path.
                raise ValueError(
                    f"extra_ro_paths entry {p} is not readable by other users (chmod o+rX, and its parents o+x)"
                )
        self._extra = [r for r in extra if not _inside(r, [Path("/usr")])]
        self._hidden = [Path(os.path.realpath(p)) for p in hidden_paths]
        self._system = system_paths(self.solution_env) if self.solution_env is not None else []

    def tmp_mount_points(self) -> list[str]:
        tmp = Path(INSIDE_TMP)
        return sorted({r.relative_to(tmp).parts[0] for r in self._extra if tmp in r.parents})

    def protections(self) -> dict[str, str]:
        cg = self.cgroup_support
        return {
            "filesystem": "mount namespace: only part of /usr, the solution environment and the public data, read-only",
            "answers": "never mounted",
            "datasets": "separate solution environment: no wmrl, no dataset packages, bundled dataset files pruned",
            "user": user_policy(),
            "syscalls": "seccomp: a deny list of calls, an allow list of socket families, nothing aimed at the launcher, no locks, watches or asynchronous I/O"
            if self.seccomp
            else "NO seccomp filter (seccomp=False)",
            "proc_sys": "/proc/sys read-only",
            "launcher": "PID 1 of the namespace, out of the solution's reach; stopping it after the start is the solution's failure",
            "ipc": "IPC namespace; private /tmp, /dev/shm; no pseudo-terminals",
            "network": "network namespace (private loopback only)",
            "processes": "PID namespace; killing bwrap kills every process inside (setsid cannot escape)",
            "wall_time": "launcher timer + host deadline, whole namespace killed",
            "memory": f"cgroup memory limit ({cg.describe()})"
            if cg
            else "RLIMIT_AS per process + tree-RSS watchdog (polled)",
            "process_count": "cgroup pids.max" if cg else "watchdog (polled task count)",
            "file_size": "RLIMIT_FSIZE",
            "disk": "tmpfs size= on the work dir and /tmp",
            "output": "host counts relayed bytes and kills over the limit",
            "environment": "allow-list only",
            "threads": "thread-count variables + CPU affinity",
            "gpu_sys": self._describe_gpu_sys(),
            "cpus": "cgroup cpuset + CFS quota"
            if cg is not None and {"cpuset", "cpu"} <= cg.cpu_controllers
            else "CPU affinity set before the solution starts; seccomp refuses sched_setaffinity to the solution",
        }

    def _describe_gpu_sys(self) -> str:
        decided = self._gpu_sys_decided
        if decided is None:
            return "GPU executions: a minimal /sys (driver modules, PCI devices, CPU/NUMA topology), checked against cuInit at the first one"
        view, why = decided
        what = (
            "a minimal /sys (driver modules, PCI devices, CPU/NUMA topology)"
            if view == "minimal"
            else "the whole /sys, read-only"
        )
        return f"GPU executions: {what} ({why})"

    def _pre_warnings(self, limits: Limits) -> list[str]:
        out = []
        if self.cgroup_support is None:
            out.append(
                "no cgroup: memory is bounded per process (RLIMIT_AS) and the task count by a polled watchdog"
            )
        devices, problems = self._gpu_device_args(limits)
        if limits.gpu is not False and not problems:
            view, why = self._gpu_sys_view(devices, limits)
            if view == "full":
                out.append(f"GPU slot: the whole /sys is bound read-only ({why})")
        return out

    def _gpu_args(self, limits: Limits) -> tuple[list[str], list[str]]:
        """(bwrap arguments, problems) exposing the requested NVIDIA devices and their /sys view."""
        devices, problems = self._gpu_device_args(limits)
        if limits.gpu is False or problems:
            return devices, problems
        view, _ = self._gpu_sys_view(devices, limits)
        return devices + _sys_args(view), []

    def _gpu_device_args(self, limits: Limits) -> tuple[list[str], list[str]]:
        """(bwrap arguments, problems) exposing the requested NVIDIA device nodes."""
        if limits.gpu is False:
            return [], []
        nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
        if not nodes:
            return [], ["a GPU was requested but no NVIDIA device nodes exist on this host"]
        if limits.gpu is not True:
            wanted = {f"/dev/nvidia{i}" for i in limits.gpu}
            missing = sorted(wanted - set(nodes))
            if missing:
                return [], [f"requested GPU device nodes do not exist: {missing}"]
            nodes = sorted(wanted)
        args = []
        for node in [
            *nodes,
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
        ]:
            args += ["--dev-bind-try", node, node]
        args += ["--dev-bind-try", "/dev/nvidia-caps", "/dev/nvidia-caps"]
        return args, []

    def _gpu_sys_view(self, device_args: list[str], limits: Limits) -> tuple[str, str]:
        """``("minimal" | "full", why)``: which ``/sys`` a GPU execution sees.

        ``auto`` decides once, at the first GPU execution: CUDA's ``cuInit`` is tried under the
        minimal view in a sandbox like the executions' own; the minimal view is kept when it
        works or when no CUDA driver is there to try, the whole ``/sys`` (read-only) when CUDA
        initialises only with it -- said in every such result, never silently.
        """
        with self._gpu_sys_lock:
            if self._gpu_sys_decided is None:
                self._gpu_sys_decided = self._probe_gpu_sys(device_args, limits)
                log.info("bwrap GPU /sys view: %s (%s)", *self._gpu_sys_decided)
            return self._gpu_sys_decided

    def _probe_gpu_sys(self, device_args: list[str], limits: Limits) -> tuple[str, str]:
        verdicts = {}
        for view in ("minimal", "full"):
            verdicts[view] = self._cuinit_under(device_args + _sys_args(view), limits)
            if verdicts[view] in ("0", "no driver"):
                break
        minimal = verdicts["minimal"]
        if minimal == "0":
            return "minimal", "cuInit succeeded under the minimal view"
        if minimal == "no driver":
            return "minimal", "no CUDA driver (libcuda.so.1) to try"
        if verdicts.get("full") == "0":
            return (
                "full",
                f"cuInit failed under the minimal view ({minimal}) and succeeded with the whole /sys",
            )
        return "minimal", f"cuInit failed under both views (minimal: {minimal}; full: {verdicts.get('full')})"

    def _cuinit_under(self, gpu_args: list[str], limits: Limits) -> str:
        """``cuInit(0)``'s return code inside a sandbox with these device and /sys arguments
        (``"0"`` = CUDA initialised), ``"no driver"``, or what went wrong."""
        return self._probe(gpu_args, limits, _CUINIT)

    def _probe(self, gpu_args: list[str], limits: Limits, code: str) -> str:
        """What ``code`` prints (stripped) in a sandbox like an execution's, with ``gpu_args``."""
        if self.bwrap is None or self.solution_env is None:
            return "bubblewrap or the solution environment is missing"
        with tempfile.TemporaryDirectory(prefix="wmrl-gpu-probe-") as data:
            os.chmod(data, 0o755)
            args = self._bwrap_args(data_dir=Path(data), limits=limits, gpu_args=gpu_args, files={})
            user = self.users.acquire()
            try:
                prefix = _as_user(user.uid, user.gid) if user.dedicated else []
                done = subprocess.run(
                    [
                        *prefix,
                        self.bwrap,
                        *args,
                        "--",
                        self.solution_env.inside_python,
                        "-I",
                        "-S",
                        "-c",
                        code,
                    ],
                    capture_output=True,
                    timeout=120,
                    env={"PATH": "/usr/bin:/bin"},
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"the probe did not run: {exc}"
            finally:
                self.users.release(user)
        text = done.stdout.decode(errors="replace").strip()
        return text or f"exit {done.returncode}: {done.stderr.decode(errors='replace').strip()[-300:]}"

    def _bwrap_args(
        self, *, data_dir: Path, limits: Limits, gpu_args: list[str], files: dict[str, int]
    ) -> list[str]:
        """bubblewrap's options (the command follows them separately).

        ``files``: inside path -> memfd whose contents bubblewrap copies to that path, read-only.
        """
        a = [
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
            # The launcher is PID 1: a solution cannot kill it (and turn its own failure into a
            # harness error, whose grade is "unknown"); when it exits, the kernel kills the rest.
            "--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            # Scratch space first, so host paths bound below may sit under /tmp.
            "--size", str(limits.disk_bytes), "--tmpfs", INSIDE_TMP,
        ]  # fmt: skip
        for d in self._system:
            a += ["--ro-bind", d, d]
        for d in _SYSTEM_DIRS:
            if os.path.islink(d):
                a += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                a += ["--ro-bind", d, d]
        for f in _ETC_FILES:
            a += ["--ro-bind-try", f, f]
        # callers: _probe checks it; _spawn_spec runs under run(), which needs one (self.problem)
        assert self.solution_env is not None
        a += ["--ro-bind", str(self.solution_env.path), INSIDE_PATH]
        for r in self._extra:
            a += ["--ro-bind", str(r), str(r)]
        for h in self._hidden:
            if _inside(h, self._extra) and h.is_dir():
                a += ["--tmpfs", str(h), "--remount-ro", str(h)]
        # bubblewrap's /dev is a writable, unbounded tmpfs: give shared memory (multiprocessing,
        # joblib) its own capped tmpfs and seal the rest of /dev. bubblewrap leaves /proc/sys
        # writable where it judges it read-only already; bind it read-only explicitly.
        a += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
        a += ["--size", str(limits.disk_bytes), "--tmpfs", "/dev/shm"]
        # No pseudo-terminals: their count (kernel.pty.max) is one for the whole machine, and a
        # solution needs none. An empty read-only tmpfs hides bubblewrap's devpts instance.
        a += ["--size", "4096", "--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts", "--remount-ro", "/dev"]
        a += ["--size", str(limits.disk_bytes), "--tmpfs", INSIDE_WORK]
        a += ["--ro-bind", str(data_dir), INSIDE_DATA]
        for inside, fd in files.items():
            a += ["--ro-bind-data", str(fd), inside]
        a += gpu_args
        # bubblewrap builds the sandbox's root on a tmpfs of its own; left writable, it would be
        # scratch space outside the size caps (and memory outside RLIMIT_AS). Seal it: only the
        # work dir and /tmp (their own size-capped mounts) stay writable.
        a += ["--remount-ro", "/"]
        a += ["--chdir", INSIDE_WORK]
        return a

    def _spawn_spec(
        self, *, stage, data_dir, limits, cpus, rlimits, execution_id, user: SandboxUser, seccomp
    ) -> SpawnSpec:
        if self.bwrap is None:
            raise FileNotFoundError("bubblewrap (bwrap) is not installed (apt-get install bubblewrap)")
        for h in self._hidden:
            if data_dir == h or h in data_dir.parents:
                raise ValueError(f"the public data folder {data_dir} lies inside a hidden folder {h}")
        gpu_args, gpu_warnings = self._gpu_args(limits)
        if gpu_warnings:
            raise RuntimeError("; ".join(gpu_warnings))
        assert self.solution_env is not None  # run() reaches _run only with one (self.problem)
        python = self.solution_env.inside_python
        cfg = {
            "python": python,
            "solution": f"{INSIDE_CODE}/solution.py",
            "cwd": INSIDE_WORK,
            "wall_time_s": limits.wall_time_s,
            "submission_path": f"{INSIDE_WORK}/{SUBMISSION_NAME}",
            "submission_cap": limits.submission_bytes,
            "rlimits": rlimits,
            "cpus": cpus,
            "seccomp": seccomp,
        }
        fds: list[int] = []
        try:
            contents = {
                f"{INSIDE_CODE}/solution.py": (stage / "solution.py").read_bytes(),
                f"{INSIDE_CODE}/launcher.py": LAUNCHER_PATH.read_bytes(),
                "/etc/passwd": _PASSWD.encode(),
                "/etc/group": _GROUP.encode(),
                "/etc/hosts": _HOSTS.encode(),
            }
            files = {}
            for inside, data in contents.items():
                fds.append(_memfd(Path(inside).name, data))
                files[inside] = fds[-1]
            args = self._bwrap_args(data_dir=data_dir, limits=limits, gpu_args=gpu_args, files=files)
            # Pass the options through a pipe: the sandbox's PID 1 then shows only the launcher's
            # command line, not the host paths bubblewrap bound.
            payload = b"\0".join(x.encode() for x in args) + b"\0"
            if len(payload) > 60000:
                raise RuntimeError(
                    f"bubblewrap arguments too long ({len(payload)} bytes) for the --args pipe"
                )
            r, w = os.pipe()
            fds.append(r)
            os.write(w, payload)
            os.close(w)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        command = [python, "-I", "-S", f"{INSIDE_CODE}/launcher.py", json.dumps(cfg)]
        env = sandbox_env(
            limits,
            data_dir=INSIDE_DATA,
            submission_path=f"{INSIDE_WORK}/{SUBMISSION_NAME}",
            work_dir=INSIDE_WORK,
            tmp_dir=INSIDE_TMP,
            python_bin_dir=str(Path(python).parent),
            cuda_visible_devices=None if gpu_args else "",
        )
        # Drop root before bubblewrap starts: its user namespace then belongs to the sandbox user.
        prefix = _as_user(user.uid, user.gid) if user.dedicated else []

        def kill(pid: int, started: dict | None) -> None:
            # bwrap is the session leader; its PID-1 child has PDEATHSIG=SIGKILL, and when PID 1
            # of a namespace dies the kernel kills everything else in it.
            kill_process_group(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

        return SpawnSpec(
            argv=[*prefix, self.bwrap, "--args", str(r), "--", *command],
            env=env,
            cwd="/",
            kill=kill,
            pass_fds=tuple(fds),
        )
