"""Run a policy for many LIBERO episodes, with one simulator per worker process.

The policy runs here, in the calling process (it may be a torch model on an accelerator); each
worker process owns one :class:`~wmrl.embodied.env.LiberoEnv`. The runner advances in rounds:

1. collect the reply of every worker that has a command in flight (in worker order);
   finished episodes become :class:`EpisodeRecord` and their worker starts the next pending
   episode (preferring one of the same task, since switching task rebuilds the simulator);
2. ask the policy for an action for every worker waiting for one (in worker order) and send each
   action as soon as it is known, so simulators step while the policy thinks about the next one.

Rounds and worker order make the sequence of policy calls a function of (specs, number of
workers) alone, not of timing, so a run is reproducible. Each episode's seed is passed to
``policy.reset(seed=...)`` when the policy's ``reset`` takes a ``seed``; a policy that keeps
per-episode memory across ``act`` calls must be given one instance per worker (a list).

Simulators on a Ray cluster (``RolloutConfig.ray``, :mod:`.ray_worker`): each worker is a Ray actor
on any node with the resources a slot asks for, driven by the same commands; the policy stays here.

Optional batching: a policy with ``act_batch(observations, instructions) -> list[ActionStep]`` is
called once per round for all waiting workers instead of ``act`` per worker.
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing as mp
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from wmrl.core.engines.ray.config import RayPoolConfig
from wmrl.embodied.env.config import LiberoEnvConfig, parse_cameras
from wmrl.embodied.policy.base import ActionStep
from wmrl.embodied.rollout.records import EpisodeRecord, EpisodeSpec
from wmrl.embodied.rollout.worker import LocalWorker, worker_main

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    from wmrl.embodied.rollout.ray_worker import RaySimulators

__all__ = ["RolloutConfig", "RolloutRunner", "WorkerError", "run_episodes"]


class WorkerError(RuntimeError):
    """A simulator worker failed (its traceback is in the message) or died."""


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are spread and what is kept.

    Attributes:
        workers: simulator processes; ``0`` runs one simulator in this process (no IPC, handy
            for debugging and single-core machines).
        frame_cameras: cameras whose frames are kept for episodes with ``record_frames``;
            ``None`` = all cameras of the environment.
        frame_stride: keep every ``frame_stride``-th frame (the first and last are always kept).
        keep_observations: keep every observation the policy acted on (RL re-scoring needs them).
        on_error: ``"raise"`` (default): a failing simulator ends :meth:`RolloutRunner.run` with
            :class:`WorkerError`; ``"record"``: that episode ends as a failure whose
            :attr:`EpisodeRecord.error` says why, its simulator is rebuilt (a dead worker process is
            started again) and the other episodes go on (evaluation uses this); ``"retry"``: that
            episode is run again from its reset on a rebuilt simulator (on Ray, wherever Ray places
            it: a lost node's episodes move to live ones), at most ``retries`` times, after which
            :meth:`RolloutRunner.run` raises :class:`WorkerError` with the last reason (training
            uses this on Ray: an episode is never scored as a failure because a machine was lost).
        retries: reruns of one episode with ``on_error="retry"``.
        ray: run the simulators on a Ray cluster (``None``: local processes): where, with which
            resources per slot, and the deadline of one simulator command (``timeout_s``, after which
            the simulator is presumed hung and killed); ``ray.slots`` must equal ``workers``.
        start_method: multiprocessing start method; ``"spawn"`` is safe with torch and OpenGL.
        startup_timeout_s: seconds a worker may take to import the simulator stack.
    """

    workers: int = 1
    frame_cameras: tuple[str, ...] | None = None
    frame_stride: int = 1
    keep_observations: bool = False
    on_error: str = "raise"
    start_method: str = "spawn"
    startup_timeout_s: float = 600.0
    retries: int = 2
    ray: RayPoolConfig | None = None

    def __post_init__(self) -> None:
        if (
            not isinstance(self.workers, int)
            or isinstance(self.workers, bool)
            or not 0 <= self.workers <= 512
        ):
            raise ValueError(f"workers must be an integer in [0, 512]; got {self.workers!r}")
        if self.frame_cameras is not None:
            object.__setattr__(self, "frame_cameras", parse_cameras(self.frame_cameras))
        if (
            not isinstance(self.frame_stride, int)
            or isinstance(self.frame_stride, bool)
            or self.frame_stride < 1
        ):
            raise ValueError(f"frame_stride must be an integer >= 1; got {self.frame_stride!r}")
        if self.on_error not in ("raise", "record", "retry"):
            raise ValueError(f"on_error must be 'raise', 'record' or 'retry'; got {self.on_error!r}")
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ValueError(f"retries must be an integer >= 0; got {self.retries!r}")
        if self.ray is not None:
            if not isinstance(self.ray, RayPoolConfig):
                raise TypeError(f"ray must be a RayPoolConfig or None; got {type(self.ray).__name__}")
            if self.workers < 1 or self.ray.slots != self.workers:
                raise ValueError(
                    f"simulators on Ray need workers >= 1 equal to ray.slots; got workers={self.workers}, "
                    f"ray.slots={self.ray.slots}"
                )
        if self.start_method not in mp.get_all_start_methods():
            raise ValueError(
                f"start_method must be one of {mp.get_all_start_methods()}; got {self.start_method!r}"
            )
        if not self.startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s must be > 0; got {self.startup_timeout_s!r}")


class _ProcessWorker:
    """A simulator in a child process, spoken to through a pipe."""

    def __init__(self, ctx, env_config: dict, index: int) -> None:
        self.index = index
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=worker_main, args=(child, env_config), daemon=True, name=f"wmrl-libero-{index}"
        )
        self.proc.start()
        child.close()

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            raise WorkerError(f"simulator worker {self.index} did not start within {timeout:.0f} s")
        status, payload = self.recv()
        if status != "ok":
            raise WorkerError(f"simulator worker {self.index} failed to start:\n{payload}")

    def send(self, command: tuple) -> None:
        try:
            self.conn.send(command)
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(self._died()) from exc

    def recv(self) -> tuple:
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerError(self._died()) from exc

    def _died(self) -> str:
        self.proc.join(timeout=1)
        return f"simulator worker {self.index} died (exit code {self.proc.exitcode})"

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self.conn.send(("close",))
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        self.conn.close()


class _Episode:
    """Book-keeping of one running episode."""

    def __init__(
        self, index: int, spec: EpisodeSpec, cameras: tuple[str, ...], stride: int, keep_obs: bool
    ) -> None:
        self.index = index
        self.spec = spec
        self.cameras = cameras if spec.record_frames else ()
        self.stride = stride
        self.keep_obs = keep_obs
        self.t0 = time.perf_counter()
        self.obs: dict[str, np.ndarray] | None = None
        self.instruction = ""
        self.success = False
        self.terminated = False
        self.truncated = False
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.token_ids: list[np.ndarray | None] = []
        self.log_probs: list[float | None] = []
        self.step_info: list[dict[str, Any]] = []
        self.frames: dict[str, list[np.ndarray]] = {c: [] for c in self.cameras}
        self.frame_steps: list[int] = []
        self.observations: list[dict[str, np.ndarray]] | None = [] if keep_obs else None
        self.policy_s = 0.0
        self.reset_s = 0.0

    @property
    def started(self) -> bool:
        return self.obs is not None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def _keep_frame(self, obs: dict[str, np.ndarray], step: int) -> None:
        if not self.cameras:
            return
        for cam in self.cameras:
            self.frames[cam].append(obs[f"{cam}_image"])
        self.frame_steps.append(step)

    def start(self, obs: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        self.reset_s = time.perf_counter() - self.t0
        self.obs = obs
        self.instruction = info["instruction"]
        self.success = bool(info["success"])
        self._keep_frame(obs, 0)

    def record_action(self, step: ActionStep, action: np.ndarray, seconds: float) -> None:
        if self.observations is not None:
            assert self.obs is not None  # actions are asked for only after start() (the reset's reply)
            self.observations.append(self.obs)
        self.actions.append(action)
        self.token_ids.append(None if step.token_ids is None else np.asarray(step.token_ids))
        self.log_probs.append(None if step.log_prob is None else float(step.log_prob))
        self.step_info.append(dict(step.info))
        self.policy_s += seconds

    def after_step(self, obs, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
        self.obs = obs
        self.rewards.append(float(reward))
        self.success = bool(info["success"])
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        t = len(self.actions)
        if t % self.stride == 0 or self.done:
            self._keep_frame(obs, t)

    def fail(self, reason: str, details: str) -> EpisodeRecord:
        """End the episode as a failure because its simulator failed (``reason``: one line)."""
        # the last action was sent but never answered: it did not happen
        if len(self.rewards) < len(self.actions):
            n = len(self.rewards)
            del self.actions[n:], self.token_ids[n:], self.log_probs[n:], self.step_info[n:]
            if self.observations is not None:
                del self.observations[n:]
        self.success = False
        self.terminated, self.truncated = False, False
        record = self.finish()
        record.error = reason
        record.error_details = details
        return record

    def finish(self) -> EpisodeRecord:
        t = len(self.actions)
        return EpisodeRecord(
            spec=self.spec,
            instruction=self.instruction,
            success=self.success,
            steps=t,
            terminated=self.terminated,
            truncated=self.truncated,
            actions=np.asarray(self.actions, dtype=np.float32).reshape(t, 7),
            rewards=np.asarray(self.rewards, dtype=np.float32),
            token_ids=_stack_optional(self.token_ids, "token_ids", np.int64),
            log_probs=_stack_optional(self.log_probs, "log_prob", np.float64),
            step_info=self.step_info,
            frames={c: np.stack(f) for c, f in self.frames.items() if f},
            frame_steps=np.asarray(self.frame_steps, dtype=np.int64),
            observations=self.observations,
            wall_s=time.perf_counter() - self.t0,
            reset_s=self.reset_s,
            policy_s=self.policy_s,
        )


def _stack_optional(values: list, name: str, dtype) -> np.ndarray | None:
    present = [v is not None for v in values]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"the policy returned {name} on some steps of an episode but not on others")
    return np.asarray(values, dtype=dtype)


def _check_step(step: Any) -> np.ndarray:
    if not isinstance(step, ActionStep):
        raise TypeError(f"a policy must return an ActionStep; got {type(step).__name__}")
    action = np.asarray(step.action, dtype=np.float32)
    if action.shape != (7,):
        raise ValueError(f"ActionStep.action must have shape (7,); got {action.shape}")
    if not np.all(np.isfinite(action)):
        raise ValueError(f"ActionStep.action must be finite; got {action}")
    return action


def _reset_policy(policy: Any, seed: int) -> None:
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(policy.reset).parameters
    except (TypeError, ValueError):
        params = {}
    if "seed" in params:
        policy.reset(seed=seed)
    else:
        policy.reset()


class RolloutRunner:
    """Worker processes that each hold one LIBERO simulator, kept alive across :meth:`run` calls.

    Args:
        env_config: the environment every worker builds; ``task_id`` is only the initial task,
            each episode's spec chooses its own.
        config: workers and recording options.

    Use as a context manager (or call :meth:`close`) so worker processes end.
    """

    def __init__(self, env_config: LiberoEnvConfig, config: RolloutConfig | None = None) -> None:
        self.env_config = env_config
        self.config = config or RolloutConfig()
        cams = self.config.frame_cameras
        if cams is None:
            cams = env_config.cameras
        missing = [c for c in cams if c not in env_config.cameras]
        if missing:
            raise ValueError(
                f"frame_cameras {missing} are not rendered by the environment (cameras={env_config.cameras})"
            )
        self.frame_cameras: tuple[str, ...] = tuple(cams)
        self._workers: list[Any] = []
        self._slot_task: list[int | None] = []
        self._ctx: BaseContext | None = None
        self._ray: RaySimulators | None = None
        #: (episode index in the last run, reason) of every episode a simulator failure ended (or, with
        #: ``on_error="retry"``, sent to another simulator)
        self.failures: list[tuple[int, str]] = []

    @property
    def num_slots(self) -> int:
        """How many episodes run at the same time (``workers``, or 1 in-process)."""
        return max(1, self.config.workers)

    def start(self) -> None:
        """Start the workers (done by the first :meth:`run` if not called)."""
        if self._workers:
            return
        env_dict = self.env_config.to_dict()
        if self.config.workers == 0:
            self._workers = [LocalWorker(env_dict)]
        else:
            workers = [self._new_worker(env_dict, i) for i in range(self.config.workers)]
            try:
                for w in workers:
                    w.wait_ready(self.config.startup_timeout_s)
            except BaseException:
                for w in workers:
                    w.close()
                raise
            self._workers = workers
        self._slot_task = [self.env_config.task_id] * len(self._workers)

    def _new_worker(self, env_dict: dict, index: int) -> Any:
        """A simulator worker process, or a Ray actor with ``config.ray`` (not yet waited for)."""
        if self.config.ray is not None:
            if self._ray is None:
                from wmrl.embodied.rollout.ray_worker import RaySimulators

                self._ray = RaySimulators(self.config.ray)
            return self._ray.start(env_dict, index)
        if self._ctx is None:
            self._ctx = mp.get_context(self.config.start_method)
        return _ProcessWorker(self._ctx, env_dict, index)

    def _restart(self, slot: int) -> None:
        """Replace the simulator of ``slot`` with a fresh one (after it failed)."""
        env_dict = self.env_config.to_dict()
        with contextlib.suppress(Exception):
            self._workers[slot].close()
        if self.config.workers == 0:
            self._workers[slot] = LocalWorker(env_dict)
        else:
            worker = self._new_worker(env_dict, slot)
            worker.wait_ready(self.config.startup_timeout_s)
            self._workers[slot] = worker
        self._slot_task[slot] = self.env_config.task_id

    def worker_pids(self) -> list[int | None]:
        """Process ids of the simulator workers (``None`` for the in-process one)."""
        return [getattr(getattr(w, "proc", None), "pid", getattr(w, "pid", None)) for w in self._workers]

    def worker_nodes(self) -> list[str | None]:
        """The Ray node of each simulator worker (``None`` for local ones)."""
        return [getattr(w, "node", None) for w in self._workers]

    def close(self) -> None:
        """Stop the workers and free their simulators."""
        for w in self._workers:
            with contextlib.suppress(Exception):
                w.close()
        self._workers = []

    def __enter__(self) -> RolloutRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _policies(self, policy: Any) -> list[Any]:
        if isinstance(policy, (list, tuple)):
            if len(policy) != self.num_slots:
                raise ValueError(f"give one policy, or one per worker ({self.num_slots}); got {len(policy)}")
            return list(policy)
        return [policy] * self.num_slots

    def run(
        self,
        policy: Any,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[EpisodeRecord], None] | None = None,
    ) -> list[EpisodeRecord]:
        """Run every episode in ``specs``; returns their records in the order of ``specs``.

        Args:
            policy: a :class:`~wmrl.embodied.policy.VLAPolicy`, or a list of one per worker.
            specs: the episodes.
            progress: called with each record as its episode finishes.

        Raises:
            WorkerError: a simulator failed; the message carries the worker's traceback.
        """
        specs = list(specs)
        for s in specs:
            if not isinstance(s, EpisodeSpec):
                raise TypeError(f"specs must be EpisodeSpec instances; got {type(s).__name__}")
        if not specs:
            return []
        policies = self._policies(policy)
        batch_fn = getattr(policies[0], "act_batch", None) if not isinstance(policy, (list, tuple)) else None
        self.start()
        try:
            return self._run(policies, batch_fn, specs, progress)
        except BaseException:
            # A worker may be mid-command; its pipe state is unknown, so restart workers next time.
            self.close()
            raise

    def _run(self, policies, batch_fn, specs, progress) -> list[EpisodeRecord]:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
        n_slots = len(self._workers)
        pending = list(range(len(specs)))
        records: list[EpisodeRecord | None] = [None] * len(specs)
        active: list[_Episode | None] = [None] * n_slots
        in_flight = [False] * n_slots
        cfg = self.config

        def running(slot: int) -> _Episode:
            # a slot that is in flight, failing or waiting for its action holds an episode (assign sets it)
            ep = active[slot]
            assert ep is not None
            return ep

        def assign(slot: int) -> None:
            if not pending:
                return
            same_task = [j for j in pending if specs[j].task_id == self._slot_task[slot]]
            j = same_task[0] if same_task else pending[0]
            pending.remove(j)
            spec = specs[j]
            active[slot] = _Episode(j, spec, self.frame_cameras, cfg.frame_stride, cfg.keep_observations)
            self._workers[slot].send(("reset", spec.task_id, spec.init_state, spec.seed))
            in_flight[slot] = True
            self._slot_task[slot] = spec.task_id

        self.failures = []
        tries = [0] * len(specs)

        def failed(slot: int, details: str) -> None:
            # on_error="record": the episode ends as a failure with its reason; a fresh simulator goes on.
            # on_error="retry": the episode starts again from its reset on a fresh simulator.
            ep = running(slot)
            lines = [line for line in str(details).strip().splitlines() if line.strip()]
            reason = lines[-1].strip() if lines else "simulator failure"
            if cfg.on_error == "retry":
                tries[ep.index] += 1
                if tries[ep.index] > cfg.retries:
                    raise WorkerError(
                        f"episode {ep.spec} failed on {tries[ep.index]} simulators; the last: {reason}"
                    )
                self.failures.append((ep.index, reason))
                active[slot] = None
                in_flight[slot] = False
                pending.insert(0, ep.index)
                self._restart(slot)
                assign(slot)
                return
            record = ep.fail(reason, str(details))
            records[ep.index] = record
            self.failures.append((ep.index, reason))
            active[slot] = None
            in_flight[slot] = False
            self._restart(slot)
            if progress is not None:
                progress(record)
            assign(slot)

        for slot in range(n_slots):
            try:
                assign(slot)
            except WorkerError as err:
                if cfg.on_error == "raise":
                    raise
                failed(slot, str(err))
        while any(ep is not None for ep in active):
            # Phase 1: replies, in worker order.
            for slot in range(n_slots):
                if not in_flight[slot]:
                    continue
                ep = running(slot)
                try:
                    status, payload = self._workers[slot].recv()
                except WorkerError as err:
                    if cfg.on_error == "raise":
                        raise
                    failed(slot, str(err))
                    continue
                in_flight[slot] = False
                if status != "ok":
                    if cfg.on_error == "raise":
                        raise WorkerError(f"simulator worker {slot} failed on {ep.spec}:\n{payload}")
                    failed(slot, payload)
                    continue
                if not ep.started:
                    obs, info = payload
                    ep.start(obs, info)
                    _reset_policy(policies[slot], ep.spec.seed)
                    continue
                ep.after_step(*payload)
                if ep.done:
                    record = ep.finish()
                    records[ep.index] = record
                    active[slot] = None
                    if progress is not None:
                        progress(record)
                    assign(slot)
            # Phase 2: actions, in worker order; each is sent as soon as it is known.
            waiting = [s for s in range(n_slots) if active[s] is not None and not in_flight[s]]
            if not waiting:
                continue
            if batch_fn is not None:
                t0 = time.perf_counter()
                steps = batch_fn([running(s).obs for s in waiting], [running(s).instruction for s in waiting])
                share = (time.perf_counter() - t0) / len(waiting)
                if len(steps) != len(waiting):
                    raise ValueError(f"act_batch returned {len(steps)} steps for {len(waiting)} observations")
                for s, step in zip(waiting, steps, strict=True):
                    self._send_action(s, running(s), step, share, failed)
                    in_flight[s] = active[s] is not None
            else:
                for s in waiting:
                    t0 = time.perf_counter()
                    step = policies[s].act(running(s).obs, running(s).instruction)
                    self._send_action(s, running(s), step, time.perf_counter() - t0, failed)
                    in_flight[s] = active[s] is not None
        return [r for r in records if r is not None]

    def _send_action(self, slot: int, ep: _Episode, step: Any, seconds: float, failed) -> None:
        action = _check_step(step)
        ep.record_action(step, action, seconds)
        try:
            self._workers[slot].send(("step", action))
        except WorkerError as err:
            if self.config.on_error == "raise":
                raise
            failed(slot, str(err))


def run_episodes(
    env_config: LiberoEnvConfig,
    policy: Any,
    specs: Sequence[EpisodeSpec],
    config: RolloutConfig | None = None,
    progress: Callable[[EpisodeRecord], None] | None = None,
) -> list[EpisodeRecord]:
    """Start workers, run ``specs`` with ``policy``, stop the workers; see :meth:`RolloutRunner.run`."""
    with RolloutRunner(env_config, config) as runner:
        return runner.run(policy, specs, progress=progress)
