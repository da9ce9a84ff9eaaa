"""``wmrl train autoresearch-sft``: the warm start, a supervised stage on TRL's ``SFTTrainer`` with LoRA.

The corpus (:mod:`.corpus`) is built from the TRAINING tasks only and executed for real: agent
examples are scripts that produced a valid submission, in the agent's exact reply format and after
the exact prompt GRPO samples from (:func:`~wmrl.autoresearch.training.data.build_prompt_rows`);
world-model examples (optional) are the world model's own prompt for a script followed by the JSON
of that script's real outcome. The loss is on the completion only.

The run directory is every trainer's layout (:mod:`wmrl.core.rundir`)::

    RUN/config.json, metrics.jsonl (loss per step), tensorboard/, plots/loss.png
    RUN/corpus.jsonl              every example with the real outcome that justified it
    RUN/corpus_report.json        executions, statuses, examples per role, mean position
    RUN/checkpoints/checkpoint-N/ TRL checkpoint + wmrl_stage.json (written last: complete)
    RUN/final/                    the policy: the LoRA merged into the base, + tokenizer +
                                  wmrl_policy.json; `wmrl train autoresearch model.path=RUN/final`
                                  and `wmrl eval autoresearch --model RUN/final` take it directly
    RUN/run_summary.json          wall time, loss first -> last

Why a sibling config base (:class:`~wmrl.core.train_config.SupervisedConfigBase`) rather than the RL
base: a supervised stage has no mode, groups or corrector, and a config offers only settings that
are honoured.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from wmrl.autoresearch.training.config import ModelSection, SandboxSection
from wmrl.core.config import require
from wmrl.core.config import require_int as _int
from wmrl.core.errors import Interrupted
from wmrl.core.log import progress as progress_line
from wmrl.core.rundir import RunDirectory
from wmrl.core.train_config import LoraConfig, SupervisedConfigBase

__all__ = ["CorpusSection", "SFTResult", "WarmStartConfig", "run_sft", "run_sft_from_cli", "sft_rows"]

#: LoRA on every linear layer of the decoder: a warm start must change what the model writes, which
#: attention-only adapters learn slowly.
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class CorpusSection:
    """What the warm start learns from (training tasks only; every script is executed first).

    Attributes:
        ids: training task references (bundled ids or folders); empty: the bundled training split.
            A held-out task (a bundled evaluation task, or one in ``exclude``) is refused.
        exclude: further task ids held out for evaluation (never in the corpus).
        limit: only the first ``limit`` tasks (``null``: all).
        agent_per_task: candidate agent scripts per task, spread over the pool's model families;
            those whose real run is valid become examples.
        world_model_per_task: world-model examples per task (working scripts and broken variants,
            each with its real outcome); 0: the warm start teaches the agent only.
        pool_size: the baseline pool the scripts are drawn from (the suite's leaderboard pool).
        seed: which pipelines are drawn.
        turns: K stated in the agent's system prompt (as in the GRPO run that follows).
        overview_tokens: the agent prompt's overview budget (as in training and evaluation).
        world_model_overview_tokens: the world model prompt's overview budget (``world_model.overview_tokens``).
        world_model_code_max_chars: the world model prompt's script budget (``world_model.code_max_chars``).
        world_model_worked_example: the world model prompt's worked example (``world_model.worked_example``).
        anchor_runs: ``wmrl train autoresearch`` run directories whose recorded anchor pairs
            (``anchor_pairs*.jsonl``: every script the run executed, with its real outcome) are the
            whole corpus instead of the baseline pool: a *world model* fine-tuned on what a run
            executed (``world_model.backend.path=<final>`` of a later run). Nothing is executed
            again; every pair's task must be one of the training tasks.
        action: what the agent examples teach: ``script`` (whole scripts) or ``model`` (the model
            block of a fixed pipeline, ``tasks.action=model`` of the GRPO run that follows).
    """

    ids: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    limit: int | None = None
    agent_per_task: int = 4
    world_model_per_task: int = 1
    pool_size: int = 60
    seed: int = 0
    turns: int = 1
    overview_tokens: int = 400
    world_model_overview_tokens: int = 400
    world_model_code_max_chars: int = 4000
    world_model_worked_example: bool = False
    anchor_runs: tuple[str, ...] = ()
    action: Literal["script", "model"] = "script"

    def __post_init__(self) -> None:
        require(len(set(self.ids)) == len(self.ids), f"corpus.ids has duplicates: {list(self.ids)}")
        require(
            self.action in ("script", "model"), f"corpus.action must be script or model; got {self.action!r}"
        )
        require(
            self.action == "script" or self.turns == 1,
            "corpus.action=model is single-turn: corpus.turns must be 1",
        )
        if self.limit is not None:
            _int(self.limit, "corpus.limit", 1)
        _int(self.agent_per_task, "corpus.agent_per_task", 1)
        _int(self.world_model_per_task, "corpus.world_model_per_task", 0)
        _int(self.pool_size, "corpus.pool_size", 10)
        _int(self.seed, "corpus.seed", 0)
        _int(self.turns, "corpus.turns", 1)
        _int(self.overview_tokens, "corpus.overview_tokens", 150)
        _int(self.world_model_overview_tokens, "corpus.world_model_overview_tokens", 200)
        _int(self.world_model_code_max_chars, "corpus.world_model_code_max_chars", 200)


@dataclass(frozen=True)
class WarmStartConfig(SupervisedConfigBase):
    """``wmrl train autoresearch-sft``: the warm start (see the module docstring).

    Attributes:
        model: the base model to warm-start (the policy of the GRPO run that follows).
        corpus: the training tasks and what is drawn from them.
        sandbox: real execution of the corpus scripts.
        max_length: tokens per example (prompt + completion); a longer example is refused, never cut.
        micro_batch_size: examples per forward pass (``batch_size`` is reached by gradient
            accumulation; memory grows with it: about 2.5 GB per 1k-token example for SmolLM2-135M).
    """

    # three passes over the 60 examples (45 optimiser steps, ~27 min on 2 CPU cores): one pass left
    # the scripts' model lines unlearnt (token accuracy 0.95; 6% of sampled training-task scripts ran)
    epochs: int = 3
    batch_size: int = 4
    learning_rate: float = 1e-3
    lora: LoraConfig = field(default_factory=lambda: LoraConfig(r=16, alpha=32, target_modules=ALL_LINEAR))
    # the embedded model itself: the warm start is what `smollm2-warm` (RL's default) is built from
    model: ModelSection = field(default_factory=lambda: ModelSection(path="smollm2"))
    corpus: CorpusSection = field(default_factory=CorpusSection)
    sandbox: SandboxSection = field(default_factory=lambda: SandboxSection(time_limit_s=120.0))
    max_length: int = 2048
    micro_batch_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.max_length, "max_length", 64)
        _int(self.micro_batch_size, "micro_batch_size", 1)
        require(
            self.batch_size % self.micro_batch_size == 0,
            f"batch_size ({self.batch_size}) must be a multiple of micro_batch_size ({self.micro_batch_size})",
        )


@dataclass
class SFTResult:
    """What a finished warm start produced."""

    run_dir: Path
    final_model: Path
    corpus: dict[str, Any]
    loss_first: float | None
    loss_last: float | None
    wall_s: float


def _tasks(config: WarmStartConfig):
    from wmrl.autoresearch.training.data import resolve_training_tasks

    c, sb = config.corpus, config.sandbox
    tasks = resolve_training_tasks(c.ids, c.limit, sb.time_limit_s, sb.memory_limit_mb)
    return [(t.ref, t.task) for t in tasks]


def sft_rows(corpus, tasks, config: WarmStartConfig, tokenizer) -> list[dict[str, Any]]:
    """The SFT dataset: ``{"prompt": [messages], "completion": [assistant message]}`` per example.

    Agent examples get exactly the GRPO prompt of their task; world-model examples the world model's
    exact prompt for their script.
    """
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.overview import OverviewConfig, from_task
    from wmrl.autoresearch.training.components import AGENT_LIBRARIES
    from wmrl.autoresearch.training.data import TrainingTask, build_prompt_rows
    from wmrl.autoresearch.worldmodel.prompts import build_messages

    c = config.corpus
    by_id = {task.id: (ref, task) for ref, task in tasks}
    agent_prompts = {
        row["task_id"]: row["prompt"]
        for row in build_prompt_rows(
            [TrainingTask(ref=ref, task=task) for ref, task in tasks],
            turns=c.turns,
            overview_tokens=c.overview_tokens,
            tokens=tokenizer,
            libraries=AGENT_LIBRARIES,
            gpus=config.sandbox.gpu_count,
            action=c.action,
        )
    }
    wm_overviews: dict[str, str] = {}
    rows = []
    for example in corpus.examples:
        if example.role == "agent":
            prompt = agent_prompts[example.task_id]
        else:
            if example.task_id not in wm_overviews:
                task = by_id[example.task_id][1]
                env = SandboxEnvironment.from_task(
                    task, libraries=AGENT_LIBRARIES, gpus=config.sandbox.gpu_count
                )
                budget = OverviewConfig(max_tokens=c.world_model_overview_tokens)
                wm_overviews[example.task_id] = from_task(
                    task, environment=env, config=budget, tokens=tokenizer
                )
            prompt = build_messages(
                wm_overviews[example.task_id],
                example.code,
                code_max_chars=c.world_model_code_max_chars,
                worked_example=c.world_model_worked_example,
            )
        rows.append(
            {
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": example.completion}],
                "role": example.role,
                "task_id": example.task_id,
            }
        )
    return rows


def _check_lengths(rows, tokenizer, max_length: int) -> None:
    from wmrl.core.config import ConfigError

    for row in rows:
        text = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n > max_length:
            raise ConfigError(
                f"an example ({row['role']}) of {row['task_id']} has {n} tokens > max_length {max_length}: raise "
                "max_length (examples are never cut: a cut example teaches a truncated reply)"
            )


def _sft_args(config: WarmStartConfig, out: Path, device: str, steps_per_epoch: int):
    from trl import SFTConfig

    on_cpu = device == "cpu"
    total = steps_per_epoch * config.epochs
    return SFTConfig(
        output_dir=str(out / "checkpoints"),
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.micro_batch_size,
        gradient_accumulation_steps=config.batch_size // config.micro_batch_size,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, total // 10),
        seed=config.seed,
        logging_steps=1,
        save_strategy="steps",
        save_steps=config.checkpoint.every or total,
        save_total_limit=config.checkpoint.keep,
        report_to=list(config.logging.report_to) or "none",
        disable_tqdm=True,
        completion_only_loss=True,
        max_length=config.max_length,
        use_cpu=on_cpu,
        bf16=(not on_cpu) and config.model.dtype == "bfloat16",
        gradient_checkpointing=False,
        dataset_num_proc=None,
    )


def run_sft(  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    config: WarmStartConfig,
    out_dir: str | os.PathLike | RunDirectory,
    *,
    resume: bool = False,
    log=progress_line,
    progress: bool = True,
) -> SFTResult:
    """Build the corpus, fine-tune with LoRA, merge, write the run directory (see the module docstring).

    Raises:
        Interrupted: Ctrl-C; the last checkpoint is kept (``--resume`` continues).
    """
    import math
    import warnings

    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated", category=FutureWarning)
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from wmrl.autoresearch.llm import load_model
    from wmrl.autoresearch.training.components import build_grader, peft_config, resolve_device
    from wmrl.autoresearch.training.corpus import build_corpus
    from wmrl.core.engines.trl.callbacks import RunLogCallback
    from wmrl.core.rundir import STAGE_FILE, list_checkpoints, write_stage_marker
    from wmrl.core.runlog import RunWriter, plot_run, read_metrics

    started = time.perf_counter()
    if isinstance(out_dir, RunDirectory):
        run_dir = out_dir
    else:
        run_dir = RunDirectory(
            Path(out_dir), resume=resume, command="wmrl train autoresearch-sft", marker=STAGE_FILE
        )
    out = run_dir.path
    if run_dir.checkpoint is not None and (out / "config.json").is_file():
        config.check_resume(json.loads((out / "config.json").read_text()))
    tasks = _tasks(config)  # refuses held-out tasks before anything is written
    device = resolve_device(config)
    reuse = _reusable_corpus(run_dir, config)  # before config.json is rewritten
    run_dir.open()
    writer = RunWriter(out, config)
    trainer = None
    try:
        log(f"[wmrl] warm start: {len(tasks)} training tasks; base {config.model.path}; device {device}")
        c = config.corpus
        corpus_file = out / "corpus.jsonl"
        from wmrl.autoresearch.training.corpus import Corpus

        policy = load_model(config.model.path, dtype=config.model.dtype, device=device)
        sft_rows(Corpus(examples=[]), tasks, config, policy.tokenizer)  # the prompts build, before executing
        if c.anchor_runs:  # a world model tuned on what runs executed: the pairs are already graded
            corpus, duplicates = _anchor_corpus(c.anchor_runs, tasks)
            corpus.write(corpus_file)
            summary = {**corpus.summary(), "duplicate_pairs_dropped": duplicates}
            if duplicates:
                log(f"[wmrl] {duplicates} repeated anchor pairs dropped (same task, script and outcome)")
            writer.write_json("corpus_report.json", summary)
        elif reuse:  # resumed or restarted with the same corpus settings: the same executed examples
            corpus = Corpus(examples=Corpus.read_examples(corpus_file), tasks=[t.id for _, t in tasks])
            summary = json.loads((out / "corpus_report.json").read_text())
        else:
            grader = build_grader(config.sandbox)
            corpus = build_corpus(
                tasks,
                agent_per_task=c.agent_per_task,
                world_model_per_task=c.world_model_per_task,
                pool_size=c.pool_size,
                seed=c.seed,
                grade=grader.grade,
                workers=config.sandbox.workers,
                exclude=c.exclude,
                log=log,
                action=c.action,
            )
            corpus.write(corpus_file)
            summary = corpus.summary()
            writer.write_json("corpus_report.json", summary)
        log(
            f"[wmrl] corpus: {summary['agent_examples']} agent examples (mean position "
            f"{_fmt(summary['agent_mean_position'])}), {summary['world_model_examples']} world-model examples, "
            f"from {summary['executions']} real executions {summary['statuses']}"
        )
        if not corpus.of_role("agent") and not c.anchor_runs:
            from wmrl.core.errors import UserError

            raise UserError(
                "no corpus script produced a valid submission; the warm start has nothing to learn"
            )
        rows = sft_rows(corpus, tasks, config, policy.tokenizer)
        _check_lengths(rows, policy.tokenizer, config.max_length)
        dataset = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])
        steps_per_epoch = math.ceil(len(rows) / config.batch_size)
        run_log = RunLogCallback(
            writer,
            progress and config.logging.progress,
            steps_per_epoch * config.epochs,
            desc="SFT",
            shown=(("loss", "loss"),),
        )

        class _StageMarker(TrainerCallback):
            # The checkpoint is complete once the marker is written (after TRL saved everything).
            def on_save(self, args, state, control, **kwargs):
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if folder.is_dir():
                    write_stage_marker(folder, stage="sft", step=state.global_step)

        from trl import SFTTrainer

        trainer = SFTTrainer(
            model=policy.model,
            args=_sft_args(config, out, device, steps_per_epoch),
            train_dataset=dataset,
            processing_class=policy.tokenizer,
            peft_config=peft_config(config, policy.model),
            callbacks=[run_log, _StageMarker()],
        )
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, TensorBoardCallback):
                callback.logging_dir = str(out / "tensorboard")
        checkpoint = str(run_dir.checkpoint) if run_dir.checkpoint is not None else None
        trainer.train(resume_from_checkpoint=checkpoint)
        final = out / "final"
        model: Any = trainer.model  # the trained model (a peft model with LoRA)
        if config.lora.enabled:
            model = model.merge_and_unload()  # a plain model: every loader takes it
        model.save_pretrained(final)
        policy.tokenizer.save_pretrained(final)
        from wmrl.autoresearch.training.data import recorded_train_tasks

        lineage = [*recorded_train_tasks(config.model.path), *summary["tasks"]]
        (final / "wmrl_policy.json").write_text(
            json.dumps(
                {
                    "base": config.model.path,
                    "stage": "sft",
                    "lora": False,
                    "merged_lora": config.lora.enabled,
                    "train_tasks": list(dict.fromkeys(lineage)),
                    "corpus": summary,
                },
                indent=2,
            )
        )
        if config.logging.plots:
            plot_run(out, reward_key="loss")
            plots = out / "plots"
            if (plots / "reward.png").is_file():
                (plots / "reward.png").replace(plots / "loss.png")
    except KeyboardInterrupt:
        writer.close()
        if (trainer is None or trainer.state.global_step == 0) and run_dir.abandon():
            raise Interrupted("interrupted before the first step completed; nothing was kept") from None
        raise Interrupted(f"interrupted; continue with: {run_dir.resume_hint}") from None
    except BaseException:
        writer.close()
        if trainer is None or trainer.state.global_step == 0:
            run_dir.abandon()
        raise
    writer.close()
    losses = [r["loss"] for r in read_metrics(out) if r.get("loss") is not None]
    wall = time.perf_counter() - started
    result = SFTResult(
        run_dir=out,
        final_model=final,
        corpus=summary,
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        wall_s=wall,
    )
    checkpoints = list_checkpoints(out, STAGE_FILE)
    (out / "run_summary.json").write_text(
        json.dumps(
            {
                "wall_s": wall,
                "final_model": str(final),
                "last_checkpoint": str(checkpoints[-1]) if checkpoints else None,
                "loss_first": result.loss_first,
                "loss_last": result.loss_last,
                "corpus": summary,
            },
            indent=2,
        )
    )
    return result


def _anchor_corpus(runs, tasks):
    """``(corpus, dropped)``: the recorded anchor pairs of ``runs`` as a world-model corpus, each
    (task, script, outcome) once, and how many repeats were dropped; refuses any pair whose task is
    not one of the training ``tasks`` (``(ref, Task)`` pairs; held-out tasks are refused before)."""
    from wmrl.autoresearch.training.anchor_pairs import read_anchor_pairs, unique_pairs
    from wmrl.autoresearch.training.corpus import Corpus
    from wmrl.core.errors import UserError

    try:
        examples, duplicates = unique_pairs(read_anchor_pairs(runs))
    except FileNotFoundError as err:
        raise UserError(str(err)) from None
    known = {task.id for _, task in tasks}
    foreign = sorted({e.task_id for e in examples} - known)
    if foreign:
        raise UserError(
            f"corpus.anchor_runs hold pairs of tasks that are not training tasks of this stage: {foreign} "
            "(set corpus.ids to the runs' training tasks; held-out tasks are never trained on)"
        )
    if not examples:
        raise UserError(f"corpus.anchor_runs {list(runs)} recorded no executed pairs")
    statuses: dict[str, int] = {}
    for example in examples:
        statuses[example.status] = statuses.get(example.status, 0) + 1
    corpus = Corpus(examples=examples, statuses=statuses, tasks=sorted({e.task_id for e in examples}))
    return corpus, duplicates


def _reusable_corpus(run_dir: RunDirectory, config: WarmStartConfig) -> bool:
    """A resumed (or restarted) run reuses its executed corpus when the settings it depends on match."""
    out = run_dir.path
    if run_dir.checkpoint is None and not run_dir.restarted:
        return False
    files = (out / "corpus.jsonl", out / "corpus_report.json", out / "config.json")
    if not all(f.is_file() for f in files):
        return False
    saved = json.loads((out / "config.json").read_text())
    current = config.to_dict()
    return all(saved.get(k) == current.get(k) for k in ("corpus", "sandbox"))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def run_sft_from_cli(config: WarmStartConfig, run_dir: RunDirectory, *, progress: bool) -> list[str]:
    """``wmrl train autoresearch-sft``: the warm start, then the lines to print."""
    result = run_sft(config, run_dir, progress=progress)
    return [
        f"[wmrl] run directory: {result.run_dir} ({result.wall_s:.0f} s)",
        f"[wmrl]   loss: {_fmt(result.loss_first)} -> {_fmt(result.loss_last)}; corpus: {result.run_dir / 'corpus.jsonl'}",
        f"[wmrl]   warm-started policy: {result.final_model}",
        f"[wmrl]   train from it: wmrl train autoresearch model.path={result.final_model} "
        f"tasks.action={config.corpus.action}",
        f"[wmrl]   evaluate it: wmrl eval autoresearch --model {result.final_model}",
    ]
