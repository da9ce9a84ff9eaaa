"""A real multi-node Ray cluster on one machine: a head and worker raylets, each its own ``ray start``.

For tests and benchmarks of the pool (and for trying a cluster set-up before renting machines).
Each node is one ``ray start --block`` process started in its own session, with its own ports and
the CPUs, memory, GPUs and custom resources it declares, so Ray schedules across them exactly as
across machines. Nodes are stopped by the session id of the process this module started (never
``ray stop``, which ends every Ray process of the host, other users' included).

Every raylet would otherwise count the whole machine's memory, so ``memory_mb`` and
``object_store_mb`` are always passed. ``RAY_AUTH_MODE=disabled`` is set for the nodes (and should
be set for the driver): with token authentication on, workers of a cluster started without a
token fail with ``InvalidAuthToken``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LocalCluster", "LocalNode"]

#: Where a local cluster listens: every raylet, the GCS and the driver stay on this loopback address.
#: Not 127.0.0.1: `ray start` (2.x, multi-node) replaces exactly "127.0.0.1"/"localhost" with the
#: machine's network address (``ray._private.services.resolve_ip_for_localhost``); any other address
#: of 127.0.0.0/8 is the loopback interface too and is kept as given.
LOOPBACK = "127.0.0.2"

_PORTS_PER_NODE = 7


def _free_ports(n: int) -> list[int]:
    sockets, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def _session_pids(sid: int) -> list[int]:
    """Processes whose session id is ``sid`` (field 6 of ``/proc/PID/stat``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class LocalNode:
    """One ``ray start --block`` process of a :class:`LocalCluster`.

    Attributes:
        name: the node's label in this cluster (``head``, ``worker-1``...).
        process: the ``ray start`` process (its pid is the session id of every process of the node).
        resources: what it declared.
    """

    name: str
    process: subprocess.Popen[bytes]
    resources: dict[str, float] = field(default_factory=dict)
    log: Path | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def raylet_pid(self) -> int | None:
        """The pid of this node's raylet (a process of this node's session)."""
        for pid in _session_pids(self.process.pid):
            if "/raylet" in _cmdline(pid).split(" ")[0]:
                return pid
        return None

    def kill_raylet(self) -> int:
        """SIGKILL this node's raylet, as when its machine is lost; returns the pid killed."""
        pid = self.raylet_pid()
        if pid is None:
            raise RuntimeError(f"node {self.name} has no raylet running")
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, timeout_s: float = 5.0) -> None:
        """End every process of this node: SIGTERM to its session, then SIGKILL what is left."""
        sid = self.process.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _session_pids(sid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and _session_pids(sid):
                with contextlib.suppress(Exception):
                    self.process.wait(timeout=0.2)
            if not _session_pids(sid):
                break
        with contextlib.suppress(Exception):
            self.process.wait(timeout=5)


class LocalCluster:
    """A head node and worker nodes on this machine (see the module docstring).

    Args:
        head_cpus: CPUs the head declares (0: work only runs on worker nodes).
        memory_mb / object_store_mb: what each node declares (per node).
        ray: the ``ray`` executable (default: the one beside this Python).
        temp_dir: Ray's session folder for this cluster (default: a fresh temporary folder).

    Use as a context manager; :meth:`stop` ends every node this cluster started.
    """

    def __init__(
        self,
        head_cpus: float = 0,
        memory_mb: int = 1024,
        object_store_mb: int = 100,
        ray: str | None = None,
        temp_dir: str | os.PathLike[str] | None = None,
        system_config: Mapping[str, object] | None = None,
    ) -> None:
        self.memory_mb = memory_mb
        self.object_store_mb = object_store_mb
        self.ray = ray or str(Path(sys.executable).with_name("ray"))
        if not Path(self.ray).exists():
            found = shutil.which("ray")
            if found is None:
                raise FileNotFoundError(
                    "the `ray` command is not installed (pip install 'wmrl[distributed]')"
                )
            self.ray = found
        self._own_temp = temp_dir is None
        # Ray's socket paths must stay short (AF_UNIX: 107 bytes): a short folder under /tmp.
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="wr-", dir="/tmp"))
        self.nodes: list[LocalNode] = []
        self.env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        gcs, client, *rest = _free_ports(2 + _PORTS_PER_NODE)
        self.address = f"{LOOPBACK}:{gcs}"
        args = ["--head", f"--port={gcs}", f"--ray-client-server-port={client}", "--include-dashboard=false"]
        args.append(f"--temp-dir={self.temp_dir}")
        if system_config:
            args.append(f"--system-config={json.dumps(dict(system_config))}")
        try:
            self._start("head", args, head_cpus, {}, 0, rest)
        except BaseException:
            self.stop()
            raise

    def _start(
        self,
        name: str,
        args: list[str],
        cpus: float,
        resources: Mapping[str, float],
        gpus: float,
        ports: Sequence[int],
    ) -> LocalNode:
        nm, om, agent, agent_grpc, rt_env, metrics, _ = ports
        command = [
            self.ray,
            "start",
            *args,
            f"--num-cpus={cpus:g}",
            f"--num-gpus={gpus:g}",
            f"--memory={self.memory_mb * 1024 * 1024}",
            f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            f"--node-manager-port={nm}",
            f"--object-manager-port={om}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={rt_env}",
            f"--metrics-export-port={metrics}",
            "--disable-usage-stats",
            "--block",
            # a test cluster stays on loopback: its raylets never listen on the machine's network address
            f"--node-ip-address={LOOPBACK}",
        ]
        if resources:
            command.append(f"--resources={json.dumps(dict(resources))}")
        log = self.temp_dir / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        node = LocalNode(name, process, {"CPU": cpus, "GPU": gpus, **resources}, log)
        self.nodes.append(node)
        self._wait_started(node, log)
        return node

    def _wait_started(self, node: LocalNode, log: Path, timeout_s: float = 120.0) -> None:
        """Wait for ``node`` to come up (``log``: its output)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not node.alive:
                raise RuntimeError(f"ray node {node.name} exited while starting:\n{log.read_text()[-3000:]}")
            if "will now block forever" in log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"ray node {node.name} did not start in {timeout_s:g} s:\n{log.read_text()[-3000:]}"
        )

    def add_node(
        self, cpus: float = 1, resources: Mapping[str, float] | None = None, gpus: float = 0
    ) -> LocalNode:
        """Start a worker node that joins the cluster (returns when its raylet is up)."""
        name = f"worker-{len(self.nodes)}"
        return self._start(
            name,
            [f"--address={self.address}"],
            cpus,
            dict(resources or {}),
            gpus,
            _free_ports(_PORTS_PER_NODE),
        )

    def wait_for_nodes(self, count: int | None = None, timeout_s: float = 60.0) -> None:
        """Block until the driver (``ray.init(address=...)`` done) sees ``count`` alive nodes."""
        import ray

        want = count if count is not None else sum(1 for n in self.nodes if n.alive)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # ray.nodes() is unannotated (a stub gap, not ours)
            nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
            if sum(1 for n in nodes if n["Alive"]) >= want:
                return
            time.sleep(0.2)
        raise TimeoutError(f"the cluster did not show {want} alive nodes within {timeout_s:g} s")

    def stop(self) -> None:
        """Stop every node this cluster started (workers first, then the head)."""
        for node in reversed(self.nodes):
            node.stop()
        self.nodes = []
        if self._own_temp:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
