"""``RayPool``: run work items (real executions, simulator episodes) on Ray workers on any node.

Domain-neutral: a pool is built from a *worker factory*, a picklable ``factory() -> fn`` that each
worker calls once where it runs (build a sandbox, load a simulator), and ``fn(item) -> value`` is
then applied to each item sent there. One Ray actor per slot, placed by Ray on any node with the
resources the slot asks for (:class:`~.config.RayPoolConfig`).

What can go wrong on a cluster, and what the pool does about it:

* a **worker or its node is lost** (the raylet died, the machine went away): the item it held is
  tried again on another node, up to ``retries`` times; the worker is replaced;
* a try runs past ``timeout_s``: the worker is presumed hung, killed and replaced; the item is
  retried the same way;
* the worker reports a **harness failure** (``harness_failure(value)`` returns a reason, e.g. a
  sandbox that could not start): the item is retried on a node it has not been tried on;
* a worker's ``fn`` raises: the same as a harness failure (our failure, never the item's).

When the tries are used up the item's result is :class:`Unknown` with the reason (or, for a
harness failure, the worker's own failure value): never a default score, never dropped. Every
submitted item's future completes.

Results are collected by one dispatcher thread (Ray calls are thread-safe, but one owner keeps
the book-keeping simple); :meth:`RayPool.submit` may be called from any thread.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from wmrl.core.engines.ray.config import RayPoolConfig

__all__ = ["RayPool", "Unknown", "WorkerInfo"]

log = logging.getLogger("wmrl.core.engines.ray")

#: ``factory() -> fn``; ``fn(item) -> value``. Both are pickled to the workers.
WorkerFactory = Callable[[], Callable[[Any], Any]]


@dataclass(frozen=True)
class Unknown:
    """The result of an item the pool could not get a value for.

    Attributes:
        reason: why (the last failure, with the node it happened on).
        attempts: tries made.
        nodes: Ray node ids the item was tried on, in order.
    """

    reason: str
    attempts: int
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerInfo:
    """Where one worker runs (reported by the worker when it is up).

    Attributes:
        node: the Ray node id.
        host: the node's host name.
        pid: the worker process id.
        gpus: the GPU ids Ray assigned to the worker (its ``CUDA_VISIBLE_DEVICES``).
    """

    node: str
    host: str
    pid: int
    gpus: tuple[str, ...]


class _Worker:
    """The actor body: builds ``fn`` once, then applies it to the items it is given."""

    def __init__(self, factory: WorkerFactory) -> None:
        self.fn = factory()

    def info(self) -> dict[str, Any]:
        import socket

        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }

    def run(self, item: Any) -> Any:
        return self.fn(item)


@dataclass
class _Job:
    item: Any
    future: Future[Any]
    attempts: int = 0
    nodes: list[str] = field(default_factory=list)
    last_failure: str = ""
    submitted: float = field(default_factory=time.monotonic)


@dataclass
class _Slot:
    index: int
    actor: Any
    ready: Any  # ObjectRef of info() while starting
    info: WorkerInfo | None = None
    job: _Job | None = None
    ref: Any = None  # ObjectRef of run() while busy
    started: float = 0.0

    @property
    def node(self) -> str:
        return self.info.node if self.info is not None else "?"


class RayPool:
    """A pool of Ray workers that run items (see the module docstring).

    Args:
        factory: ``factory() -> fn``, run once in each worker.
        config: placement, resources, retries and deadlines.
        harness_failure: ``value -> reason | None``: a value that is the harness's failure, not the
            item's outcome (retried on another node); default: none are.
        name: the pool's name in logs and metrics.
        runtime_env: Ray's ``runtime_env`` for the workers (environment variables, working dir).

    Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        factory: WorkerFactory,
        config: RayPoolConfig,
        *,
        harness_failure: Callable[[Any], str | None] | None = None,
        name: str = "pool",
        runtime_env: Mapping[str, Any] | None = None,
    ) -> None:
        import ray

        if not callable(factory):
            raise TypeError(f"factory must be callable (factory() -> fn); got {type(factory).__name__}")
        self.config = config
        self.name = name
        self._factory = factory
        self._harness_failure = harness_failure or (lambda value: None)
        self._owns_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False}
            if config.address is None:
                kwargs.update(include_dashboard=False)
            ray.init(address=config.address, **kwargs)
            self._owns_ray = config.address is None
        options = dict(config.actor_options())
        if runtime_env:
            options["runtime_env"] = dict(runtime_env)
        self._actor_cls = ray.remote(_Worker).options(**options)
        self._lock = threading.Condition()
        self._incoming: collections.deque[_Job] = collections.deque()
        self._pending: collections.deque[_Job] = collections.deque()
        self._slots: list[_Slot] = []
        self._counter = itertools.count()
        self._closed = False
        self._restarts = 0
        self._no_worker_since: float | None = None
        self._stats: collections.Counter[str] = collections.Counter()
        self._node_items: collections.Counter[str] = collections.Counter()
        self._busy_s = 0.0
        self._first_submit: float | None = None
        self._last_done: float | None = None
        for _ in range(config.slots):
            self._slots.append(self._start_slot())
        self._thread = threading.Thread(target=self._dispatch, name=f"wmrl-ray-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    def submit(self, item: Any) -> Future[Any]:
        """Schedule ``item``; the future's result is ``fn(item)``'s value or an :class:`Unknown`."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the Ray pool {self.name!r} is closed")
            if self._first_submit is None:
                self._first_submit = time.monotonic()
            self._incoming.append(_Job(item, future))
            self._stats["submitted"] += 1
            self._lock.notify_all()
        return future

    def map(self, items: Iterable[Any]) -> list[Any]:
        """Run every item; results (values or :class:`Unknown`) in the order of ``items``."""
        futures = [self.submit(item) for item in items]
        return [f.result() for f in futures]

    def workers(self) -> list[WorkerInfo]:
        """Where the live workers run (those that are up)."""
        with self._lock:
            return [s.info for s in self._slots if s.info is not None]

    def metrics(self) -> dict[str, float]:
        """Cumulative counters since the pool started, under ``pool/`` (stable names).

        ``pool/items_done`` values returned, ``pool/items_unknown`` items given up as unknown,
        ``pool/retries`` extra tries, ``pool/workers_lost`` workers that died (their node lost),
        ``pool/timeouts`` tries killed at the deadline, ``pool/harness_failures`` tries the worker
        reported as failed, ``pool/workers_live`` workers up now, ``pool/nodes`` nodes they are on,
        ``pool/throughput_per_s`` finished items per second since the first submission,
        ``pool/busy_fraction`` share of slot-seconds spent running items.
        """
        with self._lock:
            live = [s for s in self._slots if s.info is not None]
            now = time.monotonic()
            span = (self._last_done or now) - self._first_submit if self._first_submit is not None else 0.0
            finished = self._stats["done"] + self._stats["unknown"]
            return {
                "pool/items_done": float(self._stats["done"]),
                "pool/items_unknown": float(self._stats["unknown"]),
                "pool/retries": float(self._stats["retries"]),
                "pool/workers_lost": float(self._stats["lost"]),
                "pool/timeouts": float(self._stats["timeouts"]),
                "pool/harness_failures": float(self._stats["harness"]),
                "pool/workers_live": float(len(live)),
                "pool/nodes": float(len({s.node for s in live})),
                "pool/throughput_per_s": float(finished / span) if span > 0 else 0.0,
                "pool/busy_fraction": float(self._busy_s / (span * self.config.slots)) if span > 0 else 0.0,
            }

    def node_items(self) -> dict[str, int]:
        """Items each node finished (Ray node id -> count)."""
        with self._lock:
            return dict(self._node_items)

    def close(self) -> None:
        """Finish the items already submitted, stop the workers (and the Ray instance this pool started)."""
        import ray

        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        self._thread.join()
        for slot in self._slots:
            self._kill(slot)
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the dispatcher

    def _start_slot(self) -> _Slot:
        actor = self._actor_cls.remote(self._factory)
        # ray types a handle's methods as the plain methods, without their .remote
        return _Slot(next(self._counter), actor, actor.info.remote())  # type: ignore[attr-defined]

    def _kill(self, slot: _Slot) -> None:
        import ray

        with contextlib.suppress(Exception):  # already dead, or its node is gone
            ray.kill(slot.actor, no_restart=True)

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                while self._incoming:
                    self._pending.append(self._incoming.popleft())
                idle_work = not self._pending and not any(s.job for s in self._slots)
                if self._closed and idle_work:
                    return
                if idle_work and not any(s.info is None and s.ready is not None for s in self._slots):
                    self._lock.wait(timeout=0.5)
                    continue
            try:
                self._round()
            except Exception:  # never let the dispatcher die with futures outstanding
                log.exception("Ray pool %s: dispatcher round failed", self.name)
                time.sleep(0.5)

    def _round(self) -> None:
        import ray

        self._assign()
        waiting = {s.ready: s for s in self._slots if s.info is None and s.ready is not None}
        running = {s.ref: s for s in self._slots if s.ref is not None}
        refs = [*waiting, *running]
        if refs:
            ready, rest = ray.wait(refs, num_returns=1, timeout=0.05)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            for ref in ready:
                if ref in waiting:
                    self._worker_up(waiting[ref], ref)
                else:
                    self._item_done(running[ref], ref)
        else:
            time.sleep(0.05)
        self._check_deadlines()
        self._check_starved()

    def _assign(self) -> None:
        with self._lock:
            idle = [s for s in self._slots if s.info is not None and s.job is None]
            while self._pending and idle:
                job = self._pending.popleft()
                # A retry goes to a node it has not been tried on, where such a worker is free now.
                fresh = [s for s in idle if s.node not in job.nodes]
                slot = (fresh or idle)[0]
                idle.remove(slot)
                job.attempts += 1
                job.nodes.append(slot.node)
                slot.job = job
                slot.started = time.monotonic()
                slot.ref = slot.actor.run.remote(job.item)

    def _worker_up(self, slot: _Slot, ref: Any) -> None:
        import ray

        try:
            info = ray.get(ref)
        except Exception as err:  # the worker could not start (its factory failed, its node died)
            log.warning("Ray pool %s: a worker failed to start: %s", self.name, _short(err))
            self._stats["start_failures"] += 1
            self._replace(slot, f"a worker failed to start: {_short(err)}")
            return
        with self._lock:
            slot.info = WorkerInfo(info["node"], info["host"], int(info["pid"]), tuple(info["gpus"]))
            slot.ready = None
            self._no_worker_since = None

    def _item_done(self, slot: _Slot, ref: Any) -> None:
        import ray
        from ray.exceptions import RayTaskError

        job, node = slot.job, slot.node
        assert job is not None  # a slot's job and its ref are set and cleared together
        elapsed = time.monotonic() - slot.started
        slot.job, slot.ref = None, None
        self._busy_s += elapsed
        try:
            value = ray.get(ref)
        except RayTaskError as err:  # fn raised: the harness's failure, the worker lives on
            self._stats["harness"] += 1
            self._retry_or_give_up(job, f"the worker on node {node} raised {_short(err)}", None)
            return
        except Exception as err:  # the actor died (its node was lost, it was killed, out of memory)
            self._stats["lost"] += 1
            reason = f"the worker on node {node} was lost: {_short(err)}"
            log.warning("Ray pool %s: %s", self.name, reason)
            self._replace(slot, reason)
            self._retry_or_give_up(job, reason, None)
            return
        failure = self._harness_failure(value)
        if failure is not None:
            self._stats["harness"] += 1
            self._retry_or_give_up(job, f"harness failure on node {node}: {failure}", value)
            return
        with self._lock:
            self._stats["done"] += 1
            self._node_items[node] += 1
            self._last_done = time.monotonic()
        job.future.set_result(value)

    def _retry_or_give_up(self, job: _Job, reason: str, value: Any) -> None:
        job.last_failure = reason
        with self._lock:
            if job.attempts <= self.config.retries:
                self._stats["retries"] += 1
                self._pending.appendleft(job)  # it has waited longest
                return
            self._stats["unknown"] += 1
            self._last_done = time.monotonic()
        if value is not None:  # the worker's own failure value carries its reason
            job.future.set_result(value)
        else:
            job.future.set_result(
                Unknown(f"{reason} (after {job.attempts} tries)", job.attempts, tuple(job.nodes))
            )

    def _replace(self, slot: _Slot, reason: str) -> None:
        self._kill(slot)
        with self._lock:
            self._slots.remove(slot)
            if self._restarts < self.config.max_restarts:
                self._restarts += 1
                self._slots.append(self._start_slot())
            elif not self._slots:
                log.error("Ray pool %s: no workers left and no restarts left (%s)", self.name, reason)

    def _check_deadlines(self) -> None:
        timeout = self.config.timeout_s
        if timeout is None:
            return
        now = time.monotonic()
        for slot in list(self._slots):
            if slot.job is None or now - slot.started <= timeout:
                continue
            job, node = slot.job, slot.node
            slot.job, slot.ref = None, None
            self._busy_s += now - slot.started
            self._stats["timeouts"] += 1
            reason = (
                f"the try on node {node} ran past the pool's {timeout:g} s deadline; its worker was killed"
            )
            log.warning("Ray pool %s: %s", self.name, reason)
            self._replace(slot, reason)
            self._retry_or_give_up(job, reason, None)

    def _check_starved(self) -> None:
        """Give up waiting items when no worker has been up for ``start_timeout_s``."""
        with self._lock:
            if any(s.info is not None for s in self._slots) or not self._pending:
                self._no_worker_since = None
                return
            now = time.monotonic()
            if self._no_worker_since is None:
                self._no_worker_since = now
                return
            if now - self._no_worker_since < self.config.start_timeout_s:
                return
            starving = list(self._pending)
            self._pending.clear()
            self._stats["unknown"] += len(starving)
            self._last_done = now
        why = (
            f"no Ray worker of pool {self.name!r} was up for {self.config.start_timeout_s:g} s (the cluster has "
            f"no node with the resources a slot asks for: {self.config.actor_options()})"
        )
        for job in starving:
            detail = f"; last failure: {job.last_failure}" if job.last_failure else ""
            job.future.set_result(Unknown(why + detail, job.attempts, tuple(job.nodes)))


def _short(err: BaseException) -> str:
    """One line of a Ray exception (their messages carry whole tracebacks)."""
    text = str(err).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), "")
    return f"{type(err).__name__}: {last[:300]}"
