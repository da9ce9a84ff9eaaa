"""``run_training``: build everything a :class:`~.config.TrainConfig` describes, train, write the run directory.

The run directory::

    RUN/config.json          the resolved config (reload it with --config to reproduce the run)
    RUN/metrics.jsonl        one object per optimiser step: TRL's metrics + the corrector's wmrl/* + cost/*
    RUN/tensorboard/         the same as TensorBoard scalars
    RUN/plots/               calibration.png (anchor pairs + isotonic map), weights.png, reward.png
    RUN/cost_report.json     seconds per stream and the estimated cost of the same run in `real` mode
    RUN/checkpoints/checkpoint-N/   TRL checkpoints, each with the corrector's state and the ledger
    RUN/final/               the trained policy (LoRA adapter or full model + tokenizer) for `wmrl eval autoresearch`

Several processes (``torchrun`` / ``accelerate launch`` of ``python -m wmrl.core.cli train
autoresearch``): every rank trains and scores its slice, the main process alone writes the run
directory, and the cost report is the sum of every rank's ledger (rank-seconds).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.autoresearch.training.config import TrainConfig

__all__ = ["RunResult", "SandboxUnavailable", "run_training"]

#: What the agent is told it may import (short, to keep prompts small; the sandbox runs this
#: interpreter, so all of these are importable there).
AGENT_LIBRARIES = ("numpy", "pandas", "scipy", "scikit-learn", "lightgbm")


class SandboxUnavailable(RuntimeError):
    """The configured sandbox backend cannot run here; the message says which backend would."""


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


def _device(config: TrainConfig) -> str:
    """The device of this process's models: under a multi-process launch each rank uses its own GPU."""
    device = config.model.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def _quiet(*_: Any) -> None:
    """The progress log of a process that is not the main one (the main one speaks for the run)."""


class _SilentWriter:
    """The run writer of a process that is not the main one: the main process writes the run."""

    def log(self, step: int, metrics: Any) -> None:
        pass

    def write_json(self, name: str, data: Any) -> None:
        pass

    def close(self) -> None:
        pass


def build_anchor(config: TrainConfig, tasks_by_ref: dict[str, Any]):
    """The real-execution reward source on the configured sandbox (raises if that backend cannot run)."""
    from wmrl.autoresearch.grading import ExecutionGrader, ExecutionRewardSource
    from wmrl.autoresearch.sandbox import SandboxPool, backend_problems, make_sandbox
    from wmrl.autoresearch.tasks import load_task

    sandbox = make_sandbox(config.sandbox.backend)
    if getattr(sandbox, "problem", None):
        working = [name for name, problem in backend_problems().items() if problem is None]
        raise SandboxUnavailable(
            f"sandbox backend {config.sandbox.backend!r} cannot run here: {sandbox.problem}. Backends that can: "
            f"{working} (choose one with sandbox.backend=NAME; 'subprocess' does NOT isolate the agent's code)"
        )
    pool = SandboxPool(
        sandbox, slots=config.sandbox.workers, cache="memory" if config.sandbox.cache else None
    )
    grader = ExecutionGrader(
        sandbox=pool, time_limit_s=config.sandbox.time_limit_s, memory_limit_mb=config.sandbox.memory_limit_mb
    )
    return ExecutionRewardSource(
        grader,
        max_workers=config.sandbox.workers,
        task_loader=lambda ref: tasks_by_ref[ref] if ref in tasks_by_ref else load_task(ref),
    )


def build_world_model(config: TrainConfig, tasks_by_ref: dict[str, Any], device: str):
    """The world model: a frozen copy of ``world_model.path`` (default: the agent's backbone)."""
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.overview import OverviewConfig, from_task
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    section = config.world_model
    loaded = load_model(section.path or config.model.path, dtype=config.model.dtype, device=device)
    for parameter in loaded.model.parameters():
        parameter.requires_grad_(False)
    backend = TransformersBackend(
        loaded.model, loaded.tokenizer, model_id=loaded.model_id, batch_size=section.batch_size
    )
    wm_config = WorldModelConfig(
        samples=section.samples,
        temperature=section.temperature,
        top_p=section.top_p,
        max_new_tokens=section.max_new_tokens,
        seed=config.grpo.seed,
        scoring=section.scoring,
        worked_example=section.worked_example,
        overview_tokens=section.overview_tokens,
        code_max_chars=section.code_max_chars,
    )
    budget = OverviewConfig(max_tokens=section.overview_tokens)

    def overview(ref: str) -> str:
        task = tasks_by_ref[ref]
        env = SandboxEnvironment.from_task(task, libraries=AGENT_LIBRARIES)
        return from_task(task, environment=env, config=budget, tokens=loaded.tokenizer)

    return WorldModel(backend, wm_config, overview_fn=overview, tokens=loaded.tokenizer)


def _grpo_args(config: TrainConfig, out_dir: Path, device: str):
    from trl import GRPOConfig

    g = config.grpo
    on_cpu = device == "cpu"
    save_steps = g.save_steps or g.steps
    return GRPOConfig(
        output_dir=str(out_dir / "checkpoints"),
        max_steps=g.steps,
        per_device_train_batch_size=g.prompts_per_step * g.group_size,
        num_generations=g.group_size,
        max_completion_length=g.max_completion_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        learning_rate=g.learning_rate,
        beta=g.beta,
        loss_type=g.loss_type,
        seed=g.seed,
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_steps,
        report_to=[],
        disable_tqdm=True,
        log_completions=False,
        # On a CPU: no bf16 and no gradient checkpointing (both make GRPO several times slower there).
        use_cpu=on_cpu,
        bf16=(not on_cpu) and config.model.dtype == "bfloat16",
        gradient_checkpointing=False,
    )


def run_training(
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    resume: str | bool | None = None,
    log=print,
) -> RunResult:
    """Train with ``config`` and write the run directory ``out_dir`` (see the module docstring).

    Args:
        config: the validated configuration.
        out_dir: the run directory (created; an existing run is continued only with ``resume``).
        resume: ``True`` (the latest checkpoint in ``out_dir/checkpoints``) or a checkpoint folder.
        log: where progress lines go.
    """
    started = time.perf_counter()
    import warnings

    import torch

    # transformers warns on every step that TRL passes the old name of gradient checkpointing
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated", category=FutureWarning)
    from accelerate import PartialState
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from wmrl.autoresearch.agent.episode import EpisodeConfig
    from wmrl.autoresearch.llm import load_model
    from wmrl.autoresearch.training.callbacks import RunLogCallback
    from wmrl.autoresearch.training.data import build_prompt_rows, resolve_training_tasks
    from wmrl.autoresearch.training.trainer import WMRLGRPOTrainer
    from wmrl.core.config import ConfigError
    from wmrl.core.corrector import Corrector
    from wmrl.core.ledger import CostLedger
    from wmrl.core.runlog import RunWriter, plot_run

    out = Path(out_dir)
    device = _device(config)
    on_cpu = device == "cpu"
    # One process, or one of several ranks; the process group starts here (gloo on CPUs).
    processes = PartialState(cpu=on_cpu)
    if (out / "metrics.jsonl").exists() and not resume:
        raise FileExistsError(
            f"{out} already holds a run (metrics.jsonl); choose another --out, or pass --resume to continue it"
        )
    # Tasks and the batch are checked before anything is written, so a bad config leaves no run behind.
    sb = config.sandbox
    tasks = resolve_training_tasks(config.tasks.ids, config.tasks.limit, sb.time_limit_s, sb.memory_limit_mb)
    prompts = len(tasks) * config.tasks.prompts_per_task
    if prompts < config.grpo.prompts_per_step * processes.num_processes:
        raise ConfigError(
            f"{processes.num_processes} process(es) x grpo.prompts_per_step {config.grpo.prompts_per_step} "
            f"need that many distinct prompts per step, but {len(tasks)} tasks x tasks.prompts_per_task "
            f"{config.tasks.prompts_per_task} give {prompts}: raise tasks.prompts_per_task or add tasks"
        )
    processes.wait_for_everyone()  # every rank has checked before the main one creates the run
    main = processes.is_main_process
    writer = RunWriter(out, config, tensorboard=config.logging.tensorboard) if main else _SilentWriter()
    if not main:
        log = _quiet
    try:
        tasks_by_ref = {t.ref: t.task for t in tasks}
        log(f"[wmrl] mode {config.mode}; {len(tasks)} training tasks; device {device}")
        t0 = time.perf_counter()
        policy = load_model(config.model.path, dtype=config.model.dtype, device=device)
        log(f"[wmrl] policy {policy.model_id} loaded in {time.perf_counter() - t0:.1f} s")
        anchor = build_anchor(config, tasks_by_ref) if config.mode != "world_model" else None
        world_model = None
        if config.mode != "real":
            t0 = time.perf_counter()
            world_model = build_world_model(config, tasks_by_ref, device)
            log(
                f"[wmrl] world model (frozen {world_model.backend.model_id}, scoring {config.world_model.scoring}) "
                f"loaded in {time.perf_counter() - t0:.1f} s"
            )
        rows = build_prompt_rows(
            tasks,
            turns=config.episode.turns,
            overview_tokens=config.tasks.overview_tokens,
            prompts_per_task=config.tasks.prompts_per_task,
            tokens=policy.tokenizer,
            libraries=AGENT_LIBRARIES,
        )
        dataset = Dataset.from_list(rows)
        held = 0.0  # accelerators this process holds: its own GPU per rank, all GPUs for one process
        if device.startswith("cuda"):
            held = 1.0 if processes.num_processes > 1 else float(max(torch.cuda.device_count(), 1))
        ledger = CostLedger(
            {"generation": held, "update": held, "world_model": min(held, 1.0), "anchor": 0.0}
        )
        corrector = Corrector(config.effective_corrector())
        peft_config = None
        if config.model.lora.enabled:
            from peft import LoraConfig

            lora = config.model.lora
            peft_config = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            )
        episode = EpisodeConfig(
            turns=config.episode.turns,
            aggregation=config.episode.aggregation,
            unknown=config.episode.unknown,
            feedback_max_tokens=config.episode.feedback_max_tokens,
        )
        trainer = WMRLGRPOTrainer(
            model=policy.model,
            args=_grpo_args(config, out, device),
            train_dataset=dataset,
            processing_class=policy.tokenizer,
            corrector=corrector,
            mode=config.mode,
            world_model=world_model,
            anchor=anchor,
            episode=episode,
            ledger=ledger,
            peft_config=peft_config,
            callbacks=[RunLogCallback(writer, config.logging.progress and main, config.grpo.steps)],
        )
        # our own bar and log writer replace transformers' (which print every log dict to stdout)
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        checkpoint = None
        if resume:
            checkpoint = True if resume is True else str(resume)
        trainer.train(resume_from_checkpoint=checkpoint)
        final = out / "final"
        trainer.save_model(str(final))
        trainer.save_wmrl_state(final)
        if main:  # the base model's *spec*, so `wmrl eval` finds the base of a LoRA adapter elsewhere too
            (final / "wmrl_policy.json").write_text(
                json.dumps(
                    {"base": config.model.path, "lora": config.model.lora.enabled, "mode": config.mode},
                    indent=2,
                )
            )
        ledger = trainer.merged_ledger()  # every rank's costs (a collective: all ranks call it)
        report = ledger.report()
        report.update(
            mode=config.mode,
            steps=trainer.state.global_step,
            device=device,
            per_item_s={
                name: (c["wall_s"] / c["items"] if c["items"] else None)
                for name, c in report["spent"].items()
            },
            accelerators_held=dict(ledger.accelerators),
            processes=processes.num_processes,
        )
        writer.write_json("cost_report.json", report)
        log("[wmrl] cost per stream:\n" + ledger.format())
        if config.logging.plots and main:
            plot_run(out, corrector.debiaser, reward_key="reward")
            if not corrector.debiaser.n_pairs:
                log(f"[wmrl] no calibration pairs in mode {config.mode}: plots/calibration.png is not drawn")
        checkpoints = sorted(
            (out / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1])
        )
    finally:
        writer.close()
    processes.wait_for_everyone()  # the main process has written everything
    wall = time.perf_counter() - started
    rows_logged = len((out / "metrics.jsonl").read_text().splitlines())
    summary = {
        "wall_s": wall,
        "final_model": str(final),
        "last_checkpoint": str(checkpoints[-1]) if checkpoints else None,
        "processes": processes.num_processes,
    }
    if main:
        (out / "run_summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(
        run_dir=out,
        final_model=final,
        last_checkpoint=checkpoints[-1] if checkpoints else None,
        cost_report=report,
        wall_s=wall,
        metrics_rows=rows_logged,
        processes=processes.num_processes,
        main=main,
    )
