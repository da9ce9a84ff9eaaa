"""``run_training``: build everything a :class:`~.config.TrainConfig` describes, train on TRL, write the run directory.

The run directory is every trainer's layout (:mod:`wmrl.core.rundir`), plus::

    RUN/final/               the trained policy (LoRA adapter or full model + tokenizer) for `wmrl eval autoresearch`
    RUN/tensorboard/         TRL's TensorBoard events (logging.report_to; other trackers log to their own stores)

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
from wmrl.core.errors import Interrupted, UserError
from wmrl.core.rundir import RunDirectory, add_attempt_wall, earlier_wall_s, list_checkpoints

__all__ = [
    "AGENT_LIBRARIES",
    "ANCHOR_STATUSES",
    "RunResult",
    "SandboxUnavailable",
    "run_from_cli",
    "run_training",
]

#: What the agent is told it may import (short, to keep prompts small; the sandbox runs this
#: interpreter, so all of these are importable there).
AGENT_LIBRARIES = ("numpy", "pandas", "scipy", "scikit-learn", "lightgbm")


class SandboxUnavailable(UserError, RuntimeError):
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
    #: anchor groups / groups over the whole run (``None``: the mode logs none)
    anchor_fraction_realised: float | None = None


def _anchor_statuses() -> tuple[str, ...]:
    """Outcomes of real executions logged as ``anchor_status/<status>`` shares: the grading ladder's
    statuses, ``malformed`` for replies without a script, ``unknown`` for a source without statuses."""
    from wmrl.autoresearch.grading.ladder import STATUSES

    return (*STATUSES, "malformed", "unknown")


ANCHOR_STATUSES = _anchor_statuses()


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


def build_grader(section):
    """An execution grader on the sandbox a ``SandboxSection`` describes (raises if that backend cannot run)."""
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.sandbox import SandboxPool, backend_problems, make_sandbox

    cache = "memory" if section.cache else None
    if section.pool == "ray":  # the backend runs on the Ray workers; they report what fails there
        from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool

        pool = make_ray_sandbox_pool(section.backend, section.ray, cache=cache)
        if section.ray.gpus_per_slot > 0:  # every execution asks for a GPU; each slot runs it on its own
            from wmrl.autoresearch.training.devices import RequestGPU

            pool.sandbox = RequestGPU(pool.sandbox)
    else:
        sandbox = make_sandbox(section.backend)
        if getattr(sandbox, "problem", None):
            working = [name for name, problem in backend_problems().items() if problem is None]
            raise SandboxUnavailable(
                f"sandbox backend {section.backend!r} cannot run here: {sandbox.problem}. Backends that can: "
                f"{working} (choose one with sandbox.backend=NAME; 'subprocess' does NOT isolate the agent's code)"
            )
        if section.gpus:  # each concurrent execution on its own device group
            from wmrl.autoresearch.training.devices import (
                DeviceSlots,
                device_groups,
                missing_gpus,
                visible_gpus,
            )

            missing = missing_gpus(section.gpus)
            if missing:
                have = sorted(visible_gpus())
                raise SandboxUnavailable(
                    f"sandbox.gpus asks for GPU(s) {missing} that this machine does not have (visible: "
                    f"{have or 'none, a CPU-only machine'}); give the agent's code no GPU with sandbox.gpus=[] "
                    "or list devices that exist"
                )
            sandbox = DeviceSlots(sandbox, device_groups(section.gpus, section.gpus_per_slot))
        pool = SandboxPool(sandbox, slots=section.workers, cache=cache)
    return ExecutionGrader(
        sandbox=pool, time_limit_s=section.time_limit_s, memory_limit_mb=section.memory_limit_mb
    )


def build_anchor(config: TrainConfig, tasks_by_ref: dict[str, Any]):
    """The real-execution reward source on the configured sandbox (raises if that backend cannot run)."""
    from wmrl.autoresearch.grading import ExecutionRewardSource
    from wmrl.autoresearch.tasks import load_task

    return ExecutionRewardSource(
        build_grader(config.sandbox),
        max_workers=config.sandbox.workers,
        task_loader=lambda ref: tasks_by_ref[ref] if ref in tasks_by_ref else load_task(ref),
    )


def build_world_model(config: TrainConfig, tasks_by_ref: dict[str, Any], device: str):
    """The world model: a frozen copy of ``world_model.backend.path`` (default: the agent's backbone)."""
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.overview import OverviewConfig, from_task
    from wmrl.autoresearch.training.warm import resolve_spec
    from wmrl.autoresearch.worldmodel import WorldModel

    section = config.world_model
    spec = resolve_spec(section.backend.path or config.model.path)
    backend, tokenizer = _world_model_backend(section.backend, spec, config.model.dtype, device)
    budget = OverviewConfig(max_tokens=section.overview_tokens)

    def overview(ref: str) -> str:
        task = tasks_by_ref[ref]
        env = SandboxEnvironment.from_task(task, libraries=AGENT_LIBRARIES, gpus=config.sandbox.gpu_count)
        return from_task(task, environment=env, config=budget, tokens=tokenizer)

    return WorldModel(backend, section, overview_fn=overview, tokens=tokenizer)


def _world_model_backend(settings, spec: str, dtype: str, device: str):
    """``(backend, tokenizer)`` of ``world_model.backend.kind``: the frozen model in process
    (transformers), vLLM's offline engine, or OpenAI-compatible servers (``vllm serve`` per GPU)."""
    from wmrl.autoresearch.llm import TransformersBackend, load_model, load_tokenizer

    if settings.kind == "openai":  # the servers hold the model; only its tokenizer is loaded here
        from wmrl.autoresearch.llm.endpoints import EndpointPool

        pool = EndpointPool(
            settings.endpoints,
            timeout_s=settings.timeout_s,
            max_retries=settings.retries,
            concurrency=settings.concurrency,
        )
        return pool, load_tokenizer(spec)
    if settings.kind == "vllm":
        from wmrl.autoresearch.llm import VLLMBackend

        return (
            VLLMBackend(
                spec, gpu_memory_utilization=settings.gpu_memory_utilization, dtype=_VLLM_DTYPES[dtype]
            ),
            load_tokenizer(spec),
        )
    loaded = load_model(spec, dtype=dtype, device=device)
    for parameter in loaded.model.parameters():
        parameter.requires_grad_(False)
    backend = TransformersBackend(
        loaded.model, loaded.tokenizer, model_id=loaded.model_id, batch_size=settings.batch_size
    )
    return backend, loaded.tokenizer


_VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _pool_metrics(anchor):
    """The real-execution pool's counters (``pool/*``: cache, and a Ray pool's workers, retries, losses)."""
    if anchor is None:
        return None
    from wmrl.autoresearch.sandbox.ray_pool import pool_metrics

    return lambda: pool_metrics(anchor.grader.sandbox)


def _grpo_args(config: TrainConfig, out_dir: Path, device: str):
    from trl import GRPOConfig

    g = config.grpo
    on_cpu = device == "cpu"
    rollouts = config.groups_per_step * config.group_size
    micro = g.micro_batch_size or rollouts
    return GRPOConfig(
        output_dir=str(out_dir / "checkpoints"),
        max_steps=config.steps,
        per_device_train_batch_size=micro,
        # one generation (the step's groups) per update, its rollouts in micro-batches
        gradient_accumulation_steps=rollouts // micro,
        steps_per_generation=rollouts // micro,
        num_generations=config.group_size,
        max_completion_length=g.max_completion_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        learning_rate=config.learning_rate,
        beta=g.beta,
        loss_type=g.loss_type,
        seed=config.seed,
        logging_steps=1,
        save_strategy="steps",
        save_steps=config.checkpoint.every or config.steps,
        save_total_limit=config.checkpoint.keep,
        report_to=list(config.logging.report_to) or "none",
        disable_tqdm=True,
        log_completions=False,  # WMRL's completions table has both streams' scores side by side
        # On a CPU: no bf16 and no gradient checkpointing (both make GRPO several times slower there).
        use_cpu=on_cpu,
        bf16=(not on_cpu) and config.model.dtype == "bfloat16",
        gradient_checkpointing=g.gradient_checkpointing and not on_cpu,
        **_vllm_args(g, on_cpu),
    )


def _vllm_args(g, on_cpu: bool) -> dict:
    """TRL's vLLM settings from ``grpo.use_vllm`` (refused on a CPU: vLLM's wheel is CUDA-only)."""
    from wmrl.core.config import ConfigError

    if g.gradient_checkpointing and on_cpu:
        raise ConfigError(
            "grpo.gradient_checkpointing=true on a CPU makes GRPO several times slower; it is for GPUs "
            "(model.device=cuda)"
        )
    if not g.use_vllm:
        return {}
    if on_cpu:
        raise ConfigError("grpo.use_vllm=true needs a GPU (vLLM is CUDA-only): set model.device=cuda")
    args = {
        "use_vllm": True,
        "vllm_mode": g.vllm_mode,
        "vllm_gpu_memory_utilization": g.vllm_gpu_memory_utilization,
    }
    if g.vllm_server_base_url is not None:
        args["vllm_server_base_url"] = g.vllm_server_base_url
    return args


def _peft_config(config: TrainConfig, model=None):
    """PEFT's LoRA config of ``config.lora`` (``None`` without LoRA); ``model`` gives the decoder's
    layer count that ``lora.last_layers`` counts from."""
    if not config.lora.enabled:
        return None
    from peft import LoraConfig

    from wmrl.core.config import ConfigError

    lora = config.lora
    layers = None
    if lora.last_layers:
        total = getattr(getattr(model, "config", None), "num_hidden_layers", None)
        if not isinstance(total, int):
            raise ConfigError("lora.last_layers needs a model whose config names num_hidden_layers")
        if lora.last_layers < total:  # a model with no more layers than that: every layer
            layers = list(range(total - lora.last_layers, total))
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )


def plot_learning(run_dir: Path) -> Path | None:
    """``plots/learning.png``: the training reward and what real execution measured each step (valid
    rate and mean position of the executed rollouts), the run's learning curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wmrl.core.runlog import read_metrics

    rows = read_metrics(run_dir)
    curves = [
        ("reward", "reward (corrected, all rollouts)"),
        ("executed/valid_rate", "valid rate (executed rollouts)"),
        ("executed/position", "leaderboard position (executed rollouts, 0 if invalid)"),
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for key, label in curves:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Learning on the training tasks")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(run_dir) / "plots" / "learning.png"
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _check_policy_action(config: TrainConfig) -> None:
    """Refuse a policy whose run recorded the other action: a script policy asked for a model block
    (or the reverse) writes replies that do not fit the prompt, and GRPO would start from nothing."""
    from wmrl.autoresearch.training.policy_action import trained_action_of
    from wmrl.core.config import ConfigError

    action, source = trained_action_of(config.model.path)
    if source != "the default" and action != config.tasks.action:
        raise ConfigError(
            f"model.path={config.model.path} was trained for tasks.action={action} ({source}), but this run "
            f"has tasks.action={config.tasks.action}: set tasks.action={action}, or start from a policy of that action"
        )


def run_training(
    config: TrainConfig,
    out_dir: str | os.PathLike | RunDirectory,
    *,
    resume: str | bool | None = None,
    log=print,
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
    started = time.perf_counter()
    import warnings

    import torch

    # transformers warns on every step that TRL passes the old name of gradient checkpointing
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated", category=FutureWarning)
    from accelerate import PartialState
    from datasets import Dataset
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from wmrl.autoresearch.llm import load_model
    from wmrl.autoresearch.training.data import build_prompt_rows, resolve_training_tasks
    from wmrl.autoresearch.training.episodes import episode_factory
    from wmrl.autoresearch.training.streams import execution_metrics, solution_items, solution_key
    from wmrl.core.completions import CompletionsTable
    from wmrl.core.config import ConfigError
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.engines.trl.callbacks import RunLogCallback
    from wmrl.core.ledger import CostLedger
    from wmrl.core.runlog import RunWriter, plot_run
    from wmrl.core.scheduler import AnchorScheduler

    if isinstance(out_dir, RunDirectory):
        run_dir = out_dir
    else:
        run_dir = RunDirectory(
            Path(out_dir),
            resume=resume is True,
            resume_from=Path(resume) if isinstance(resume, (str, os.PathLike)) else None,
            command="wmrl train autoresearch",
        )
    out = run_dir.path
    device = _device(config)
    on_cpu = device == "cpu"
    # One process, or one of several ranks; the process group starts here (gloo on CPUs).
    processes = PartialState(cpu=on_cpu)
    if run_dir.checkpoint is not None and (out / "config.json").is_file():
        config.check_resume(json.loads((out / "config.json").read_text()))
    # Tasks and the batch are checked before anything is written, so a bad config leaves no run behind.
    sb = config.sandbox
    tasks = resolve_training_tasks(
        config.tasks.ids,
        config.tasks.limit,
        sb.time_limit_s,
        sb.memory_limit_mb,
        mledojo_root=config.tasks.mledojo_root,
        data_dir=config.tasks.data_dir,
    )
    prompts = len(tasks) * config.tasks.prompts_per_task
    if prompts < config.groups_per_step * processes.num_processes:
        raise ConfigError(
            f"{processes.num_processes} process(es) x groups_per_step {config.groups_per_step} need that many "
            f"distinct prompts per step, but {len(tasks)} tasks x tasks.prompts_per_task "
            f"{config.tasks.prompts_per_task} give {prompts}: raise tasks.prompts_per_task or add tasks"
        )
    _check_policy_action(config)
    processes.wait_for_everyone()  # every rank has checked before the main one creates the run
    main = processes.is_main_process
    if main:
        run_dir.open()
        if run_dir.checkpoint is None:  # from step 0: a stopped attempt's pairs are not this run's
            from wmrl.autoresearch.training.anchor_pairs import PAIRS_GLOB

            for stale in out.glob(PAIRS_GLOB):
                stale.unlink()
    # TRL reports to the trackers (logging.report_to); the writer keeps metrics.jsonl and config.json.
    writer = RunWriter(out, config) if main else _SilentWriter()
    if not main:
        log = _quiet
    trainer = None
    try:
        tasks_by_ref = {t.ref: t.task for t in tasks}
        log(f"[wmrl] mode {config.mode.value}; {len(tasks)} training tasks; device {device}")
        t0 = time.perf_counter()
        from wmrl.autoresearch.training.warm import resolve_spec

        policy = load_model(resolve_spec(config.model.path, log), dtype=config.model.dtype, device=device)
        log(f"[wmrl] policy {policy.model_id} loaded in {time.perf_counter() - t0:.1f} s")
        anchor = build_anchor(config, tasks_by_ref) if config.mode.executes else None
        if anchor is not None:  # the run's (script, real outcome) pairs, for a world model tuned on them
            from wmrl.autoresearch.training.anchor_pairs import AnchorPairRecorder

            pairs_file = "anchor_pairs.jsonl"
            if processes.num_processes > 1:
                pairs_file = f"anchor_pairs-rank{processes.process_index}.jsonl"
            anchor.record = AnchorPairRecorder(
                out / pairs_file, step=lambda: trainer.state.global_step + 1 if trainer is not None else 0
            )
        world_model = None
        if config.mode.needs_world_model:
            t0 = time.perf_counter()
            world_model = build_world_model(config, tasks_by_ref, device)
            log(
                f"[wmrl] world model (frozen {world_model.backend.model_id}, scoring {config.world_model.scoring}) "
                f"loaded in {time.perf_counter() - t0:.1f} s"
            )
        if config.mode.executes and config.mode.needs_world_model:
            n = config.groups_per_step * processes.num_processes
            scheduler = AnchorScheduler(config.corrector.scheduler)
            memory = (
                " (solutions executed before are graded from memory)" if config.corrector.memory_on else ""
            )
            log(f"[wmrl] anchors: {scheduler.describe(n, config.group_size)}{memory}")
        rows = build_prompt_rows(
            tasks,
            turns=config.episode.turns,
            overview_tokens=config.tasks.overview_tokens,
            prompts_per_task=config.tasks.prompts_per_task,
            tokens=policy.tokenizer,
            libraries=AGENT_LIBRARIES,
            gpus=config.sandbox.gpu_count,
            action=config.tasks.action,
        )
        held = 0.0  # accelerators this process holds: its own GPU per rank, all GPUs for one process
        if device.startswith("cuda"):
            held = 1.0 if processes.num_processes > 1 else float(max(torch.cuda.device_count(), 1))
        ledger = CostLedger(
            {"generation": held, "update": held, "world_model": min(held, 1.0), "anchor": 0.0}
        )
        multi_turn = config.episode.turns > 1
        run_log = RunLogCallback(writer, progress and config.logging.progress and main, config.steps)
        trainer = WMRLGRPOTrainer(
            model=policy.model,
            args=_grpo_args(config, out, device),
            train_dataset=Dataset.from_list(rows),
            processing_class=policy.tokenizer,
            world_model=world_model,
            anchor=anchor,
            mode=config.mode,
            corrector=config.corrector,
            item_fn=solution_items(),
            solution_key=solution_key,
            episodes=episode_factory(config.episode, policy.tokenizer) if multi_turn else None,
            turns=config.episode.turns,
            ledger=ledger,
            statuses=ANCHOR_STATUSES,
            real_metrics=execution_metrics,
            completions=CompletionsTable(out) if config.logging.completions and main else None,
            completions_to_print=config.logging.completions_to_print if config.logging.completions else 0,
            peft_config=_peft_config(config, policy.model),
            callbacks=[run_log],
            metrics_fn=_pool_metrics(anchor),
        )
        trainer.on_phase = run_log.set_phase
        # our own bar and log writer replace transformers' (which print every log dict to stdout)
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, TensorBoardCallback):
                callback.logging_dir = str(out / "tensorboard")  # not TRL's output_dir/runs/<time>
        checkpoint = str(run_dir.checkpoint) if run_dir.checkpoint is not None else None
        trainer.train(resume_from_checkpoint=checkpoint)
        final = out / "final"
        if not trainer.stopped_early:
            trainer.save_model(str(final))
            trainer.save_wmrl_state(final)
            if main:  # the base model's *spec*, so `wmrl eval` finds the base of a LoRA adapter elsewhere too
                from wmrl.autoresearch.training.data import recorded_train_tasks

                lineage = [
                    *recorded_train_tasks(resolve_spec(config.model.path)),
                    *(t.task.id for t in tasks),
                ]
                (final / "wmrl_policy.json").write_text(
                    json.dumps(
                        {
                            "base": config.model.path,
                            "lora": config.lora.enabled,
                            "mode": config.mode.value,
                            "train_tasks": list(dict.fromkeys(lineage)),
                        },
                        indent=2,
                    )
                )
        merged = trainer.merged_ledger()  # every rank's costs (a collective: all ranks call it)
        report = trainer.pipeline.cost_report(
            steps=trainer.state.global_step, ledger=merged, processes=processes.num_processes, device=device
        )
        writer.write_json("cost_report.json", report)
        log("[wmrl] cost per stream:\n" + merged.format())
        if config.logging.plots and main:
            plot_run(out, trainer.corrector.debiaser, reward_key="reward")
            plot_learning(out)
            if not trainer.corrector.debiaser.n_pairs:
                log(
                    f"[wmrl] no calibration pairs in mode {config.mode.value}: plots/calibration.png is not drawn"
                )
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once
        writer.close()
        done = 0 if trainer is None else trainer.state.global_step
        if main and done == 0 and run_dir.abandon():
            raise Interrupted("interrupted before the first step completed; nothing was kept") from None
        if main:
            add_attempt_wall(out, time.perf_counter() - started)
        raise Interrupted(
            f"interrupted; the last checkpoint is kept (continue with: {run_dir.resume_hint})"
        ) from None
    except BaseException:
        writer.close()
        if main and (trainer is None or trainer.state.global_step == 0):
            run_dir.abandon()  # nothing was done: leave no run folder behind
        if main:
            add_attempt_wall(out, time.perf_counter() - started)
        raise
    writer.close()
    processes.wait_for_everyone()  # the main process has written everything
    checkpoints = list_checkpoints(out)
    if trainer.stopped_early:
        if main:
            add_attempt_wall(out, time.perf_counter() - started)
        raise Interrupted(
            f"stopped after step {trainer.state.global_step}; checkpoint saved; continue with: {run_dir.resume_hint}"
        )
    wall = time.perf_counter() - started
    logged = (out / "metrics.jsonl").read_text().splitlines()
    rows_logged = len(logged)
    realised = [
        json.loads(x).get("wmrl/anchor_fraction_realised") for x in logged if "anchor_fraction_realised" in x
    ]
    if main:
        summary = {
            "wall_s": wall,
            # this attempt and the earlier ones it continues (resumed from their checkpoints)
            "wall_s_total": earlier_wall_s(out) + wall,
            "final_model": str(final),
            "last_checkpoint": str(checkpoints[-1]) if checkpoints else None,
            "processes": processes.num_processes,
            "anchor_fraction_realised": realised[-1] if realised else None,
        }
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
        anchor_fraction_realised=realised[-1] if realised else None,
    )


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
    lines = [
        f"[wmrl] run directory: {result.run_dir} ({result.wall_s:.0f} s)",
        f"[wmrl]   metrics: {result.run_dir / 'metrics.jsonl'} ({result.metrics_rows} rows); plots: {result.run_dir / 'plots'}",
        f"[wmrl]   cost report: {result.run_dir / 'cost_report.json'}{ratio}",
        *(
            [f"[wmrl]   realised anchor fraction: {result.anchor_fraction_realised:.3f} of all groups"]
            if result.anchor_fraction_realised is not None
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
