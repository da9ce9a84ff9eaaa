"""Simulator workers on a Ray cluster: one LIBERO environment per Ray actor, on any node.

The same command protocol as the local workers (:mod:`.worker`): the runner sends ``reset`` and
``step`` commands and reads the replies; here each command is a call of a Ray actor that holds one
:class:`~wmrl.embodied.env.LiberoEnv`, placed by Ray on a node with the resources a slot asks for
(:class:`~wmrl.core.engines.ray.RayPoolConfig`: ``resources: {simulator: 1}`` puts simulators only
on the nodes that declare them, ``cpus_per_slot``, ``memory_mb_per_slot``, ``spread``). The policy
stays in the trainer's process, as with local workers: only observations and actions travel.

Why not :class:`~wmrl.core.engines.ray.RayPool` itself: the pool sends each item to whichever worker
is free, and an episode is a sequence of commands that must reach the one simulator holding its
state. The slots here are placed, connected and configured exactly as the pool's (the same config
and :meth:`RayPoolConfig.actor_options`); what the pool does per item, the runner does per episode
(:class:`~.runner.RolloutConfig` ``on_error="retry"``: an episode whose simulator was lost or hung is
run again from its reset on a fresh simulator that Ray places on a live node, up to ``retries``
times, and the run fails with the reason after that; an episode is never scored as a failure
because a machine went away).

A lost actor or node shows as :class:`~.runner.WorkerError` naming the node; a command that takes
longer than ``timeout_s`` kills its actor (presumed hung) with the same error.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from wmrl.core.engines.ray.config import RayPoolConfig

__all__ = ["RaySimulators"]


class _SimulatorActor:
    """The actor body: one LIBERO environment, driven by the worker protocol's commands."""

    def __init__(self, env_config: dict) -> None:
        from wmrl.embodied.rollout.worker import LocalWorker

        self.worker = LocalWorker(env_config)

    def info(self) -> dict[str, Any]:
        import socket

        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def call(self, command: tuple) -> tuple:
        self.worker.send(command)
        return self.worker.recv()

    def close(self) -> None:
        self.worker.close()


class RaySimulators:
    """Makes the Ray-backed simulator workers of a :class:`~.runner.RolloutRunner`.

    Args:
        config: where the simulators run (cluster address, resources per slot, deadline per command).

    Joins the cluster at ``config.address`` unless this process is already connected to one (a
    private local Ray instance for ``address: null``).
    """

    def __init__(self, config: RayPoolConfig) -> None:
        import ray

        self.config = config
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False}
            if config.address is None:
                kwargs.update(include_dashboard=False)
            ray.init(address=config.address, **kwargs)
        self._actor_cls = ray.remote(_SimulatorActor).options(**config.actor_options())

    def start(self, env_config: dict, index: int) -> _RayWorker:
        """A new simulator actor for slot ``index`` (not yet known to be up: see ``wait_ready``)."""
        return _RayWorker(self._actor_cls.remote(env_config), index, self.config.timeout_s)


class _RayWorker:
    """One simulator actor, spoken to like a worker process (``send`` / ``recv`` / ``close``)."""

    def __init__(self, actor: Any, index: int, timeout_s: float | None) -> None:
        self.actor = actor
        self.index = index
        self.timeout_s = timeout_s
        self.node = "?"
        self.pid: int | None = None
        self._ref: Any = None

    def _error(self, what: str, err: BaseException | None = None):
        from wmrl.embodied.rollout.runner import WorkerError

        detail = f": {type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
        return WorkerError(
            f"simulator worker {self.index} on Ray node {self.node} {what}{detail if err else ''}"
        )

    def wait_ready(self, timeout: float) -> None:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            info = ray.get(self.actor.info.remote(), timeout=timeout)
        except GetTimeoutError as err:
            self._kill()
            raise self._error(
                f"did not start within {timeout:.0f} s (no node with its resources free?)", err
            ) from err
        except Exception as err:  # the actor died building its simulator, or its node went away
            self._kill()
            raise self._error("failed to start", err) from err
        self.node, self.pid = info["node"], int(info["pid"])

    def send(self, command: tuple) -> None:
        self._ref = self.actor.call.remote(command)

    def recv(self) -> tuple:
        import ray
        from ray.exceptions import GetTimeoutError

        ref, self._ref = self._ref, None
        if ref is None:
            raise RuntimeError("recv() without a command in flight")
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except GetTimeoutError as err:
            self._kill()
            raise self._error(f"did not answer within {self.timeout_s:g} s and was killed", err) from err
        except Exception as err:  # RayActorError / ActorDiedError / ActorUnavailableError: node or actor lost
            self._kill()
            raise self._error("was lost", err) from err

    def _kill(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.actor, no_restart=True)

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # a lost simulator cannot close itself
            ray.get(self.actor.close.remote(), timeout=10)
        self._kill()
