"""The loop trainer: GRPO with world-model rewards for any policy that is not a TRL text generator.

The engine for a robot policy in a simulator, a small policy over programs or configurations, or
anything a domain can roll out and update itself. It owns everything but the two things only the
domain knows, which it asks of a :class:`LoopDomain`:

1. ``groups(step)``: what to roll out (prompts, initial states);
2. ``rollout(groups, step)``: G rollouts per group with the current policy (ledger ``generation``);
3. the reward side, :class:`~wmrl.core.pipeline.RewardPipeline` (plan, score, correct);
4. ``update(batch, result, step)``: the policy update on the corrected advantages (ledger ``update``);
5. logging (``metrics.jsonl`` and ``logging.report_to``), the completions table, checkpoints
   (``RUN/checkpoints/checkpoint-N/``: the domain's files, ``wmrl_trainer.json``, the correction),
   bit-identical resume (the domain saves its own random state), Ctrl-C (the step in progress is
   finished and checkpointed, :mod:`wmrl.core.interrupt`), plots and ``cost_report.json``.

Seeds, group choice and sampling must be functions of ``(seed, step, ...)`` or of state the domain
saves, so that a resumed run continues exactly where it stopped.

**Several processes** (``torchrun``; :class:`~wmrl.core.distributed.Processes`): every rank asks the
domain for the step's groups (the same on every rank) and rolls out its contiguous share of them
(:func:`~wmrl.core.distributed.shard`); the pipeline gathers keys and scores so the plan and the
correction are the whole batch's on every rank (each rank grades only its own rollouts, on its own
ledger); the domain's update trains on ``result.local_advantages`` and sums its gradients over the
ranks, so the parameters stay identical. After the update each rank's batch (what the domain kept
of it) is gathered for the metrics and the completions table, which describe the whole step. Rank 0
alone writes the run directory; a checkpoint holds rank 0's domain files, the corrector once and
every rank's ledger. A domain declares it supports this with ``data_parallel = True``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from wmrl.core.completions import CompletionsTable, completion_rows, format_sample
from wmrl.core.distributed import Processes, shard
from wmrl.core.errors import UserError
from wmrl.core.interrupt import GracefulStop
from wmrl.core.ledger import CostLedger
from wmrl.core.pipeline import RewardPipeline, StepResult
from wmrl.core.rollouts import Group
from wmrl.core.rundir import CHECKPOINTS, RunDirectory, list_checkpoints
from wmrl.core.runlog import plot_run, write_json_atomic
from wmrl.core.session import RunSession
from wmrl.core.train_config import TrainConfigBase

if TYPE_CHECKING:
    from wmrl.core.corrector import Correction

__all__ = ["TRAINER_FILE", "LoopDomain", "LoopStep", "LoopTrainer"]

#: The loop trainer's own file in each checkpoint: the format, the step and the config it ran under.
TRAINER_FILE = "wmrl_trainer.json"
CHECKPOINT_FORMAT = "wmrl-loop-checkpoint/1"


class LoopDomain(Protocol):
    """What a domain gives :class:`LoopTrainer` (see the module docstring).

    ``rollout`` returns one :class:`~wmrl.core.rollouts.Group` per group, ``G`` rollouts each,
    whose keys are unique within the step and the same on a resume. ``update`` returns its metrics
    (``None`` = unknown). ``metrics`` adds per-step metrics about the rollouts (success rates...);
    ``completion_columns`` adds per-rollout columns to the completions table. ``save``/``load``
    write and read the policy, the optimiser and every random state into/from a checkpoint folder.
    """

    def groups(self, step: int) -> Sequence[Any]: ...

    def rollout(self, groups: Sequence[Any], step: int) -> list[Group]: ...

    def update(self, batch: list[Group], result: StepResult, step: int) -> Mapping[str, float | None]: ...

    def metrics(self, batch: list[Group], result: StepResult) -> Mapping[str, float | None]: ...

    def completion_columns(self, batch: list[Group]) -> Mapping[str, Sequence[Any]]: ...

    def save(self, folder: Path) -> None: ...

    def load(self, folder: Path) -> None: ...


@dataclass
class LoopStep:
    """One step of :meth:`LoopTrainer.train_step`: the rollouts, the reward side's result, the metrics logged."""

    batch: list[Group]
    result: StepResult
    metrics: dict[str, Any]

    @property
    def correction(self) -> Correction:
        return self.result.correction


class LoopTrainer:
    """Trains a :class:`LoopDomain` with a :class:`~wmrl.core.pipeline.RewardPipeline`.

    Args:
        domain: the policy and its environment.
        pipeline: the reward side (its mode must be the config's).
        config: the run's resolved config (shared keys: steps, logging, checkpoint...).
        run_dir: the run directory: a path (a new run there; refused if it already holds one) or a
            :class:`~wmrl.core.rundir.RunDirectory` (``RunDirectory(path, resume=True)`` continues it).
        progress: a progress bar over steps, naming the phase of the step in progress.
        details: what the domain adds to ``cost_report.json`` under ``details`` (or a function that
            computes it when the report is written).
        device: the policy's device, for the cost report.
        processes: the ranks of a data-parallel run (default: this process alone); see the module
            docstring. Every rank constructs its trainer and calls :meth:`train_step` / :meth:`run`.
    """

    def __init__(
        self,
        domain: LoopDomain,
        pipeline: RewardPipeline,
        config: TrainConfigBase,
        run_dir: RunDirectory | str | os.PathLike[str],
        *,
        progress: bool = True,
        details: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        device: str | None = None,
        processes: Processes | None = None,
    ) -> None:
        if pipeline.mode != config.mode:
            raise ValueError(
                f"the pipeline runs mode {pipeline.mode.value!r} but the config says {config.mode.value!r}"
            )
        self.processes = processes or Processes()
        if self.processes.distributed and not getattr(domain, "data_parallel", False):
            raise ValueError(
                f"{type(domain).__name__} does not declare data_parallel = True: it cannot train on "
                f"{self.processes.world} processes (its update must train on result.local_advantages and "
                "sum its gradients over the ranks)"
            )
        lag = pipeline.asynchrony.max_anchor_lag
        if lag > 0 and not getattr(domain, "late_anchors", False):
            raise ValueError(
                f"corrector.asynchrony.max_anchor_lag={lag} applies landed executions' groups in a later "
                f"update, but {type(domain).__name__} does not declare late_anchors = True (its update must "
                "train on result.late too, and keep each group's rollouts until then); set it to 0"
            )
        self.domain = domain
        self.pipeline = pipeline
        self.config = config
        if not isinstance(run_dir, RunDirectory):
            run_dir = RunDirectory(Path(run_dir))
        self.run_dir = run_dir
        self.progress = progress
        self.details = details
        self.device = device
        self.step = 0
        self._bar: Any = None  # the tqdm bar while train() runs
        main = self.processes.is_main
        # the run's life around its steps: the folder, the writer, stops, wall time, the summary
        self.session = RunSession(run_dir, config, main=main)
        self.processes.barrier()  # every rank has looked at the folder before the main one writes it
        self.session.open_directory()
        if run_dir.checkpoint is not None:
            self._restore(run_dir.checkpoint)
        self.processes.barrier()
        self.writer = self.session.open_writer(config.logging.report_to)
        self.completions = CompletionsTable(run_dir.path) if config.logging.completions and main else None
        self._started_at = self.step
        self._last_saved = self.step if run_dir.checkpoint is not None else None

    # -- checkpoints ---------------------------------------------------------------------------
    def _restore(self, folder: Path) -> None:
        try:
            state = json.loads((folder / TRAINER_FILE).read_text())
            if state.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(
                    f"{folder} has checkpoint format {state.get('format')!r}, not {CHECKPOINT_FORMAT!r}"
                )
            self.config.check_resume(state["config"])
            self.domain.load(folder)
            self.pipeline.load(folder, rank=self.processes.rank, world=self.processes.world)
        except FileNotFoundError as err:
            missing = err.filename or str(err)
            raise UserError(
                f"checkpoint {folder} is incomplete: {missing} is missing ({err.strerror or err}); resume from "
                "another checkpoint with --resume-from, or start a new run"
            ) from None
        self.step = int(state["step"])
        if self.step >= self.config.steps and self.processes.is_main:
            print(
                f"[wmrl] {self.run_dir.path} already completed its {self.step} steps: nothing to train "
                f"(raise steps=N above {self.step} to continue it)",
                file=sys.stderr,
            )
        if not self.processes.is_main:
            return
        # Steps logged after this checkpoint (a crash later) are redone: drop their lines.
        metrics = self.run_dir.path / "metrics.jsonl"
        if metrics.exists():
            kept = [
                line
                for line in metrics.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] < self.step
            ]
            metrics.write_text("".join(line + "\n" for line in kept))
        table = CompletionsTable(self.run_dir.path)
        if table.path.exists():
            table.drop_from(self.step)

    def save_checkpoint(self) -> Path:
        """Write ``RUN/checkpoints/checkpoint-<step>/`` (through a temporary folder: never half written).

        With several processes every rank calls it (the ledgers are gathered); rank 0 writes."""
        ledgers = self.processes.all_gather_object(self.pipeline.ledger.state_dict())
        root: Path = self.run_dir.path / CHECKPOINTS
        final = root / f"checkpoint-{self.step}"
        self._last_saved = self.step
        if not self.processes.is_main:
            self.processes.barrier()  # the main process has written it
            return final
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".checkpoint-{self.step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self.domain.save(tmp)
        write_json_atomic(
            tmp / TRAINER_FILE,
            {"format": CHECKPOINT_FORMAT, "step": self.step, "config": self.config.to_dict()},
        )
        self.pipeline.save(tmp, ledger_states=ledgers)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        keep = self.config.checkpoint.keep
        if keep is not None:
            for old in list_checkpoints(self.run_dir.path)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        self.processes.barrier()
        return final

    # -- one step ------------------------------------------------------------------------------
    def _phase(self, name: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"step {self.step + 1}/{self.config.steps} · {name}")

    def train_step(self, batch: list[Group] | None = None) -> LoopStep:
        """Roll out, score, correct, update; log and (when due) checkpoint.

        ``batch``: this step's rollouts (this rank's share of them), made elsewhere (the domain's
        ``rollout`` is then not called and no generation time is booked).
        """
        ledger = self.pipeline.ledger
        processes = self.processes
        t0 = time.perf_counter()
        if batch is None:
            self._phase("rollouts")
            groups = list(self.domain.groups(self.step))
            groups = groups[shard(len(groups), processes.rank, processes.world)]
            with ledger.measure("generation", items=len(groups) * self.config.group_size):
                batch = self.domain.rollout(groups, self.step) if groups else []
        n_rollouts = sum(len(g.items) for g in batch)
        t_rollout = time.perf_counter()
        self._phase("scoring")
        result = self.pipeline.step(batch, processes=processes, drain=self._checkpoints_after(self.step))
        t_score = time.perf_counter()
        self._phase("update")
        with ledger.measure("update", items=n_rollouts):
            updated = dict(self.domain.update(batch, result, self.step))
        t_update = time.perf_counter()
        if processes.distributed:  # the whole step's rollouts (what the update left of them), in rank order
            batch = [g for part in processes.all_gather_object(batch) for g in part]
        metrics: dict[str, Any] = dict(result.metrics)
        metrics.update(self.domain.metrics(batch, result))
        metrics.update(updated)
        metrics.update(
            {
                "reward/world_model_mean": _nanmean(result.scores.wm),
                "reward/real_mean": _nanmean(result.scores.real),
                "reward/corrected_mean": _nanmean(result.rewards),
                "reward/advantage_masked": float(np.isnan(result.advantages).mean()),
                "time/rollout_s": t_rollout - t0,
                "time/scoring_s": t_score - t_rollout,
                "time/update_s": t_update - t_score,
            }
        )
        if self.completions is not None:
            self._write_completions(self.completions, batch, result)
        self.step += 1
        t_ckpt = time.perf_counter()
        every = self.config.checkpoint.every
        if (every is not None and self.step % every == 0) or self.step == self.config.steps:
            self.save_checkpoint()
        metrics["time/checkpoint_s"] = time.perf_counter() - t_ckpt
        metrics["time/step_s"] = time.perf_counter() - t0
        self.writer.log(self.step - 1, metrics)
        return LoopStep(batch, result, metrics)

    def _checkpoints_after(self, step: int) -> bool:
        """Whether step ``step`` (0-based) ends with a scheduled checkpoint (asynchronous anchors drain
        there, so a checkpoint never holds executions in flight)."""
        every: int | None = self.config.checkpoint.every
        return (every is not None and (step + 1) % every == 0) or step + 1 == self.config.steps

    def _write_completions(self, table: CompletionsTable, batch: list[Group], result: StepResult) -> None:
        width = max(len(g.items) for g in batch)
        matrix = RewardPipeline._matrix  # flat scores -> (groups, G)
        anchor_rows = np.repeat(result.anchor, [len(g.items) for g in batch])
        statuses = [
            (real.status if real is not None else None)
            if is_anchor
            else (wm.status if wm is not None else None)
            for is_anchor, wm, real in zip(
                anchor_rows, result.scores.wm_grades, result.scores.real_grades, strict=True
            )
        ]
        extra = dict(self.domain.completion_columns(batch))
        rows = completion_rows(
            self.step,
            [g.key for g in batch],
            None if all(g.task is None for g in batch) else [g.task for g in batch],
            result.correction,
            matrix(batch, result.scores.wm, width),
            matrix(batch, result.scores.real, width),
            statuses,
            extra,
        )
        table.write(rows)
        if self.config.logging.completions_to_print:
            print(format_sample(rows, self.config.logging.completions_to_print, list(extra)), file=sys.stderr)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train up to ``config.steps``; then plots and ``cost_report.json``. Returns the cost report.

        Raises:
            Interrupted: Ctrl-C; the step in progress was finished and checkpointed first.
        """
        from tqdm import tqdm

        cfg = self.config
        self._bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            desc=f"train ({cfg.mode.value})",
            unit="step",
            disable=not (self.progress and cfg.logging.progress and self.processes.is_main),
            file=sys.stderr,
            dynamic_ncols=True,
        )
        try:
            with (
                GracefulStop() as stop,
                self.session.running(
                    steps_done=lambda: self.step - self._started_at, last_saved=lambda: self._last_saved
                ),
            ):
                while self.step < cfg.steps:
                    out = self.train_step()
                    self._bar.set_postfix(self._postfix(out.metrics), refresh=False)
                    self._bar.update(1)
                    if self._stop_requested(stop):
                        break
                if self._last_saved != self.step:
                    if self.pipeline.in_flight.pending or self.pipeline.in_flight.overdue:
                        # stopped between checkpoints: what is in flight lands for calibration and the
                        # memory only (its gradient has no step left to go to)
                        drained = self.pipeline.drain()
                        print(
                            f"[wmrl] stopped with executions in flight: {drained['async/drained']:.0f} step(s) of "
                            "them were awaited and used for calibration and the memory only",
                            file=sys.stderr,
                        )
                    self.save_checkpoint()
                stopped = self._stop_requested(stop) and self.step < cfg.steps
        finally:
            self._bar.close()
            self._bar = None
        if stopped:  # what the run spent so far, and its plots, before saying how to continue
            report = self._report()
            if self.processes.is_main:
                self.writer.write_json("cost_report.json", report)
                if cfg.logging.plots:
                    plot_run(self.run_dir.path, self.pipeline.corrector.debiaser)
            self.session.stopped(self.step)
        return self.finish()

    def _stop_requested(self, stop: GracefulStop) -> bool:
        """Whether any rank was asked to stop (every rank then stops after the same step)."""
        return any(self.processes.all_gather_object(bool(stop.requested)))

    @staticmethod
    def _postfix(metrics: Mapping[str, Any]) -> dict[str, str]:
        shown = {}
        for key, name in (
            ("reward/corrected_mean", "reward"),
            ("wmrl/anchor_fraction_realised", "anchors"),
            ("time/step_s", "step_s"),
        ):
            if metrics.get(key) is not None:
                shown[name] = f"{metrics[key]:.3g}"
        return shown

    def _report(self) -> dict[str, Any]:
        """The run's cost report, every rank's costs (a collective: every rank calls it)."""
        processes = self.processes
        ledger = self.pipeline.ledger
        if processes.distributed:
            ledger = CostLedger.merged(processes.all_gather_object(ledger.state_dict()))
        details = None
        if processes.is_main:
            details = self.details() if callable(self.details) else self.details
        details = processes.broadcast_object(details)
        report: dict[str, Any] = self.pipeline.cost_report(
            steps=self.step,
            ledger=ledger,
            processes=processes.world,
            device=self.device,
            details=details,
        )
        return report

    def finish(self) -> dict[str, Any]:
        """Write ``cost_report.json``, the plots and ``run_summary.json``; returns the cost report
        (every rank's costs; with several processes every rank calls it, the main one writes)."""
        report = self._report()
        self.session.finish(
            report,
            steps=self.step,
            plots=lambda: plot_run(self.run_dir.path, self.pipeline.corrector.debiaser),
            summary={"processes": self.processes.world},
        )
        self.processes.barrier()
        return report

    def close(self) -> None:
        self.pipeline.close()
        self.session.close()


def _nanmean(values: npt.NDArray[Any]) -> float | None:
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None
