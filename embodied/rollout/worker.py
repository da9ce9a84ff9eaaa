"""The simulator side of a rollout: one LIBERO environment, driven by commands.

A worker owns exactly one simulator. In a subprocess it runs :func:`worker_main`, reading commands
from a pipe; in the parent process (``workers=0``) :class:`LocalWorker` executes the same commands
directly. Commands and replies are plain tuples of picklable values:

* ``("reset", task_id, init_state, seed)`` -> ``("ok", (observation, info))``
* ``("step", action)`` -> ``("ok", (observation, reward, terminated, truncated, info))``
* ``("close",)`` -> the worker exits (no reply)

A failing command replies ``("error", formatted_traceback)``.
"""

from __future__ import annotations

import signal
import traceback
from typing import Any

__all__ = ["LocalWorker", "execute", "worker_main"]


def execute(env, command: tuple) -> Any:
    """Run one command on a :class:`~wmrl.embodied.env.LiberoEnv` and return its payload."""
    kind = command[0]
    if kind == "reset":
        _, task_id, init_state, seed = command
        return env.reset(seed=seed, options={"task_id": task_id, "init_state": init_state})
    if kind == "step":
        return env.step(command[1])
    raise ValueError(f"unknown worker command {kind!r}")


def worker_main(conn, env_config: dict) -> None:
    """Subprocess entry point: build the environment, then serve commands until ``close``."""
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    env = None
    try:
        from wmrl.embodied.env import LiberoEnv, LiberoEnvConfig

        env = LiberoEnv(LiberoEnvConfig.from_dict(env_config))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        conn.close()
        return
    conn.send(("ok", "ready"))
    try:
        while True:
            try:
                command = conn.recv()
            except EOFError:
                break  # the parent went away
            if command[0] == "close":
                break
            try:
                conn.send(("ok", execute(env, command)))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    finally:
        env.close()
        conn.close()


class LocalWorker:
    """A worker in the calling process (no IPC); same command protocol as :func:`worker_main`."""

    def __init__(self, env_config: dict) -> None:
        from wmrl.embodied.env import LiberoEnv, LiberoEnvConfig

        self.env = LiberoEnv(LiberoEnvConfig.from_dict(env_config))
        self._reply: tuple | None = None

    def send(self, command: tuple) -> None:
        try:
            self._reply = ("ok", execute(self.env, command))
        except Exception:
            self._reply = ("error", traceback.format_exc())

    def recv(self) -> tuple:
        reply, self._reply = self._reply, None
        if reply is None:
            raise RuntimeError("LocalWorker.recv() without a pending command")
        return reply

    def close(self) -> None:
        self.env.close()
