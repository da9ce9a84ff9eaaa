"""The pieces a GRPO run on the AutoResearch domain is built from, each from its part of the config.

:func:`~wmrl.autoresearch.training.run.run_training` wires them together: the checks before anything
is written (:func:`check_run`), the real-execution source (:func:`build_anchor`), the world model
(:func:`build_world_model`), TRL's arguments (:func:`grpo_args`), the trainer (:func:`build_trainer`)
and the final policy (:func:`save_final_policy`). The parts that need no warm start (device,
adapters, the grader and its sandbox) are in :mod:`.components` and re-exported here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from wmrl.autoresearch.training.components import (
    AGENT_LIBRARIES,
    SandboxUnavailable,
    build_grader,
    peft_config,
    resolve_device,
)
from wmrl.autoresearch.training.config import TrainConfig

__all__ = [
    "AGENT_LIBRARIES",
    "ANCHOR_STATUSES",
    "SandboxUnavailable",
    "build_anchor",
    "build_grader",
    "build_trainer",
    "build_world_model",
    "check_policy_action",
    "check_run",
    "grpo_args",
    "peft_config",
    "pool_metrics",
    "resolve_device",
    "save_final_policy",
    "step_metrics",
    "world_model_backend",
]

_VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _anchor_statuses() -> tuple[str, ...]:
    """Outcomes of real executions logged as ``anchor_status/<status>`` shares: the grading ladder's
    statuses, ``malformed`` for replies without a script, ``unknown`` for a source without statuses."""
    from wmrl.autoresearch.grading.ladder import STATUSES

    return (*STATUSES, "malformed", "unknown")


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
    """The world model: a frozen copy of ``world_model.backend.path`` (default: the agent's backbone),
    fused with a surrogate learned from the run's executions when ``world_model.surrogate.enabled``."""
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.overview import OverviewConfig, from_task
    from wmrl.autoresearch.training.warm import resolve_spec
    from wmrl.autoresearch.worldmodel import WorldModel

    section = config.world_model
    spec = resolve_spec(section.backend.path or config.model.path)
    backend, tokenizer = world_model_backend(section.backend, spec, config.model.dtype, device)
    budget = OverviewConfig(max_tokens=section.overview_tokens)

    def overview(ref: str) -> str:
        task = tasks_by_ref[ref]
        env = SandboxEnvironment.from_task(task, libraries=AGENT_LIBRARIES, gpus=config.sandbox.gpu_count)
        return from_task(task, environment=env, config=budget, tokens=tokenizer)

    language_model = WorldModel(backend, section, overview_fn=overview, tokens=tokenizer)
    if section.surrogate.enabled:
        from wmrl.autoresearch.worldmodel.surrogate import with_surrogate

        return with_surrogate(language_model, section.surrogate)
    return language_model


def language_model_of(world_model: Any) -> Any:
    """The language-model world model inside what :func:`build_world_model` built."""
    sources = getattr(world_model, "sources", None)
    return sources[0] if sources else world_model


def step_metrics(anchor: Any, world_model: Any):
    """``metrics_fn`` of the trainer: the real-execution pool's counters and a fused world model's
    weights (``world_model/weight/<source>``); ``None`` when there are neither."""
    parts = [f for f in (pool_metrics(anchor), getattr(world_model, "metrics", None)) if f is not None]
    if not parts:
        return None
    return lambda: {key: value for part in parts for key, value in part().items()}


def world_model_backend(settings, spec: str, dtype: str, device: str):
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
        engine = {"gpu_memory_utilization": settings.gpu_memory_utilization, "dtype": _VLLM_DTYPES[dtype]}
        if settings.python is not None:  # the engine in a worker of vLLM's own environment
            from wmrl.autoresearch.llm import resolve_model_path
            from wmrl.autoresearch.llm.vllm_worker import VLLMWorkerBackend

            backend = VLLMWorkerBackend(
                str(resolve_model_path(spec)),
                python=settings.python,
                request_timeout_s=settings.timeout_s,
                **engine,
            )
            return backend, load_tokenizer(spec)
        from wmrl.autoresearch.llm import VLLMBackend

        return VLLMBackend(spec, **engine), load_tokenizer(spec)
    loaded = load_model(spec, dtype=dtype, device=device)
    for parameter in loaded.model.parameters():
        parameter.requires_grad_(False)
    in_process = TransformersBackend(
        loaded.model, loaded.tokenizer, model_id=loaded.model_id, batch_size=settings.batch_size
    )
    return in_process, loaded.tokenizer


def pool_metrics(anchor):
    """The real-execution pool's counters (``pool/*``: cache, and a Ray pool's workers, retries, losses)."""
    if anchor is None:
        return None
    from wmrl.autoresearch.sandbox.ray_pool import pool_metrics

    return lambda: pool_metrics(anchor.grader.sandbox)


def grpo_args(config: TrainConfig, out_dir: Path, device: str):
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
    """TRL's vLLM settings from ``grpo.use_vllm`` (colocate and server refused on a CPU; ``http`` is
    WMRL's own client, :func:`vllm_http`, and leaves TRL's vLLM off)."""
    from wmrl.core.config import ConfigError

    if g.gradient_checkpointing and on_cpu:
        raise ConfigError(
            "grpo.gradient_checkpointing=true on a CPU makes GRPO several times slower; it is for GPUs "
            "(model.device=cuda)"
        )
    if not g.use_vllm or g.vllm_mode == "http":  # http: WMRL's own client takes TRL's place (vllm_http)
        return {}
    if on_cpu:
        raise ConfigError(
            f"grpo.vllm_mode={g.vllm_mode} needs a GPU (TRL's colocate mode needs vLLM in this environment, its "
            "server mode pushes weights with NCCL): set model.device=cuda, or use grpo.vllm_mode=http with a "
            "vLLM server (its CPU build runs here)"
        )
    args = {
        "use_vllm": True,
        "vllm_mode": g.vllm_mode,
        "vllm_gpu_memory_utilization": g.vllm_gpu_memory_utilization,
    }
    if g.vllm_server_base_url is not None:
        args["vllm_server_base_url"] = g.vllm_server_base_url
    return args


def vllm_http(config: TrainConfig, out: Path):
    """WMRL's client of a stock vLLM server (``grpo.vllm_mode=http``), or ``None``: the policy's weights
    go to ``<run>/vllm-weights``, which the server must be able to read."""
    g = config.grpo
    if not (g.use_vllm and g.vllm_mode == "http"):
        return None
    from wmrl.core.engines.trl import VLLMHTTPConfig

    assert g.vllm_server_base_url is not None  # GRPOSection refuses vllm_mode=http without it
    return VLLMHTTPConfig(g.vllm_server_base_url, weights_dir=str(out / "vllm-weights"), seed=config.seed)


def check_policy_action(config: TrainConfig) -> None:
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


ANCHOR_STATUSES = _anchor_statuses()


def check_run(config: TrainConfig, run_dir: Any, processes: int) -> list[Any]:
    """What is checked before anything is written (a bad config leaves no run behind): the resume
    rules, the training tasks and that they give every process its distinct prompts, the policy's
    action. Returns the training tasks.
    """
    import json

    from wmrl.autoresearch.training.data import resolve_training_tasks
    from wmrl.core.config import ConfigError

    out = run_dir.path
    if run_dir.checkpoint is not None and (out / "config.json").is_file():
        config.check_resume(json.loads((out / "config.json").read_text()))
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
    if prompts < config.groups_per_step * processes:
        raise ConfigError(
            f"{processes} process(es) x groups_per_step {config.groups_per_step} need that many "
            f"distinct prompts per step, but {len(tasks)} tasks x tasks.prompts_per_task "
            f"{config.tasks.prompts_per_task} give {prompts}: raise tasks.prompts_per_task or add tasks"
        )
    check_policy_action(config)
    return tasks


def build_trainer(
    config: TrainConfig,
    tasks: list[Any],
    out: Path,
    device: str,
    processes: Any,
    writer: Any,
    log: Any,
    progress: bool,
) -> Any:
    """The TRL trainer of a run: the policy, the two sources, the prompts, the ledger and callbacks.

    Args:
        tasks: the training tasks (:func:`check_run`).
        out: the run directory. device: this process's device. processes: accelerate's state.
        writer: the run's writer (the main process's). log: progress lines. progress: a bar over steps.
    """
    import torch
    from datasets import Dataset
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from wmrl.autoresearch.llm import load_model
    from wmrl.autoresearch.training.data import build_prompt_rows
    from wmrl.autoresearch.training.episodes import episode_factory
    from wmrl.autoresearch.training.streams import execution_metrics, solution_items, solution_key
    from wmrl.autoresearch.training.warm import resolve_spec
    from wmrl.core.completions import CompletionsTable
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.engines.trl.callbacks import RunLogCallback
    from wmrl.core.ledger import CostLedger
    from wmrl.core.scheduler import AnchorScheduler

    main = processes.is_main_process
    tasks_by_ref = {t.ref: t.task for t in tasks}
    log(f"[wmrl] mode {config.mode.value}; {len(tasks)} training tasks; device {device}")
    t0 = time.perf_counter()
    policy = load_model(resolve_spec(config.model.path, log), dtype=config.model.dtype, device=device)
    log(f"[wmrl] policy {policy.model_id} loaded in {time.perf_counter() - t0:.1f} s")
    holder: dict[str, Any] = {}
    anchor = build_anchor(config, tasks_by_ref) if config.mode.executes else None
    if anchor is not None:  # the run's (script, real outcome) pairs, for a world model tuned on them
        from wmrl.autoresearch.training.anchor_pairs import AnchorPairRecorder

        pairs_file = "anchor_pairs.jsonl"
        if processes.num_processes > 1:
            pairs_file = f"anchor_pairs-rank{processes.process_index}.jsonl"
        anchor.record = AnchorPairRecorder(
            out / pairs_file,
            step=lambda: holder["trainer"].state.global_step + 1 if "trainer" in holder else 0,
        )
    world_model = None
    if config.mode.needs_world_model:
        t0 = time.perf_counter()
        world_model = build_world_model(config, tasks_by_ref, device)
        log(
            f"[wmrl] world model (frozen {language_model_of(world_model).backend.model_id}, scoring "
            f"{config.world_model.scoring}"
            + (
                ", fused with a surrogate learned from the run"
                if config.world_model.surrogate.enabled
                else ""
            )
            + f") loaded in {time.perf_counter() - t0:.1f} s"
        )
    if config.mode.executes and config.mode.needs_world_model:
        n = config.groups_per_step * processes.num_processes
        described = AnchorScheduler(config.corrector.scheduler).describe(n, config.group_size)
        memory = " (solutions executed before are graded from memory)" if config.corrector.memory_on else ""
        log(f"[wmrl] anchors: {described}{memory}")
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
    # The sandbox's GPUs are the anchor stream's accelerators; the trainer's are idle while it waits on anchors.
    ledger = CostLedger(
        {
            "generation": held,
            "update": held,
            "world_model": min(held, 1.0),
            "anchor": config.sandbox.gpus_held,
            "anchor_wait": held,
        }
    )
    multi_turn = config.episode.turns > 1
    run_log = RunLogCallback(writer, progress and config.logging.progress and main, config.steps)
    trainer = WMRLGRPOTrainer(
        model=policy.model,
        args=grpo_args(config, out, device),
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
        peft_config=peft_config(config, policy.model),
        callbacks=[run_log],
        metrics_fn=step_metrics(anchor, world_model),
        vllm_http=vllm_http(config, out),
    )
    holder["trainer"] = trainer
    trainer.on_phase = run_log.set_phase
    # our own bar and log writer replace transformers' (which print every log dict to stdout)
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = str(out / "tensorboard")  # not TRL's output_dir/runs/<time>
    return trainer


def save_final_policy(trainer: Any, config: TrainConfig, tasks: list[Any], final: Path, main: bool) -> None:
    """The trained policy in ``final`` and, beside it, what `wmrl eval` needs to know about it: the
    base model's spec (the base of a LoRA adapter is found elsewhere too), the mode and every task of
    its lineage (the warm start's included)."""
    import json

    from wmrl.autoresearch.training.data import recorded_train_tasks
    from wmrl.autoresearch.training.warm import resolve_spec

    trainer.save_model(str(final))
    trainer.save_wmrl_state(final)
    if main:
        lineage = [*recorded_train_tasks(resolve_spec(config.model.path)), *(t.task.id for t in tasks)]
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
