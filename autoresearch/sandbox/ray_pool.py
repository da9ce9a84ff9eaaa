"""Real execution on a Ray pool: the same sandboxes, one per Ray worker, on any node of a cluster.

:func:`make_ray_sandbox_pool` returns a :class:`~.pool.SandboxPool` (the local pool's interface and
its result cache, which therefore is shared by every worker) whose sandbox is a :class:`RaySandbox`:
each execution is sent to a worker of a :class:`~wmrl.core.engines.ray.RayPool`, and that worker
runs it in its own sandbox backend (bubblewrap, Docker, subprocess) on its node. The grader uses it
exactly like the local pool; grading stays in the calling process (the private answers never go
to a sandbox node).

Per slot (:class:`~wmrl.core.engines.ray.RayPoolConfig`): CPUs, memory, GPUs and custom resources.
A slot with GPUs runs a solution that asks for one (``Limits.gpu``) on *its* GPUs only: the ids Ray
assigned to the worker replace the request, so the solution's ``CUDA_VISIBLE_DEVICES`` (subprocess
backend) or bound device nodes (bubblewrap, Docker) are the slot's. A solution that asks for a GPU
on a slot without one is a harness error (the pool is configured wrongly), never a silent CPU run.

Failures: a worker or node lost mid-execution, a try past the pool deadline, or a harness error
on the worker are retried on another node; when the tries run out the execution is a
``harness_error`` whose reason says what happened, so its grade is unknown (``None``), never 0.

Public data: a worker uses the task's folder in place when that path exists on its node with the
same files (one machine, or a shared filesystem); otherwise (``ship_data``) the driver packs the
folder once into Ray's object store and each node unpacks it once into a verified read-only copy
(:class:`~.staging.StagingArea`: a parent only the worker's user may write, a manifest of hashes
checked before every reuse), never reusing a folder it did not make.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from wmrl.core.engines.ray.config import RayPoolConfig

from .base import Sandbox
from .factory import BACKENDS
from .limits import Limits
from .pool import SandboxPool, data_fingerprint
from .result import ExecutionResult
from .staging import StagingArea

__all__ = ["RaySandbox", "SandboxWorker", "make_ray_sandbox_pool", "pool_metrics"]

ShipData = Literal["auto", "always", "never"]


def _pack(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname="public")
    return buffer.getvalue()


class _Runner:
    """One worker's side: a sandbox on this node, and the public data folders known here."""

    def __init__(self, backend: str, options: dict[str, Any]) -> None:
        import ray

        from .factory import make_sandbox

        self.sandbox = make_sandbox(backend, **options)
        self.gpus = tuple(int(g) for g in ray.get_gpu_ids())
        # A fraction below 1 (the paper packed three slots on a GPU) shares the device's memory
        # with other slots, and nothing bounds one slot's share: each result says so.
        self.gpu_share = float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
        self.node = ray.get_runtime_context().get_node_id()
        self.host = socket.gethostname()
        self._data: dict[str, Path] = {}
        self._lock = threading.Lock()
        self._staging = StagingArea(Path(tempfile.gettempdir()) / f"wmrl-ray-data-{os.geteuid()}")

    def _data_dir(self, job: dict[str, Any]) -> Path:
        key = job["fingerprint"]
        with self._lock:
            if key in self._data and self._data[key] == Path(job["data_dir"]):
                return self._data[key]  # the driver's own folder, in place
            path = Path(job["data_dir"])
            if (
                (job["data"] is None or job["prefer_local"])
                and path.is_dir()
                and data_fingerprint(path) == key
            ):
                self._data[key] = path  # the same folder, same files: use it in place
                return path
            if job["data"] is None:
                raise FileNotFoundError(
                    f"the public data {path} is not on node {self.host} and was not shipped "
                    "(ray.ship_data is 'never'): put it on storage every sandbox node mounts at that path"
                )
            import ray

            return self._shipped_copy(key, lambda: ray.get(job["data"]))  # verified at each use

    def _shipped_copy(self, key: str, blob: Callable[[], bytes]) -> Path:
        """The node's verified read-only copy of shipped public data, unpacked once.

        It lives in a :class:`~.staging.StagingArea` (a root-only parent, a manifest of every
        file's hash, checked before each reuse): a folder someone else planted at a predictable
        path -- a solution of the unisolated subprocess backend on this node, say -- is never
        used (round three: such a plant once scored gold on a later isolated run).
        """
        found = self._staging.verified(key)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix="wmrl-unpack-") as scratch:
            with tarfile.open(fileobj=io.BytesIO(blob()), mode="r:gz") as tar:
                tar.extractall(scratch, filter="data")
            return self._staging.stage(key, Path(scratch) / "public")

    def __call__(self, job: dict[str, Any]) -> dict[str, Any]:
        where = {"node": self.node, "host": self.host, "gpus": list(self.gpus)}
        limits = Limits.from_dict(job["limits"])
        if limits.gpu is not False:
            if not self.gpus:
                return _harness(
                    "the solution asks for a GPU but this Ray slot holds none (set ray.gpus_per_slot)", where
                )
            limits = limits.replace(gpu=self.gpus)  # this slot's GPUs only, whatever was asked
        try:
            data_dir = self._data_dir(job)
        except (OSError, tarfile.TarError) as err:
            return _harness(f"public data unavailable on {self.host}: {type(err).__name__}: {err}", where)
        # the worker's own sandbox stages (and verifies) its copy from here, whichever this is
        where["data"] = "in place" if data_dir == Path(job["data_dir"]) else "shipped"
        result = self.sandbox.run(job["code"], data_dir, limits)
        if limits.gpu is not False and 0 < self.gpu_share < 1:
            result.warnings.append(
                f"this slot holds {self.gpu_share:g} of GPU {list(self.gpus)}: its memory is shared with other "
                "slots and not bounded per slot (use whole GPUs or MIG instances for a bound)"
            )
        submission = None
        if result.submission is not None and result.submission.exists():
            submission = result.submission.read_bytes()
            # the copy on this node is not needed once its bytes travel back
            shutil.rmtree(result.submission.parent, ignore_errors=True)
        record = result.to_dict()
        record["submission"] = None
        return {"result": record, "submission": submission, **where}


def _harness(reason: str, where: dict[str, Any]) -> dict[str, Any]:
    record = ExecutionResult(status="harness_error", reason=reason).to_dict()
    return {"result": record, "submission": None, **where}


class SandboxWorker:
    """The picklable worker factory: each Ray worker builds ``make_sandbox(backend, **options)`` once.

    Args:
        backend: ``bwrap``, ``docker`` or ``subprocess`` (named: nodes may differ, so ``auto`` would
            not say what isolates the runs).
        options: keyword arguments of that backend (``make_sandbox``'s).
    """

    def __init__(self, backend: str, options: dict[str, Any] | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(
                f"a Ray sandbox pool needs a named backend, one of {sorted(BACKENDS)}; got {backend!r}"
            )
        self.backend = backend
        self.options = dict(options or {})

    def __call__(self) -> _Runner:
        return _Runner(self.backend, self.options)


def _harness_failure(value: dict[str, Any]) -> str | None:
    record = value["result"]
    return (record.get("reason") or "harness error") if record["status"] == "harness_error" else None


class RaySandbox(Sandbox):
    """A :class:`~.base.Sandbox` whose executions run on Ray workers (see the module docstring).

    Args:
        backend: the sandbox backend each worker runs (``bwrap``, ``docker``, ``subprocess``).
        config: the Ray pool (slots, resources per slot, retries, deadline).
        options: the backend's keyword arguments.
        ship_data: ``auto`` (ship a task's public data unless every worker is on this host; a worker
            that has the same folder uses it in place), ``always`` (workers use the shipped copy),
            ``never`` (the data must be at the same path on every node).
        output_root: where submissions that came back are kept (default: a temporary folder).
    """

    def __init__(
        self,
        backend: str,
        config: RayPoolConfig,
        *,
        options: dict[str, Any] | None = None,
        ship_data: ShipData = "auto",
        output_root: str | os.PathLike | None = None,
    ) -> None:
        from wmrl.core.engines.ray import RayPool

        if ship_data not in ("auto", "always", "never"):
            raise ValueError(f"ship_data must be 'auto', 'always' or 'never'; got {ship_data!r}")
        worker = SandboxWorker(backend, options)
        super().__init__(output_root=output_root)
        self.backend = backend
        self.name = f"ray-{backend}"
        self.isolated = BACKENDS[backend].isolated
        self.ship_data = ship_data
        self.config = config
        self.pool = RayPool(worker, config, harness_failure=_harness_failure, name=self.name)
        self._shipped: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._host = socket.gethostname()

    def _data_ref(self, data_dir: Path, fingerprint: str) -> Any:
        if self.ship_data == "never":
            return None
        workers = self.pool.workers()
        if self.ship_data == "auto" and workers and all(w.host == self._host for w in workers):
            return None  # every worker is on this machine: the folder is there
        # (no worker up yet: ship, in case they are elsewhere; a worker that has the folder uses it)
        import ray

        with self._lock:
            if fingerprint not in self._shipped:
                self._shipped[fingerprint] = ray.put(_pack(data_dir))
            return self._shipped[fingerprint]

    def _run(self, code: str, data_dir: Path, limits: Limits, execution_id: str) -> ExecutionResult:
        from wmrl.core.engines.ray import Unknown

        fingerprint = data_fingerprint(data_dir)
        job = {
            "code": code,
            "data_dir": str(data_dir),
            "fingerprint": fingerprint,
            "data": self._data_ref(data_dir, fingerprint),
            "prefer_local": self.ship_data != "always",
            "limits": limits.to_dict(),
        }
        value = self.pool.submit(job).result()
        if isinstance(value, Unknown):
            return ExecutionResult(status="harness_error", reason=f"Ray sandbox pool: {value.reason}")
        record = dict(value["result"])
        record.pop("limits", None)  # Sandbox.run records the limits asked for
        result = ExecutionResult.from_dict(record)
        # (a run refused before its data was placed, e.g. a GPU slot that holds none, has no "data")
        data = f", public data {value['data']}" if "data" in value else ""
        result.warnings.append(f"ran on Ray node {value['host']} ({value['node'][:12]}){data}")
        if value["submission"] is not None:
            dest = self.output_root / execution_id / "submission.csv"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(value["submission"])
            result.submission = dest
        return result

    def protections(self) -> dict[str, str]:
        inner = {
            "bwrap": "bubblewrap on each worker node",
            "docker": "Docker on each worker node",
            "subprocess": "NO isolation on the worker nodes (plain subprocess)",
        }[self.backend]
        return {"backend": inner, "placement": "Ray workers; grading and answers stay on the driver"}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pool.close()


def make_ray_sandbox_pool(
    backend: str,
    config: RayPoolConfig,
    *,
    cache: str | os.PathLike | None = "memory",
    options: dict[str, Any] | None = None,
    ship_data: ShipData = "auto",
) -> SandboxPool:
    """A :class:`~.pool.SandboxPool` over a :class:`RaySandbox`: ``config.slots`` executions at a
    time on Ray workers, with the pool's result cache (shared by all of them) in this process."""
    sandbox = RaySandbox(backend, config, options=options, ship_data=ship_data)
    return SandboxPool(sandbox, slots=config.slots, cache=cache)


def pool_metrics(pool: Any) -> dict[str, float]:
    """The run-log metrics of a sandbox pool: its cache, and the Ray pool's counters when it has one."""
    out: dict[str, float] = {}
    if isinstance(pool, SandboxPool):
        out["pool/cache_hits"] = float(pool.hits)
        out["pool/cache_misses"] = float(pool.misses)
        sandbox = pool.sandbox
    else:
        sandbox = pool
    while not isinstance(sandbox, RaySandbox) and "sandbox" in vars(sandbox):  # a wrapper (GPU requests)
        sandbox = vars(sandbox)["sandbox"]
    if isinstance(sandbox, RaySandbox):
        out.update(sandbox.pool.metrics())
    return out
