"""Docker backend (docker-py): one fresh container per execution, used when an engine answers.

The container runs the same :mod:`.launcher` as the local backends, as the container's PID 1
(which the solution cannot signal; it reaps orphans), with:

- the same view of the system as the bubblewrap sandbox: an image built here (no registry:
  :mod:`.docker_image`) that is only a skeleton, with the host's ``/usr`` parts of
  :func:`~.environment.system_paths`, the ``/etc`` files and the solution environment (at
  ``/opt/solution-env``) bind-mounted read-only;
- ``user="<uid>:<gid>"``: a dedicated unprivileged host user per concurrent execution (the
  trainer's own user when it is not root), never root;
- ``network_mode="none"`` (no interface but loopback), ``read_only=True`` root filesystem,
  ``cap_drop=["ALL"]``, ``no-new-privileges``, Docker's default seccomp profile, and the
  launcher's own seccomp filter (the one every backend uses) stacked on it for the solution;
- the public data bind-mounted read-only at ``/sandbox/data``; the solution and the launcher
  read-only under ``/sandbox/code``; the answers never mounted;
- ``/sandbox/work`` and ``/tmp`` as tmpfs of ``disk_mb`` each;
- ``mem_limit`` = ``memswap_limit`` (no swap), ``pids_limit``, ``cpuset_cpus`` (a real cpuset of
  the cores it was given) and ``nano_cpus`` (a CPU quota of as many cores), ``ulimits`` for file
  size, open files and core dumps;
- GPUs through ``device_requests`` (``count=-1`` for all, else ``device_ids``) when asked;
- the json-file log driver capped near the output limit, so a flood cannot fill the host disk.

The launcher writes frames to the container's stdout; the host reads them with
``container.logs(stream=True, follow=True, stdout=True, stderr=False)``. Wall time: the launcher's
timer, and a host timer that kills the container. At the end the container is removed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from .base import (
    _CPUS,
    LAUNCHER_PATH,
    SUBMISSION_NAME,
    Sandbox,
    SandboxError,
    _remove_tree,
    measured_resources,
    purge_after_run,
)
from .bwrap import _ETC_FILES
from .cgroups import CgroupStats, groups_of_pid, stats_of
from .docker_image import ensure_image
from .environment import sandbox_env, system_paths
from .limits import Limits
from .result import ExecutionResult
from .solution_env import INSIDE_PATH
from .staging import StagingArea, fingerprint, readable_by_others
from .supervisor import RawOutcome, Tail, _FrameReader, classify, host_deadline_s, relay_chunk
from .users import SandboxUser, user_policy

__all__ = ["DockerSandbox", "docker_problem"]

log = logging.getLogger("wmrl.autoresearch.sandbox")

INSIDE_DATA = "/sandbox/data"
INSIDE_WORK = "/sandbox/work"
INSIDE_CODE = "/sandbox/code"
#: ``image=`` value meaning "the skeleton image built here" (:mod:`.docker_image`).
LOCAL_IMAGE = "wmrl-sandbox"


@functools.lru_cache(maxsize=4)
def docker_problem(timeout_s: float = 5.0) -> str | None:
    """``None`` when a Docker engine answers ``ping``, else why not (cached)."""
    try:
        import docker
    except ImportError:
        return "the docker Python package is not installed (pip install docker)"
    try:
        client = docker.from_env(timeout=int(max(1, timeout_s)))
        client.ping()
        client.close()
    except Exception as exc:
        return f"no Docker engine answers: {type(exc).__name__}: {exc}"
    return None


class DockerSandbox(Sandbox):
    """Executions in fresh Docker containers.

    Args:
        image: ``"wmrl-sandbox"`` (default): the skeleton image built here on first use, with the
            system and the solution environment bound in. Any other name: an image that must
            exist locally (unless ``pull=True``) and is run with the same binds; it only
            contributes its top-level layout.
        runtime: OCI runtime (``runsc`` for gVisor, ``sysbox-runc``...), or ``None`` for the default.
        pull: pull ``image`` when it is missing.
        client: a ``docker.DockerClient`` (default ``docker.from_env()``).
        output_root, solution_env, seccomp, users: see :class:`~.base.Sandbox`.
    """

    name = "docker"
    isolated = True

    def __init__(
        self,
        *,
        image: str = LOCAL_IMAGE,
        runtime: str | None = None,
        pull: bool = False,
        client=None,
        output_root=None,
        solution_env=None,
        seccomp=True,
        users=None,
    ) -> None:
        super().__init__(output_root=output_root, solution_env=solution_env, seccomp=seccomp, users=users)
        self.image = image
        self.runtime = runtime
        self.pull = pull
        self._client = client
        self._client_lock = threading.Lock()
        self._image_lock = threading.Lock()
        self._resolved_image: str | None = None
        self.problem = (None if client is not None else docker_problem()) or self.problem
        self._system = system_paths(self.solution_env) if self.solution_env is not None else []
        self._data_copies: StagingArea | None = None

    def protections(self) -> dict[str, str]:
        return {
            "filesystem": "container: read-only root, part of /usr, the solution environment and the data read-only, tmpfs scratch",
            "answers": "never mounted",
            "datasets": "separate solution environment: no wmrl, no dataset packages, bundled dataset files pruned",
            "user": user_policy(),
            "syscalls": "Docker's default seccomp profile + the sandbox's filter (a deny list of calls, an allow list of socket families, nothing aimed at the launcher, no locks, watches or asynchronous I/O)"
            if self.seccomp
            else "Docker's default seccomp profile only",
            "proc_sys": "/proc/sys read-only (Docker)",
            "launcher": "PID 1 of the container, out of the solution's reach; stopping it after the start is the solution's failure",
            "ipc": "the container's IPC namespace; private /tmp; no pseudo-terminals",
            "network": "network_mode=none",
            "processes": "container removed at the end (its PID namespace dies with it)",
            "wall_time": "launcher timer + host timer killing the container",
            "memory": "mem_limit = memswap_limit (cgroup)",
            "process_count": "pids_limit",
            "file_size": "ulimit fsize",
            "disk": "tmpfs size= on the work dir and /tmp",
            "output": "host counts relayed bytes and kills; json-file log capped",
            "environment": "allow-list only",
            "threads": "thread-count variables + nano_cpus quota",
            "cpus": "cpuset_cpus + nano_cpus quota (cgroup)",
        }

    @property
    def client(self):
        with self._client_lock:
            if self._client is None:
                if self.problem is not None:
                    raise SandboxError(self.problem)
                import docker

                self._client = docker.from_env(timeout=60)
            return self._client

    def _image(self, client) -> str:
        with self._image_lock:
            if self._resolved_image is None:
                if self.image == LOCAL_IMAGE:
                    uids = range(self.users.base, self.users.base + self.users.count)
                    self._resolved_image = ensure_image(client, self._mount_points(), uids)
                else:
                    self._resolved_image = self.image
            return self._resolved_image

    def _mount_points(self) -> list[str]:
        return [*self._system, *(f for f in _ETC_FILES if os.path.exists(f))]

    def _volumes(self, stage: Path, data_dir: Path) -> dict:
        # run() never reaches _run without a solution environment (self.problem says why not)
        assert self.solution_env is not None
        vols = {
            str(data_dir): {"bind": INSIDE_DATA, "mode": "ro"},
            str(stage / "solution.py"): {"bind": f"{INSIDE_CODE}/solution.py", "mode": "ro"},
            str(stage / "launcher.py"): {"bind": f"{INSIDE_CODE}/launcher.py", "mode": "ro"},
            str(self.solution_env.path): {"bind": INSIDE_PATH, "mode": "ro"},
        }
        for path in self._mount_points():
            vols[path] = {"bind": path, "mode": "ro"}
        return vols

    def data_view(self, data_dir: Path) -> Path:
        """``data_dir``, or a verified read-only copy when the container user could not read it."""
        if readable_by_others(data_dir, ancestors=False):
            return data_dir
        with self._image_lock:
            if self._data_copies is None:
                self._data_copies = StagingArea(self.output_root / ".data-copies")
        key = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16] + "-" + fingerprint(data_dir)
        return self._data_copies.stage(key, data_dir)

    def _create_kwargs(
        self,
        *,
        stage: Path,
        data_dir: Path,
        limits: Limits,
        execution_id: str,
        user: SandboxUser,
        cpus: list[int],
        image: str,
    ) -> dict:
        """Keyword arguments of ``client.containers.create`` for one execution (pure; tested)."""
        from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

        assert self.solution_env is not None  # as in _volumes
        python = self.solution_env.inside_python
        cfg = {
            "python": python,
            "solution": f"{INSIDE_CODE}/solution.py",
            "cwd": INSIDE_WORK,
            "wall_time_s": limits.wall_time_s,
            "submission_path": f"{INSIDE_WORK}/{SUBMISSION_NAME}",
            "submission_cap": limits.submission_bytes,
            # Docker enforces these itself; AS stays unset (the cgroup bounds memory).
            "rlimits": {"FSIZE": limits.file_size_bytes, "NOFILE": limits.open_files, "CORE": 0},
            # The cpuset bounds the CPUs: the solution may re-pin itself only within it.
            "cpus": None,
            "seccomp": self.seccomp_program(deny_affinity=False),
        }
        env = sandbox_env(
            limits,
            data_dir=INSIDE_DATA,
            submission_path=f"{INSIDE_WORK}/{SUBMISSION_NAME}",
            work_dir=INSIDE_WORK,
            tmp_dir="/tmp",
            python_bin_dir=str(Path(python).parent),
            cuda_visible_devices=None if limits.gpu is not False else "",
        )
        device_requests = None
        if limits.gpu is True:
            device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        elif limits.gpu:
            device_requests = [DeviceRequest(device_ids=[str(i) for i in limits.gpu], capabilities=[["gpu"]])]
        kwargs = {
            "image": image,
            "command": [python, "-I", "-S", f"{INSIDE_CODE}/launcher.py", json.dumps(cfg)],
            "detach": True,
            "environment": env,
            "working_dir": INSIDE_WORK,
            "hostname": "sandbox",
            "user": f"{user.uid}:{user.gid}",
            "network_mode": "none",
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            # The launcher is the container's PID 1 (no docker-init): the solution cannot signal
            # it, so it cannot turn its own failure into a harness error; it reaps orphans itself.
            "init": False,
            "mem_limit": limits.memory_bytes,
            "memswap_limit": limits.memory_bytes,
            "pids_limit": limits.max_processes,
            "cpuset_cpus": ",".join(str(c) for c in cpus),
            "nano_cpus": int(len(cpus) * 1e9),
            "ulimits": [
                Ulimit(name="fsize", soft=limits.file_size_bytes, hard=limits.file_size_bytes),
                Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
                Ulimit(name="core", soft=0, hard=0),
            ],
            # Writable by the sandbox user only through these size-capped tmpfs mounts.
            "mounts": [
                *(
                    Mount(target, None, type="tmpfs", tmpfs_size=limits.disk_bytes, tmpfs_mode=0o1777)
                    for target in (INSIDE_WORK, "/tmp")
                ),
                # No pseudo-terminals (kernel.pty.max is one count for the whole machine): an
                # empty read-only tmpfs replaces the container's devpts instance.
                Mount("/dev/pts", None, type="tmpfs", read_only=True, tmpfs_size=4096),
            ],
            "volumes": self._volumes(stage, data_dir),
            # Output travels over the attach stream only: nothing is logged on the host's disk.
            "log_config": LogConfig(type=LogConfig.types.NONE),
            "labels": {"wmrl.sandbox.execution": execution_id},
        }
        if device_requests is not None:
            kwargs["device_requests"] = device_requests
        if self.runtime is not None:
            kwargs["runtime"] = self.runtime
        return kwargs

    def _run(self, code: str, data_dir: Path, limits: Limits, execution_id: str) -> ExecutionResult:
        import docker

        client = self.client
        stage = Path(os.path.realpath(self.output_root / f".stage-{execution_id}"))
        stage.mkdir()
        os.chmod(stage, 0o755)
        (stage / "solution.py").write_text(code, encoding="utf-8")
        # A copy, not the package's file: a bind mount shows its source path (the checkout) inside.
        shutil.copyfile(LAUNCHER_PATH, stage / "launcher.py")
        for name in ("solution.py", "launcher.py"):
            os.chmod(stage / name, 0o444)
        dest = self.output_root / execution_id / SUBMISSION_NAME
        out = RawOutcome(stdout=Tail(limits.tail_bytes), stderr=Tail(limits.tail_bytes))
        container = None
        user = self.users.acquire()
        cpus = _CPUS.acquire(limits.effective_cpus(len(_CPUS.cores)))
        t0 = time.monotonic()
        try:
            if self.image != LOCAL_IMAGE:
                try:
                    client.images.get(self.image)
                except docker.errors.ImageNotFound:
                    if not self.pull:
                        return ExecutionResult(
                            status="harness_error",
                            reason=f"Docker image {self.image!r} is not present (docker pull {self.image}, or pull=True)",
                        )
                    client.images.pull(self.image)
            try:
                kwargs = self._create_kwargs(
                    stage=stage,
                    data_dir=self.data_view(data_dir),
                    limits=limits,
                    execution_id=execution_id,
                    user=user,
                    cpus=cpus,
                    image=self._image(client),
                )
                container = client.containers.create(**kwargs)
                # Attached before start, so no byte is missed. The attach stream carries raw bytes;
                # the log driver would not (it stores lines as JSON text and mangles binary frames).
                stream = container.attach(stdout=True, stderr=True, stream=True, demux=True, logs=False)
                container.start()
            except docker.errors.DockerException as exc:
                why = "a GPU was requested and the engine " if limits.gpu is not False else "the engine "
                return ExecutionResult(
                    status="harness_error", reason=f"{why}could not start the container: {exc}"
                )
            monitor = _ContainerMonitor(container)
            self._pump(container, stream, out, limits, dest, monitor)
            try:
                status = container.wait(timeout=30)
                code_ = int(status.get("StatusCode", -1))
            except Exception as exc:
                out.warnings.append(f"container.wait failed: {exc}")
                code_ = -1
            out.wait_status = (code_ & 0xFF) << 8 if code_ >= 0 else None
            oom = False
            with contextlib.suppress(Exception):
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            last = monitor.last
            out.cgroup_stats = CgroupStats(
                # CPU from the launcher's rusage: the group is gone before a last sample is taken.
                cpu_s=None,
                peak_memory_bytes=last.peak_memory_bytes if last else None,
                oom_kills=max(int(oom), last.oom_kills if last else 0),
                pids_peak=last.pids_peak if last else None,
                pids_limit_hits=last.pids_limit_hits if last else 0,
            )
        finally:
            out.wall_s = time.monotonic() - t0
            if container is not None:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            _CPUS.release(cpus)
            try:
                out.warnings.extend(purge_after_run(user))
            finally:  # the uid and the stage go back whatever the clean-up met
                self.users.release(user)
                _remove_tree(stage)
        if out.host_kill is not None or out.exit_info is None:
            with contextlib.suppress(FileNotFoundError):
                dest.unlink()
        return self._result(out, limits, dest)

    def _pump(self, container, stream, out: RawOutcome, limits: Limits, dest: Path, monitor) -> None:
        """Read the launcher's frames from the container's stdout until it ends or is killed.

        ``stream``: the attach stream, yielding ``(stdout bytes | None, stderr bytes | None)``;
        the launcher's own stderr (diagnostics) goes to a bounded tail.
        """
        reader = _FrameReader(out, dest, limits.submission_bytes)

        killer: list[threading.Thread] = []

        def kill(kind: str, message: str) -> None:
            if out.host_kill is None:
                out.host_kill = (kind, message)
            if killer:
                return

            def _kill() -> None:
                with contextlib.suppress(Exception):
                    container.kill()

            # On another thread: the engine answers the kill only once it has written what the
            # container printed, so this thread must keep draining the attach stream meanwhile.
            killer.append(threading.Thread(target=_kill, daemon=True))
            killer[0].start()

        timer = threading.Timer(
            host_deadline_s(limits),
            kill,
            args=(
                "timeout",
                f"wall time: the execution ran past {limits.wall_time_s:g} s and the host killed the container",
            ),
        )
        timer.daemon = True
        timer.start()
        monitor.start(
            lambda: kill(
                "processes",
                f"process limit: the execution tried to hold more than {limits.max_processes} tasks (processes + threads)",
            )
        )
        try:
            for chunk, err in stream:
                if err:
                    out.launcher_stderr.add(err)
                if chunk:
                    relay_chunk(out, reader, chunk, limits, kill)
        finally:
            timer.cancel()
            monitor.stop()
            reader.close()
            with contextlib.suppress(Exception):
                stream.close()
            for t in killer:
                t.join(timeout=30)

    def _result(self, out: RawOutcome, limits: Limits, dest: Path) -> ExecutionResult:
        c = classify(out, limits)
        info = out.exit_info or {}
        summary = info.get("submission") or {}
        submission, error = None, None
        if out.submission_over_cap:
            error = f"the submission is over the {limits.submission_bytes}-byte limit"
        elif summary.get("error"):
            error = summary["error"]
        elif summary.get("present"):
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(b"")
            submission = dest
        resources = measured_resources(out)
        assert out.stdout is not None and out.stderr is not None  # built with both tails above
        return ExecutionResult(
            status=c.status,
            exit_code=c.exit_code,
            signal=c.signal,
            reason=c.reason,
            stdout_tail=out.stdout.text(),
            stderr_tail=out.stderr.text(),
            stdout_bytes=out.stdout.total,
            stderr_bytes=out.stderr.total,
            submission=submission,
            submission_error=error,
            resources=resources,
            warnings=[
                *out.warnings,
                "docker backend: CPU time is the solution tree's rusage as the launcher measured it; peak memory and tasks are the container cgroup's, sampled every 0.1 s",
            ],
        )

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
                self._client = None


class _ContainerMonitor:
    """Samples a running container's cgroups (every 0.1 s) for peak memory, task count and
    refused forks, and calls ``on_pids_limit`` when the pids controller refuses one (Docker's
    ``pids_limit`` alone only makes forks fail; this ends the execution as ``killed``)."""

    INTERVAL_S = 0.1

    def __init__(self, container) -> None:
        self.container = container
        self.last: CgroupStats | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_pids_limit) -> None:
        try:
            self.container.reload()
            pid = int(self.container.attrs["State"]["Pid"])
        except Exception:
            return
        found = groups_of_pid(pid) if pid > 0 else None
        if found is None:
            return
        version, dirs = found

        def loop() -> None:
            fired = False
            while not self._stop.is_set():
                if not all(d.is_dir() for d in dirs.values()):
                    return  # the container ended: its groups are gone
                self.last = stats_of(version, dirs)
                if self.last.pids_limit_hits and not fired:
                    fired = True
                    on_pids_limit()
                self._stop.wait(self.INTERVAL_S)

        self._thread = threading.Thread(target=loop, daemon=True, name="wmrl-docker-monitor")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
