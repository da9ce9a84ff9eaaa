"""Docker backend (docker-py): one fresh container per execution, used when an engine answers.

The container runs the same :mod:`.launcher` as the local backends, as the container's PID 1
(which the solution cannot signal; it reaps orphans), with:

- ``network_mode="none"`` (no interface but loopback), ``read_only=True`` root filesystem,
  ``cap_drop=["ALL"]``, ``no-new-privileges``;
- the public data bind-mounted read-only at ``/sandbox/data``; the solution and the launcher
  read-only under ``/sandbox/code``; the answers never mounted;
- ``/sandbox/work`` and ``/tmp`` as tmpfs of ``disk_mb`` each;
- ``mem_limit`` = ``memswap_limit`` (no swap), ``pids_limit``, ``nano_cpus`` (CPU quota),
  ``ulimits`` for file size, open files and core dumps;
- GPUs through ``device_requests`` (``count=-1`` for all, else ``device_ids``) when asked;
- the json-file log driver capped near the output limit, so a flood cannot fill the host disk.

By default the host's interpreter prefix and venv are bind-mounted read-only at their host
paths (the image must then have a compatible C library: use an image of the host's
distribution, e.g. ``debian:bookworm-slim`` here); with ``mount_host_python=False`` the image's
own ``python3`` and libraries are used.

The launcher writes frames to the container's stdout; the host reads them with
``container.logs(stream=True, follow=True, stdout=True, stderr=False)``. Wall time: the launcher's
timer, and a host timer that kills the container. At the end the container is removed.
No Docker engine runs on the development machine, so this backend's tests skip there.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from .base import LAUNCHER_PATH, SUBMISSION_NAME, Sandbox, SandboxError, measured_resources
from .cgroups import CgroupStats
from .environment import interpreter_roots, sandbox_env
from .limits import Limits
from .result import ExecutionResult
from .supervisor import RawOutcome, Tail, _FrameReader, classify, host_deadline_s, relay_chunk

__all__ = ["DockerSandbox", "docker_problem"]

log = logging.getLogger("wmrl.autoresearch.sandbox")

INSIDE_DATA = "/sandbox/data"
INSIDE_WORK = "/sandbox/work"
INSIDE_CODE = "/sandbox/code"


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
        image: image to run (must exist locally unless ``pull=True``).
        mount_host_python: bind this interpreter and its venv read-only (same paths as the host).
        python: interpreter path inside the container (default: ``sys.executable`` when the host
            interpreter is mounted, else ``python3``).
        runtime: OCI runtime (``runsc`` for gVisor, ``sysbox-runc``...), or ``None`` for the default.
        pull: pull ``image`` when it is missing.
        client: a ``docker.DockerClient`` (default ``docker.from_env()``).
        output_root: see :class:`~.base.Sandbox`.
    """

    name = "docker"
    isolated = True

    def __init__(
        self,
        *,
        image: str = "debian:bookworm-slim",
        mount_host_python: bool = True,
        python: str | None = None,
        runtime: str | None = None,
        pull: bool = False,
        client=None,
        output_root=None,
    ) -> None:
        super().__init__(output_root=output_root)
        self.image = image
        self.mount_host_python = mount_host_python
        self.python = python or (sys.executable if mount_host_python else "python3")
        self.runtime = runtime
        self.pull = pull
        self._client = client
        self._client_lock = threading.Lock()
        self.problem = None if client is not None else docker_problem()

    def protections(self) -> dict[str, str]:
        return {
            "filesystem": "container: read-only root, data read-only, tmpfs scratch",
            "answers": "never mounted",
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

    def _volumes(self, stage: Path, data_dir: Path) -> dict:
        vols = {
            str(data_dir): {"bind": INSIDE_DATA, "mode": "ro"},
            str(stage / "solution.py"): {"bind": f"{INSIDE_CODE}/solution.py", "mode": "ro"},
            str(LAUNCHER_PATH): {"bind": f"{INSIDE_CODE}/launcher.py", "mode": "ro"},
        }
        if self.mount_host_python:
            for root in interpreter_roots():
                if str(root).startswith("/usr"):
                    continue  # the image's own /usr must stay
                vols[str(root)] = {"bind": str(root), "mode": "ro"}
        return vols

    def _create_kwargs(self, *, stage: Path, data_dir: Path, limits: Limits, execution_id: str) -> dict:
        """Keyword arguments of ``client.containers.create`` for one execution (pure; tested)."""
        from docker.types import DeviceRequest, LogConfig, Ulimit

        cfg = {
            "python": self.python,
            "solution": f"{INSIDE_CODE}/solution.py",
            "cwd": INSIDE_WORK,
            "wall_time_s": limits.wall_time_s,
            "submission_path": f"{INSIDE_WORK}/{SUBMISSION_NAME}",
            "submission_cap": limits.file_size_bytes,
            # Docker enforces these itself; AS stays unset (the cgroup bounds memory).
            "rlimits": {"FSIZE": limits.file_size_bytes, "NOFILE": limits.open_files, "CORE": 0},
            "cpus": None,
        }
        env = sandbox_env(
            limits,
            data_dir=INSIDE_DATA,
            submission_path=f"{INSIDE_WORK}/{SUBMISSION_NAME}",
            work_dir=INSIDE_WORK,
            tmp_dir="/tmp",
            python_bin_dir=str(Path(self.python).parent),
            cuda_visible_devices=None if limits.gpu is not False else "",
        )
        device_requests = None
        if limits.gpu is True:
            device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        elif limits.gpu:
            device_requests = [DeviceRequest(device_ids=[str(i) for i in limits.gpu], capabilities=[["gpu"]])]
        cpus = limits.cpus if limits.cpus is not None else limits.threads
        tmpfs_opts = f"size={limits.disk_bytes},mode=1777"
        kwargs = {
            "image": self.image,
            "command": [self.python, "-I", "-S", f"{INSIDE_CODE}/launcher.py", json.dumps(cfg)],
            "detach": True,
            "environment": env,
            "working_dir": INSIDE_WORK,
            "hostname": "sandbox",
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
            "nano_cpus": int(cpus * 1e9),
            "ulimits": [
                Ulimit(name="fsize", soft=limits.file_size_bytes, hard=limits.file_size_bytes),
                Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
                Ulimit(name="core", soft=0, hard=0),
            ],
            "tmpfs": {INSIDE_WORK: tmpfs_opts, "/tmp": tmpfs_opts},
            "volumes": self._volumes(stage, data_dir),
            "log_config": LogConfig(
                type=LogConfig.types.JSON,
                config={"max-size": str(2 * limits.output_bytes + (1 << 20)), "max-file": "1"},
            ),
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
        (stage / "solution.py").write_text(code, encoding="utf-8")
        dest = self.output_root / execution_id / SUBMISSION_NAME
        out = RawOutcome(stdout=Tail(limits.tail_bytes), stderr=Tail(limits.tail_bytes))
        container = None
        t0 = time.monotonic()
        try:
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
                container = client.containers.create(
                    **self._create_kwargs(
                        stage=stage, data_dir=data_dir, limits=limits, execution_id=execution_id
                    )
                )
                container.start()
            except docker.errors.DockerException as exc:
                return ExecutionResult(status="harness_error", reason=f"could not start the container: {exc}")
            self._pump(container, out, limits, dest)
            try:
                status = container.wait(timeout=30)
                code_ = int(status.get("StatusCode", -1))
            except Exception as exc:
                out.warnings.append(f"container.wait failed: {exc}")
                code_ = -1
            out.wait_status = (code_ & 0xFF) << 8 if code_ >= 0 else None
            with contextlib.suppress(Exception):
                out.launcher_stderr.add(container.logs(stdout=False, stderr=True, tail=200))
            oom = False
            with contextlib.suppress(Exception):
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            out.cgroup_stats = CgroupStats(
                cpu_s=None, peak_memory_bytes=None, oom_kills=int(oom), pids_peak=None, pids_limit_hits=0
            )
        finally:
            out.wall_s = time.monotonic() - t0
            if container is not None:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            for p in stage.glob("*"):
                p.unlink()
            stage.rmdir()
        if out.host_kill is not None or out.exit_info is None:
            with contextlib.suppress(FileNotFoundError):
                dest.unlink()
        return self._result(out, limits, dest)

    def _pump(self, container, out: RawOutcome, limits: Limits, dest: Path) -> None:
        """Read the launcher's frames from the container's stdout until it ends or is killed."""
        reader = _FrameReader(out, dest, limits.file_size_bytes)

        def kill(kind: str, message: str) -> None:
            if out.host_kill is None:
                out.host_kill = (kind, message)
            with contextlib.suppress(Exception):
                container.kill()

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
        try:
            for chunk in container.logs(stdout=True, stderr=False, stream=True, follow=True):
                relay_chunk(out, reader, chunk, limits, kill)
        finally:
            timer.cancel()
            reader.close()

    def _result(self, out: RawOutcome, limits: Limits, dest: Path) -> ExecutionResult:
        c = classify(out, limits)
        info = out.exit_info or {}
        summary = info.get("submission") or {}
        submission, error = None, None
        if out.submission_over_cap:
            error = f"the submission is over the {limits.file_size_mb} MiB limit"
        elif summary.get("error"):
            error = summary["error"]
        elif summary.get("present"):
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(b"")
            submission = dest
        resources = measured_resources(out)
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
                "docker backend: CPU time and peak memory are the solution's own rusage as reported by the launcher",
            ],
        )

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
                self._client = None
