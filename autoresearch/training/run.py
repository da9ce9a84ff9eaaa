"""``run_training``: build everything a :class:`~.config.TrainConfig` describes, train on TRL, write the run directory.

The run directory is every trainer's layout (:mod:`wmrl.core.rundir`), plus::

    RUN/final/               the trained policy (LoRA adapter or full model + tokenizer) for `wmrl eval autoresearch`
    RUN/tensorboard/         TRL's TensorBoard events (logging.report_to; other trackers log to their own stores)

Several processes (``torchrun`` / ``accelerate launch`` of ``python -m wmrl.core.cli train
autoresearch``): every rank trains and scores its slice, the main process alone writes the run
directory, and the cost report is the sum of every rank's ledger (rank-seconds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.autoresearch.training.builders import (
    build_trainer,
    check_run,
    resolve_device,
    save_final_policy,
)
from wmrl.autoresearch.training.config import TrainConfig
from wmrl.autoresearch.training.plots import plot_learning
from wmrl.core.log import progress as progress_line
from wmrl.core.rundir import RunDirectory, checkpoint_step, list_checkpoints
from wmrl.core.runlog import plot_run, read_metrics
from wmrl.core.session import RunSession

__all__ = ["RunResult", "run_from_cli", "run_training"]


@dataclass
class RunResult:
    """What a finished run produced."""

    run_dir: Path
    final_model: Path
    last_checkpoint: Path | None
    cost_report: dict[str, Any]
    wall_s: float
    metrics_rows: int
    #: processes that trained together, and whether this is the main one (which wrote the run)
    processes: int = 1
    main: bool = True
    #: anchor groups / groups over the whole run (``None``: the mode logs none)
    anchor_fraction_realised: float | None = None
    #: real executions / rollouts over the whole run (memory hits cost none; ``None``: not logged)
    execution_share_realised: float | None = None


def _quiet(*_: Any) -> None:
    """The progress log of a process that is not the main one (the main one speaks for the run)."""


def run_training(
    config: TrainConfig,
    out_dir: str | os.PathLike | RunDirectory,
    *,
    resume: str | bool | None = None,
    log=progress_line,
    progress: bool = True,
) -> RunResult:
    """Train with ``config`` and write the run directory (see the module docstring).

    Args:
        config: the validated configuration.
        out_dir: the run directory, or a :class:`~wmrl.core.rundir.RunDirectory` (the CLI's).
        resume: ``True`` (the latest checkpoint) or a checkpoint folder; only with a path ``out_dir``.
        log: where progress lines go.
        progress: the progress bar over steps (also needs ``logging.progress``).

    Raises:
        Interrupted: Ctrl-C; the step in progress was finished and checkpointed first.
    """
    import warnings

    from accelerate import PartialState

    # transformers warns on every step that TRL passes the old name of gradient checkpointing
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated", category=FutureWarning)
    run_dir = out_dir if isinstance(out_dir, RunDirectory) else _run_directory(Path(out_dir), resume)
    device = resolve_device(config)
    processes = PartialState(cpu=device == "cpu")  # one process, or one rank (gloo on CPUs)
    tasks = check_run(config, run_dir, processes.num_processes)
    processes.wait_for_everyone()  # every rank has checked before the main one creates the run
    session = RunSession(run_dir, config, main=processes.is_main_process)
    # TRL reports to the trackers (logging.report_to); the writer keeps metrics.jsonl and config.json
    writer = session.open(on_fresh_start=lambda: _forget_stopped_pairs(run_dir.path))
    log = log if session.main else _quiet
    trainer = None
    steps = lambda: 0 if trainer is None else trainer.state.global_step  # noqa: E731
    with session.running(steps_done=steps, last_saved=lambda: _last_checkpoint_step(run_dir.path)):
        trainer = build_trainer(config, tasks, run_dir.path, device, processes, writer, log, progress)
        trainer.train(resume_from_checkpoint=None if run_dir.checkpoint is None else str(run_dir.checkpoint))
        final = run_dir.path / "final"
        if not trainer.stopped_early:
            save_final_policy(trainer, config, tasks, final, session.main)
        merged = trainer.merged_ledger()  # every rank's costs (a collective: all ranks call it)
        report = trainer.pipeline.cost_report(
            steps=steps(), ledger=merged, processes=processes.num_processes, device=device
        )
        log("[wmrl] cost per stream:\n" + merged.format())
    processes.wait_for_everyone()  # the main process has written everything
    if trainer.stopped_early:
        session.stopped(steps())
    rows = read_metrics(run_dir.path)
    realised = [
        r["wmrl/anchor_fraction_realised"] for r in rows if r.get("wmrl/anchor_fraction_realised") is not None
    ]
    executed = [
        r["wmrl/execution_share_realised"] for r in rows if r.get("wmrl/execution_share_realised") is not None
    ]
    checkpoints = list_checkpoints(run_dir.path)
    summary = session.finish(
        report,
        steps=steps(),
        plots=lambda: _plots(trainer, run_dir.path, config, log),
        summary={
            "final_model": str(final),
            "last_checkpoint": str(checkpoints[-1]) if checkpoints else None,
            "processes": processes.num_processes,
            "anchor_fraction_realised": realised[-1] if realised else None,
            "execution_share_realised": executed[-1] if executed else None,
        },
    )
    return RunResult(
        run_dir=run_dir.path,
        final_model=final,
        last_checkpoint=checkpoints[-1] if checkpoints else None,
        cost_report=report,
        wall_s=summary["wall_s"],
        metrics_rows=len((run_dir.path / "metrics.jsonl").read_text().splitlines()),
        processes=processes.num_processes,
        main=session.main,
        anchor_fraction_realised=realised[-1] if realised else None,
        execution_share_realised=executed[-1] if executed else None,
    )


def _run_directory(out: Path, resume: str | bool | None) -> RunDirectory:
    return RunDirectory(
        out,
        resume=resume is True,
        resume_from=Path(resume) if isinstance(resume, (str, os.PathLike)) else None,
        command="wmrl train autoresearch",
    )


def _forget_stopped_pairs(out: Path) -> None:
    """A run from step 0: the anchor pairs a stopped attempt recorded are not this run's."""
    from wmrl.autoresearch.training.anchor_pairs import PAIRS_GLOB

    for stale in out.glob(PAIRS_GLOB):
        stale.unlink()


def _last_checkpoint_step(out: Path) -> int | None:
    checkpoints = list_checkpoints(out)
    return checkpoint_step(checkpoints[-1]) if checkpoints else None


def _plots(trainer: Any, out: Path, config: TrainConfig, log: Any) -> None:
    plot_run(out, trainer.corrector.debiaser, reward_key="reward")
    plot_learning(out)
    if not trainer.corrector.debiaser.n_pairs:
        log(f"[wmrl] no calibration pairs in mode {config.mode.value}: plots/calibration.png is not drawn")


def run_from_cli(config: TrainConfig, run_dir: RunDirectory, *, progress: bool) -> list[str]:
    """``wmrl train autoresearch``: train, then the lines to print (see :mod:`wmrl.core.cli_runs`)."""
    from wmrl.core.distributed import close_process_group, leave_launched_process

    try:
        result = run_training(config, run_dir, progress=progress)
    finally:
        close_process_group()  # no barrier: this also runs after a rank failed
    if not result.main:
        leave_launched_process(0)  # under torchrun / accelerate launch the main process reports the run
    est = result.cost_report.get("real_mode_estimate", {})
    ratio = (
        f" (the same run in `real` mode: ~{est['ratio_wall']:.2f}x the wall time)"
        if est.get("ratio_wall") is not None
        else ""
    )
    groups = (
        "unknown" if result.anchor_fraction_realised is None else f"{result.anchor_fraction_realised:.3f}"
    )
    lines = [
        f"[wmrl] run directory: {result.run_dir} ({result.wall_s:.0f} s)",
        f"[wmrl]   metrics: {result.run_dir / 'metrics.jsonl'} ({result.metrics_rows} rows); plots: {result.run_dir / 'plots'}",
        f"[wmrl]   cost report: {result.run_dir / 'cost_report.json'}{ratio}",
        *(
            [
                f"[wmrl]   executed for real: {result.execution_share_realised:.1%} of the rollouts"
                f" (whole anchor groups: {groups} of the groups;"
                " solutions executed before are graded from memory)"
            ]
            if result.execution_share_realised is not None
            else []
        ),
        f"[wmrl]   trained policy: {result.final_model}",
        f"[wmrl]   evaluate it: wmrl eval autoresearch --model {result.final_model}",
    ]
    if result.processes > 1:
        for line in lines:
            print(line)
        leave_launched_process(0)
    return lines
