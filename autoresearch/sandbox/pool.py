"""``SandboxPool``: N concurrent executions and a result cache.

Concurrency: a thread pool of ``slots`` workers, each calling ``sandbox.run`` (the sandboxes are
thread-safe; each execution is its own process tree). Concurrent executions are pinned to
different cores where the host has enough.

Cache: keyed by ``(task id, SHA-256 of the code, limits, backend)``. Two stores:

- ``cache="memory"``: an in-process LRU of at most ``cache_max_entries`` results and
  ``cache_max_bytes`` submission bytes in all; the submission bytes are kept in memory with them.
- ``cache=<folder>``: on disk, one sub-folder per key (``<folder>/<key[:2]>/<key>/result.json``
  and ``submission.csv``), written to a temporary folder and renamed into place so a reader never
  sees half an entry; survives restarts and may be shared by processes.

Every hit returns a *fresh copy*: a new :class:`ExecutionResult` (``cached=True``) whose
submission is a new file, so a caller that edits or deletes what it got cannot corrupt the cache.
``harness_error`` results are never cached (they are our failures, and may not repeat).
Identical requests in flight at the same time run once; the others wait for that run.

A grader that finds a submission invalid calls :meth:`SandboxPool.reject_submission`: the cache
then drops that submission's bytes and keeps the verdict (``ExecutionResult.submission_verdict``),
so invalid submissions (a flood of rows, garbage) never occupy the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .base import Sandbox
from .limits import Limits
from .result import ExecutionResult

__all__ = ["SandboxPool", "cache_key", "data_fingerprint"]

CACHEABLE = ("ok", "error", "timeout", "killed")


def data_fingerprint(data_dir: str | os.PathLike) -> str:
    """Identity of a data folder for cache keys when no task id is given: its resolved path and
    every file's relative name, size and modification time."""
    root = Path(data_dir).resolve()
    h = hashlib.sha256(str(root).encode())
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            p = Path(d) / name
            with contextlib.suppress(OSError):
                st = p.stat()
                h.update(f"\0{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return "data:" + h.hexdigest()


def cache_key(task_id: str, code: str, limits: Limits, backend: str) -> str:
    """The cache key: SHA-256 over the task id, the code's SHA-256, the limits and the backend."""
    code_hash = hashlib.sha256(code.encode("utf-8")).hexdigest()
    blob = json.dumps(
        {"task": task_id, "code": code_hash, "limits": limits.key(), "backend": backend}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class SandboxPool:
    """Run solutions ``slots`` at a time through ``sandbox``, with an optional result cache.

    Args:
        sandbox: any :class:`~.base.Sandbox`, or a wrapper whose ``sandbox`` is one (its ``run``
            is called; every other attribute is the wrapped backend's).
        slots: concurrent executions (>= 1).
        cache: ``None`` (off), ``"memory"``, or a folder path for the on-disk cache.
        cache_max_entries: bound of the in-memory cache (least recently used evicted).
        cache_max_bytes: bound of the submission bytes the in-memory cache holds in all (least
            recently used evicted; a submission bigger than this alone is not cached: its run
            is repeated on the next request).
    """

    def __init__(
        self,
        sandbox: Sandbox,
        slots: int = 1,
        cache: str | os.PathLike | None = None,
        cache_max_entries: int = 4096,
        cache_max_bytes: int = 256 * 2**20,
    ) -> None:
        # A Sandbox, or a wrapper that runs through one (the training's per-slot GPUs, DeviceSlots,
        # sit between the pool and the backend and hand everything else to the backend).
        if not isinstance(sandbox, Sandbox) and not isinstance(getattr(sandbox, "sandbox", None), Sandbox):
            raise TypeError(f"sandbox must be a Sandbox or wrap one; got {type(sandbox).__name__}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1; got {slots!r}")
        if (
            isinstance(cache_max_entries, bool)
            or not isinstance(cache_max_entries, int)
            or cache_max_entries < 1
        ):
            raise ValueError(f"cache_max_entries must be an int >= 1; got {cache_max_entries!r}")
        if isinstance(cache_max_bytes, bool) or not isinstance(cache_max_bytes, int) or cache_max_bytes < 0:
            raise ValueError(f"cache_max_bytes must be an int >= 0; got {cache_max_bytes!r}")
        self.sandbox = sandbox
        self.slots = slots
        self._executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="wmrl-sandbox")
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self._memory: OrderedDict[str, tuple[dict, bytes | None]] | None = None
        self._disk: Path | None = None
        if cache is None:
            pass
        elif cache == "memory":
            self._memory = OrderedDict()
        elif isinstance(cache, (str, os.PathLike)):
            self._disk = Path(cache)
            self._disk.mkdir(parents=True, exist_ok=True)
        else:
            raise ValueError(f"cache must be None, 'memory' or a folder path; got {cache!r}")
        self.cache_max_entries = cache_max_entries
        self.cache_max_bytes = cache_max_bytes
        self._memory_bytes = 0
        self.hits = 0
        self.misses = 0

    # -- public API ---------------------------------------------------------------------------
    def submit(
        self,
        code: str,
        data_dir: str | os.PathLike,
        limits: Limits | None = None,
        *,
        task_id: str | None = None,
    ) -> Future:
        """Schedule one execution; the future's result is an :class:`ExecutionResult`."""
        limits = Limits() if limits is None else limits
        if not self._caching:
            return self._executor.submit(self.sandbox.run, code, data_dir, limits)
        key = cache_key(
            task_id if task_id is not None else data_fingerprint(data_dir), code, limits, self.sandbox.name
        )
        out: Future = Future()
        with self._lock:
            hit = self._load(key)
            if hit is not None:
                self.hits += 1
                out.set_result(hit)
                return out
            shared = self._inflight.get(key)
            if shared is None:
                self.misses += 1
                shared = self._executor.submit(self._run_and_store, key, code, data_dir, limits)
                self._inflight[key] = shared
                first = True
            else:
                self.hits += 1
                first = False

        def relay(f: Future) -> None:
            try:
                res, record, sub = f.result()
                # The first caller gets the original; the others get copies like any cache hit,
                # made from the bytes captured when the run ended (not from the caller's file).
                out.set_result(res if first else self._materialise(record, sub))
            except BaseException as exc:
                out.set_exception(exc)

        shared.add_done_callback(relay)
        return out

    def run(
        self,
        code: str,
        data_dir: str | os.PathLike,
        limits: Limits | None = None,
        *,
        task_id: str | None = None,
    ) -> ExecutionResult:
        """Run one solution (blocking)."""
        return self.submit(code, data_dir, limits, task_id=task_id).result()

    def map(self, jobs: Iterable[dict]) -> list[ExecutionResult]:
        """Run many: each job a dict with ``code``, ``data_dir`` and optional ``limits``, ``task_id``.
        Results come back in the order of ``jobs``."""
        futures = []
        for job in jobs:
            unknown = set(job) - {"code", "data_dir", "limits", "task_id"}
            if unknown:
                raise ValueError(f"SandboxPool.map job has unknown keys {sorted(unknown)}")
            futures.append(
                self.submit(job["code"], job["data_dir"], job.get("limits"), task_id=job.get("task_id"))
            )
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- cache ----------------------------------------------------------------------------------
    @property
    def _caching(self) -> bool:
        return self._memory is not None or self._disk is not None

    def _run_and_store(
        self, key: str, code: str, data_dir, limits: Limits
    ) -> tuple[ExecutionResult, dict, bytes | None]:
        try:
            res = self.sandbox.run(code, data_dir, limits)
            res.cache_key = key
            record = res.to_dict()
            record["submission"] = None
            sub = (
                res.submission.read_bytes()
                if res.submission is not None and res.submission.exists()
                else None
            )
            if res.status in CACHEABLE:
                self._store(key, record, sub)
            return res, record, sub
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _store(self, key: str, record: dict, sub: bytes | None) -> None:
        if self._memory is not None:
            size = len(sub) if sub is not None else 0
            if size > self.cache_max_bytes:
                return  # one submission over the whole budget: not cached at all
            with self._lock:
                old = self._memory.pop(key, None)
                if old is not None:
                    self._memory_bytes -= len(old[1] or b"")
                self._memory[key] = (record, sub)
                self._memory_bytes += size
                while len(self._memory) > self.cache_max_entries or self._memory_bytes > self.cache_max_bytes:
                    _, (_, dropped) = self._memory.popitem(last=False)
                    self._memory_bytes -= len(dropped or b"")
            return
        assert self._disk is not None  # _caching: memory or disk
        final = self._disk / key[:2] / key
        if final.exists():
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final.parent))
        try:
            if sub is not None:
                (tmp / "submission.csv").write_bytes(sub)
            (tmp / "result.json").write_text(json.dumps(record, sort_keys=True))
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process stored it first

    def reject_submission(self, result: ExecutionResult, code: str, reason: str) -> bool:
        """Drop ``result``'s submission bytes from the cache and keep the grader's verdict instead.

        Returns whether a cache entry was changed. Later hits come back with ``submission=None``
        and ``submission_verdict={"code", "reason"}``.
        """
        key = result.cache_key
        if key is None or not self._caching:
            return False
        verdict = {"code": str(code), "reason": str(reason)}
        if self._memory is not None:
            with self._lock:
                entry = self._memory.get(key)
                if entry is None:
                    return False
                record, sub = entry
                record = {**record, "submission_verdict": verdict}
                self._memory[key] = (record, None)
                self._memory_bytes -= len(sub or b"")
            return True
        assert self._disk is not None  # _caching: memory or disk
        folder = self._disk / key[:2] / key
        try:
            record = json.loads((folder / "result.json").read_text())
        except (OSError, ValueError):
            return False
        record["submission_verdict"] = verdict
        tmp = folder / f".result.{uuid.uuid4().hex}.json"
        tmp.write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, folder / "result.json")  # readers see the old record or the new one
        with contextlib.suppress(FileNotFoundError):
            (folder / "submission.csv").unlink()
        return True

    def _load(self, key: str) -> ExecutionResult | None:
        if self._memory is not None:
            entry = self._memory.get(key)
            if entry is None:
                return None
            self._memory.move_to_end(key)
            record, sub = entry
        else:
            assert self._disk is not None  # called only while _caching: memory or disk
            folder = self._disk / key[:2] / key
            try:
                record = json.loads((folder / "result.json").read_text())
            except (FileNotFoundError, NotADirectoryError, ValueError):
                return None
            sub_path = folder / "submission.csv"
            sub = sub_path.read_bytes() if sub_path.exists() else None
        return self._materialise(record, sub)

    def _materialise(self, record: dict, sub: bytes | None) -> ExecutionResult:
        res = ExecutionResult.from_dict(json.loads(json.dumps(record)))
        res.cached = True
        res.execution_id = uuid.uuid4().hex
        res.submission = None
        if sub is not None and not res.submission_verdict:
            path = self.sandbox.output_root / f"cached-{res.execution_id}" / "submission.csv"
            path.parent.mkdir(parents=True)
            path.write_bytes(sub)
            res.submission = path
        return res
