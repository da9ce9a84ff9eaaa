"""``WMRLGRPOTrainer``: TRL's GRPO with the reward side of :class:`~wmrl.core.pipeline.RewardPipeline`.

Domain-neutral: it knows prompts, completions and the two injected reward sources, nothing about
tasks or sandboxes. A domain configures it with an *item function* ``(completion text, dataset row)
-> item`` (what both sources grade, or an :class:`~wmrl.core.rollouts.Exact`), and for K-turn
episodes an *episode factory* (:mod:`.multiturn`).

Per generation batch (one corrector step), on every rank:

1. **plan** (before generation, from keys only): group keys are ``<prompt id>@<global step>``,
   gathered from every rank so the plan is identical everywhere; ``pipeline.plan`` picks anchors;
2. **generate**: TRL's own generation (K = 1), or the K-turn rollout (:mod:`.multiturn`), in which
   anchor groups see real feedback each turn and world-model groups the world model's (with
   asynchronous anchors every trajectory sees the world model's, and the executed ones are run for
   real afterwards, off the critical path: :mod:`.multiturn`);
3. **score** (``_calculate_rewards``): each rank grades its local completions through
   ``pipeline.score`` (world model and real execution concurrently); the (world model, variance,
   real) columns are gathered to the whole batch;
4. **correct**: ``pipeline.correct`` on the gathered batch, identically on every rank; calibrated
   rewards (NaN = unknown) go back to TRL (its reward metrics describe them);
5. **advantages** (``_generate_and_score_completions``): TRL's own advantages are replaced by the
   corrector's (fusion weights on the *advantages*); unknown rollouts get advantage 0 AND leave the
   loss mask. ``wmrl/*``, ``cost/*`` and ``anchor_status/*`` join TRL's metrics; the completions
   table gets the world model's raw and calibrated scores and the real result beside each completion.

The correction's state and every rank's ledger are written into every checkpoint folder (the files
of :mod:`wmrl.core.pipeline`) and restored by ``train(resume_from_checkpoint=...)``. The first
Ctrl-C finishes the step in progress, saves a checkpoint and stops (:attr:`stopped_early`).

TRL's private methods are overridden here (``_calculate_rewards``, ``_generate_and_score_completions``,
``_generate``, ``_generate_single_turn`` (one prefill per group, :mod:`.shared_prefill`), ``_prepare_inputs``, ``_save_checkpoint``, ``_load_optimizer_and_scheduler``); they
are those of TRL 1.16 (:data:`SUPPORTED_TRL`; the trainer refuses another minor version).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
import trl
from accelerate.utils import gather_object
from transformers import PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

# The defining modules, not trl's lazy top-level re-exports, which mypy cannot see.
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from wmrl.core.completions import CompletionsTable, completion_rows, format_sample
from wmrl.core.config import require_int
from wmrl.core.corrector import Correction, Corrector, CorrectorConfig, Plan
from wmrl.core.engines.trl.late_rows import append_rows, keep_rows, live_rows, padded_rows
from wmrl.core.engines.trl.multiturn import (
    EpisodeFactory,
    TurnContext,
    execute_trajectories,
    multi_turn_rollout,
)
from wmrl.core.engines.trl.rank_failures import fail_together
from wmrl.core.engines.trl.shared_prefill import equal_runs, generate_shared
from wmrl.core.engines.trl.vllm_http import VLLMHTTPConfig, VLLMHTTPGeneration
from wmrl.core.interrupt import GracefulStop
from wmrl.core.late import InFlight, refuse_asynchrony, running_keys
from wmrl.core.ledger import CostLedger
from wmrl.core.modes import Mode
from wmrl.core.pipeline import RewardPipeline
from wmrl.core.rollouts import needs_of
from wmrl.core.sources import RewardSource

__all__ = ["SUPPORTED_TRL", "ItemFn", "WMRLGRPOTrainer", "completion_text", "wmrl_reward"]

#: The TRL minor version whose private methods this trainer overrides (pyproject pins the same).
SUPPORTED_TRL = "1.16"

#: ``(completion text, dataset row) -> item or Exact``.
ItemFn = Callable[[str, Mapping[str, Any]], Any]


def completion_text(completion: Any) -> str:
    """The generated text of a TRL completion (a string, or a list of chat messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        content = completion[-1].get("content", "")
        if isinstance(content, str):
            return content
        # typed content blocks: keep the text parts
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise TypeError(f"cannot read the text of a completion of type {type(completion).__name__}")


def _text_item(text: str, row: Mapping[str, Any]) -> str:
    return text


def wmrl_reward(**_: Any) -> list[float | None]:
    """The reward function TRL sees. Never called: ``WMRLGRPOTrainer._calculate_rewards`` replaces
    TRL's reward loop (it needs the whole gathered batch and both streams at once)."""
    raise RuntimeError(
        "wmrl_reward is computed by WMRLGRPOTrainer._calculate_rewards; it is not a stand-alone TRL reward function"
    )


def _check_trl_version() -> None:
    installed = ".".join(trl.__version__.split(".")[:2])
    if installed != SUPPORTED_TRL:
        raise ImportError(
            f"WMRLGRPOTrainer overrides private methods of TRL {SUPPORTED_TRL}; TRL {trl.__version__} is installed "
            f"(pip install 'trl=={SUPPORTED_TRL}.*')"
        )


@dataclass
class _Step:
    """What one generation batch knows between planning, scoring and the advantages."""

    group_keys: list[str]
    group_tasks: list[str] | None
    n_local: int
    inputs: list[dict[str, Any]]
    plan: Plan | None = None
    correction: Correction | None = None
    columns: npt.NDArray[Any] | None = None  # gathered (B, 3): world model, variance, real
    seconds: dict[str, float] = field(default_factory=dict)
    #: outcomes of this rank's real executions (anchor rollouts; every turn when K > 1)
    statuses: list[str] = field(default_factory=list)
    #: per local row the outcome label of the stream that trains it
    row_statuses: list[str | None] = field(default_factory=list)
    #: this rank's real-execution grades (for ``real_metrics``)
    real_grades: list[Any] = field(default_factory=list)
    #: asynchronous anchors: this batch's executions in flight (a Future of this rank's Scores), whether
    #: it drains, its items and gathered solution keys (kept for the landing), what landed at it
    pending: Any = None
    drain: bool = False
    items: list[Any] = field(default_factory=list)
    solution_keys: npt.NDArray[Any] | None = None
    late_metrics: dict[str, float | None] = field(default_factory=dict)
    late_rows: list[tuple[dict[str, Any], npt.NDArray[Any]]] = field(default_factory=list)
    #: whether what is due at this batch has landed already (a draining K-turn batch lands before its rollout)
    landed: bool = False
    #: the K-turn rollout's context (asynchronous anchors: its turns' items and episodes, for the execution)
    turns_context: TurnContext | None = None

    def add_time(self, seconds: Mapping[str, float]) -> None:
        for name, value in seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + value


class _OptimizerTimer(TrainerCallback):
    """Books the optimiser step (between ``on_pre_optimizer_step`` and ``on_optimizer_step``) to ``update``."""

    def __init__(self, trainer: WMRLGRPOTrainer) -> None:
        self.trainer = trainer
        self.start: float | None = None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = time.perf_counter()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.start is not None:
            self.trainer.ledger.add("update", time.perf_counter() - self.start)
            self.start = None


class _StopOnRequest(TrainerCallback):
    """After a step, if Ctrl-C was pressed on any rank: save a checkpoint and stop training."""

    def __init__(self, trainer: WMRLGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        stop = self.trainer._stop
        requested = stop is not None and stop.requested
        if self.trainer.accelerator.num_processes > 1:  # every rank must stop at the same step
            requested = any(gather_object([requested]))
        if requested:
            self.trainer.stopped_early = True
            control.should_save = True
            control.should_training_stop = True
        return control


class WMRLGRPOTrainer(GRPOTrainer):
    """TRL ``GRPOTrainer`` whose rewards and advantages come from a :class:`~wmrl.core.pipeline.RewardPipeline`.

    Args:
        model: the policy (a model or a model spec TRL accepts).
        args: TRL ``GRPOConfig``. ``multi_objective_aggregation`` must be ``sum_then_normalize``;
            evaluation during training is not supported.
        train_dataset: rows with ``prompt`` and a prompt-id column (``prompt_id_column``: one id per
            distinct prompt), plus whatever the item function reads.
        world_model / anchor: the two reward sources (see :class:`~wmrl.core.pipeline.RewardPipeline`).
        mode: ``real`` | ``world_model`` | ``wmrl``.
        corrector: a ``CorrectorConfig`` (the mode's preset applied on top) or a built ``Corrector``.
        item_fn: ``(completion text, row) -> item | Exact`` (default: the text itself).
        episodes: for K-turn episodes, ``(prompt, row) -> episode`` (:mod:`.multiturn`); ``turns > 1``
            needs it, and sources that give feedback (``needs.feedback``).
        turns: attempts per episode (K).
        ledger: the cost ledger (default: accelerator counts from the training device).
        prompt_id_column / task_column: dataset columns of the prompt id and the task key (the
            scheduler stratifies by task; ``None``: no strata).
        statuses: the outcome labels real execution can report; each is logged as an
            ``anchor_status/<label>`` share every step (labels not listed appear when seen).
        real_metrics: ``(grades of the step's real executions, every rank's) -> {name: value}``, the
            domain's own measurements of what really happened (e.g. the mean leaderboard position of
            the executed rollouts), logged every step beside ``anchor_status/*``; ``None`` values are
            not logged (unknown is not zero).
        completions: write each batch's completions table here (``None``: not written).
        completions_to_print: rows of it printed per step (main process).
        solution_key: ``item -> str | None``, which rollouts are the same solution (see
            :class:`~wmrl.core.pipeline.RewardPipeline`).
        metrics_fn: ``() -> {name: value}`` logged every step beside the corrector's (e.g. the real-
            execution pool's ``pool/*`` counters); each rank logs its own process's.
        processing_class, callbacks, peft_config: as in TRL.
        vllm_http: generate through a stock vLLM server, the policy's weights pushed to it by file
            every step (:mod:`.vllm_http`; works on a CPU and with vLLM in another environment);
            leave TRL's ``use_vllm`` off: this takes its place.
    """

    # TRL types these as the base Trainer's; a GRPO trainer always has its GRPOConfig and a group size
    args: GRPOConfig
    num_generations: int

    def __init__(
        self,
        model: Any,
        *,
        args: Any,
        train_dataset: Any,
        world_model: RewardSource | None = None,
        anchor: RewardSource | None = None,
        mode: Mode | str = Mode.WMRL,
        corrector: CorrectorConfig | Corrector | None = None,
        item_fn: ItemFn | None = None,
        episodes: EpisodeFactory | None = None,
        turns: int = 1,
        ledger: CostLedger | None = None,
        prompt_id_column: str = "prompt_id",
        task_column: str | None = "task_id",
        statuses: Sequence[str] = (),
        real_metrics: Callable[[Sequence[Any]], Mapping[str, float | None]] | None = None,
        completions: CompletionsTable | None = None,
        completions_to_print: int = 0,
        solution_key: Callable[[Any], str | None] | None = None,
        metrics_fn: Callable[[], Mapping[str, float | None]] | None = None,
        processing_class: Any = None,
        callbacks: Sequence[TrainerCallback] | None = None,
        peft_config: Any = None,
        vllm_http: VLLMHTTPConfig | None = None,
    ) -> None:
        _check_trl_version()
        if vllm_http is not None and getattr(args, "use_vllm", False):
            raise ValueError("vllm_http takes the place of TRL's vLLM modes: leave use_vllm false")
        if getattr(args, "multi_objective_aggregation", "sum_then_normalize") == "normalize_then_sum":
            raise ValueError(
                "multi_objective_aggregation='normalize_then_sum' is not supported by WMRLGRPOTrainer: it "
                "re-normalises each reward function separately and across the batch, which would undo the "
                "corrector's per-group advantages and fusion weights; use 'sum_then_normalize' (the default)"
            )
        if str(getattr(args, "eval_strategy", "no")) not in ("no", "IntervalStrategy.NO"):
            raise ValueError(
                "evaluation inside GRPO training is not supported by WMRLGRPOTrainer (the corrector would "
                "treat eval batches as training steps); set eval_strategy='no' and evaluate checkpoints"
            )
        # TRL's GRPOConfig accepts None, but its loss normalisation divides by it, and vLLM generation and
        # K-turn turns cap every reply at it
        require_int(getattr(args, "max_completion_length", 512), "max_completion_length")
        train_dataset_columns = getattr(train_dataset, "column_names", None)
        if train_dataset_columns is not None and prompt_id_column not in train_dataset_columns:
            raise ValueError(
                f"the training dataset has no {prompt_id_column!r} column: every row needs a prompt id "
                "(anchor groups are chosen from it, identically on every rank)"
            )
        self.pipeline = RewardPipeline(
            world_model, anchor, mode=mode, corrector=corrector, ledger=ledger, solution_key=solution_key
        )
        require_int(turns, "turns")
        multi_turn = turns > 1
        if multi_turn:
            self._check_multi_turn(episodes)
        self.mode = self.pipeline.mode
        self.turns = turns
        self.episodes = episodes
        self.item_fn = item_fn or _text_item
        self.prompt_id_column = prompt_id_column
        self.task_column = task_column
        self.statuses = tuple(dict.fromkeys([*statuses, "unknown"]))  # unknown: a source without labels
        self.real_metrics = real_metrics
        self.completions = completions
        self.completions_to_print = completions_to_print
        self.metrics_fn = metrics_fn
        self.stopped_early = False
        #: called with the phase of the step in progress ("generation", "scoring", "update"), for progress
        self.on_phase: Callable[[str], None] = lambda name: None
        self._stop: GracefulStop | None = None
        self._wmrl_step: _Step | None = None
        self._prepare_seconds = 0.0
        super().__init__(
            model=model,
            reward_funcs=[wmrl_reward],
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            callbacks=list(callbacks) if callbacks else None,
            peft_config=peft_config,
            rollout_func=_rollout_entry if multi_turn else None,
        )
        assert self.args.generation_batch_size is not None  # GRPOConfig.__post_init__ sets it
        prompts_needed = self.args.generation_batch_size // self.num_generations
        if hasattr(train_dataset, "__len__") and len(train_dataset) < prompts_needed:
            # TRL's sampler drops an incomplete batch: too few prompts and training stops at step 0, silently.
            raise ValueError(
                f"one generation batch needs {prompts_needed} distinct prompts (per-device batch "
                f"{self.args.per_device_train_batch_size} x {self.accelerator.num_processes} processes x "
                f"{self.args.steps_per_generation} steps per generation / {self.num_generations} rollouts), "
                f"but the training dataset has {len(train_dataset)}: add prompts or shrink the batch"
            )
        if self.num_generations < 2:
            raise ValueError(
                f"GRPO groups need at least 2 rollouts; num_generations is {self.num_generations}"
            )
        if self.accelerator.device.type == "cpu" and (args.bf16 or args.gradient_checkpointing):
            warnings.warn(
                "GRPO on a CPU with bf16 or gradient checkpointing runs several times slower; pass "
                "GRPOConfig(use_cpu=True, bf16=False, gradient_checkpointing=False)",
                stacklevel=2,
            )
        if ledger is None:
            # This process's accelerators (1 per rank; all visible GPUs for a single-process run).
            held = float(max(self.args.n_gpu, 1)) if self.accelerator.device.type == "cuda" else 0.0
            self.pipeline.ledger = CostLedger(
                {"generation": held, "update": held, "world_model": held, "anchor": 0.0, "anchor_wait": held}
            )
        if vllm_http is not None:
            self._use_vllm_http(vllm_http)
        self.add_callback(_OptimizerTimer(self))
        self.add_callback(_StopOnRequest(self))
        if self.pipeline.asynchrony.enabled:
            self._check_asynchrony()

    def _use_vllm_http(self, config: VLLMHTTPConfig) -> None:
        """Generate through a stock vLLM server: TRL's vLLM code paths (weight sync before a step's
        generation, the sampled tokens' log-probs into the importance-sampling correction) run with
        :class:`~.vllm_http.VLLMHTTPGeneration` in the place of TRL's ``VLLMGeneration``."""
        if self.accelerator.num_processes > 1:
            raise ValueError(
                "vllm_http runs with one training process: several would each push their weights to the server"
            )
        if getattr(self.args, "generation_kwargs", None) or getattr(
            self.args, "vllm_structured_outputs_regex", None
        ):
            raise ValueError(
                "vllm_http does not pass generation_kwargs or vllm_structured_outputs_regex to the server; unset them"
            )
        # TRL checks this only when it builds its own vLLM generation (use_vllm at construction)
        if (
            self.loss_type == "vespo"
            and self.vllm_importance_sampling_correction
            and self.vllm_importance_sampling_mode not in ("token_truncate", "token_mask")
        ):
            raise ValueError(
                "loss_type='vespo' needs vllm_importance_sampling_mode 'token_truncate' or 'token_mask'; got "
                f"{self.vllm_importance_sampling_mode!r}"
            )
        # max_completion_length is TRL's copy of args.max_completion_length, an int >= 1 (checked in __init__)
        assert self.max_completion_length is not None
        # TRL declares the attribute as its own VLLMGeneration; this is a duck-typed stand-in for it
        self.vllm_generation = VLLMHTTPGeneration(  # type: ignore[assignment]
            config,
            self.model,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            max_completion_length=self.max_completion_length,
            step=lambda: self.state.global_step,
            importance_sampling=bool(self.vllm_importance_sampling_correction),
        )
        self.use_vllm = True
        self.vllm_mode = "server"
        self._last_loaded_step = -1

    def _check_asynchrony(self) -> None:
        """Refuse the settings asynchronous anchors cannot honour in TRL, each with its reason."""
        why = None
        args = self.args
        if self.turns > 1 and self.pipeline.world_model is None:
            why = (
                "asynchronous K-turn episodes show every trajectory the world model's feedback while its "
                "executions run, and mode 'real' has no world model"
            )
        elif self.loss_type not in ("dapo", "cispo", "vespo"):
            why = (
                f"loss_type={self.loss_type!r} normalises per micro-batch, so late rows would dilute the step's own; "
                "use a token-sum loss ('dapo', the default, 'cispo' or 'vespo')"
            )
        elif self.num_iterations != 1 or args.steps_per_generation != args.gradient_accumulation_steps:
            why = "a generation batch must be exactly one optimiser step (num_iterations=1, steps_per_generation = gradient_accumulation_steps)"
        elif str(args.save_strategy) not in ("no", "steps", "SaveStrategy.NO", "SaveStrategy.STEPS"):
            why = (
                "checkpoints drain the executions in flight at known steps: use save_strategy 'steps' or 'no'"
            )
        elif args.max_steps is None or args.max_steps <= 0:
            why = "the last step drains the executions in flight, so the run needs max_steps (a number of steps)"
        elif str(args.save_strategy) in ("steps", "SaveStrategy.STEPS") and not (
            float(args.save_steps) >= 1 and float(args.save_steps).is_integer()
        ):
            why = f"checkpoints drain at every save_steps-th step, which must be a whole number; got {args.save_steps}"
        elif self.accelerator.num_processes > 1 and self.pipeline.asynchrony.overdue_after_s is not None:
            why = (
                "overdue_after_s would let ranks disagree on what landed; leave it None on several processes"
            )
        if why is not None:
            refuse_asynchrony(self.pipeline.asynchrony, "the TRL engine here", why)

    def _drains_now(self) -> bool:
        """Whether the step being generated ends with a checkpoint (or the run): it waits for every
        execution in flight and runs its own synchronously, so no checkpoint holds executions in flight."""
        done = self.state.global_step + 1
        args = self.args
        saves = str(args.save_strategy) in ("steps", "SaveStrategy.STEPS") and args.save_steps
        every = int(args.save_steps) if saves and args.save_steps >= 1 else None
        return (every is not None and done % every == 0) or (args.max_steps > 0 and done >= args.max_steps)

    def _gathered_matrices(self, entry: InFlight, result: Any) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """A landed batch's real scores, every rank's rows gathered: ``(n_groups, G)`` real and repeats.

        The landed executions' outcomes join the batch being trained (its ``anchor_status/*`` and the
        domain's real metrics describe the executions it consumed)."""
        step = self._wmrl_step
        if step is not None:
            step.statuses.extend(result.statuses)
            step.real_grades.extend(g for g in result.real_grades if g is not None)
        local = np.stack(
            [np.asarray(result.real, dtype=np.float64), np.asarray(result.real_repeat, dtype=np.float64)],
            axis=1,
        )
        gathered = (
            self.accelerator.gather(torch.tensor(local, dtype=torch.float64, device=self.accelerator.device))
            .cpu()
            .numpy()
        )
        g = self.num_generations
        return gathered[:, 0].reshape(-1, g), gathered[:, 1].reshape(-1, g)

    def _land(
        self, drain: bool
    ) -> tuple[list[tuple[dict[str, Any], npt.NDArray[Any]]], dict[str, float | None]]:
        """Consume the executions due at this generation batch: their pairs feed the corrector, their rows
        come back with this rank's late advantages."""
        now = self.corrector.step_count
        if self._processes > 1:  # (one process may leave overdue executions behind: it waits in land_due)
            # every rank's due executions have landed, or all ranks stop: landing gathers their scores
            fail_together(
                lambda: self._await_due(None if drain else now), self._processes, "an anchor execution"
            )
        late, metrics = self.pipeline.land_due(None if drain else now, self._gathered_matrices)
        rows = []
        for entry in late:
            n = entry.groups["completion_ids"].shape[0]
            first = self.accelerator.process_index * n
            rows.append((entry.groups, np.asarray(entry.advantages).reshape(-1)[first : first + n]))
        return rows, metrics

    def _await_due(self, step: int | None) -> None:
        """Wait for this rank's executions due at ``step`` (all with ``None``), raising a failed one's error."""
        for entry in self.pipeline.in_flight.pending:
            if step is None or entry.due <= step:
                entry.future.result()

    @property
    def _processes(self) -> int:
        return int(self.accelerator.num_processes)

    def _check_multi_turn(self, episodes: EpisodeFactory | None) -> None:
        if episodes is None:
            raise ValueError(
                "turns > 1 needs an episode factory (episodes=...): how a reply and its outcome become the next turn"
            )
        sched = self.pipeline.corrector.config.scheduler
        if sched.active_share > 0:
            raise ValueError(
                "the active scheduler (scheduler.active_share > 0) is not supported with K > 1: it chooses whole "
                "groups by their world-model scores, which exist only turn by turn; set it to 0"
            )
        if sched.repeat_share > 0:
            raise ValueError(
                "repeated executions (scheduler.repeat_share > 0) are not supported with K > 1 (which of a "
                "trajectory's turns would be repeated?): set repeat_share to 0 or declare the anchor's noise"
            )
        for source in (self.pipeline.world_model, self.pipeline.anchor):
            if source is not None and not needs_of(source).feedback:
                raise ValueError(
                    f"K-turn episodes show each turn's outcome to the policy, but source {source.name!r} gives no "
                    "feedback (it must declare needs=RolloutNeeds(feedback=True) and fill Grade.feedback)"
                )

    # ------------------------------------------------------------------ shared state

    @property
    def corrector(self) -> Corrector:
        return self.pipeline.corrector

    @property
    def ledger(self) -> CostLedger:
        return self.pipeline.ledger

    @property
    def world_model(self) -> RewardSource | None:
        return self.pipeline.world_model

    @property
    def anchor(self) -> RewardSource | None:
        return self.pipeline.anchor

    # ------------------------------------------------------------------ planning

    def _local_keys(self, inputs: Sequence[dict[str, Any]]) -> tuple[list[str], list[str] | None]:
        keys, tasks = [], None
        for row in inputs:
            if self.prompt_id_column not in row:
                raise KeyError(f"a training row has no {self.prompt_id_column!r} column (the prompt id)")
            keys.append(str(row[self.prompt_id_column]))
        if self.task_column is not None and all(self.task_column in row for row in inputs):
            tasks = [str(row[self.task_column]) for row in inputs]
        return keys, tasks

    def _new_step(self, inputs: Sequence[dict[str, Any]]) -> _Step:
        """Gather the prompt ids of the whole generation batch and name its groups (same on every rank)."""
        keys, tasks = self._local_keys(inputs)
        all_keys = list(gather_object(keys))
        all_tasks = list(gather_object(tasks)) if tasks is not None else None
        g = self.num_generations
        if len(all_keys) % g:
            raise RuntimeError(
                f"the generation batch ({len(all_keys)} rows) is not a multiple of {g} rollouts"
            )
        group_keys: list[str] = []
        group_tasks: list[str] = []
        seen: dict[str, int] = {}
        for start in range(0, len(all_keys), g):
            block = set(all_keys[start : start + g])
            if len(block) != 1:
                raise RuntimeError(
                    f"rows {start}..{start + g - 1} of the generation batch belong to different prompts {sorted(block)}: "
                    "TRL's sampler keeps a group's copies contiguous; a custom sampler must too"
                )
            base = f"{all_keys[start]}@{self.state.global_step}"
            # the same prompt twice in one batch (a dataset smaller than the batch): keep keys unique
            count = seen.get(base, 0)
            seen[base] = count + 1
            group_keys.append(base if count == 0 else f"{base}#{count}")
            if all_tasks is not None:
                group_tasks.append(all_tasks[start])
        return _Step(group_keys, group_tasks if all_tasks is not None else None, len(inputs), list(inputs))

    def _plan(
        self,
        step: _Step,
        wm_scores: npt.NDArray[Any] | None = None,
        solution_keys: npt.NDArray[Any] | None = None,
    ) -> None:
        start = time.perf_counter()
        # executions in flight (asynchronous anchors; the same entries on every rank): the concurrency cap
        # counts them and their solutions are not chosen again. Nothing is in flight at lag 1 when a batch
        # plans (what is due lands first), so this binds from lag 2.
        in_flight = self.pipeline.in_flight
        step.plan = self.pipeline.plan(
            step.group_keys,
            step.group_tasks,
            wm_scores,
            in_flight.group_equivalents(self.num_generations),
            group_size=self.num_generations,
            solution_keys=solution_keys,
            in_flight_keys=in_flight.solution_keys(),
        )
        step.add_time({"corrector": time.perf_counter() - start})

    def _local(self, step: _Step, mask: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """This rank's rows of a ``(n_groups, G)`` mask of the gathered batch, flat ``(n_local,)``."""
        first = self.accelerator.process_index * step.n_local
        return np.asarray(mask).reshape(-1)[first : first + step.n_local]

    def local_anchor_rows(self, step: _Step) -> npt.NDArray[Any]:
        """bool ``(n_local,)``: which of this rank's rows are executed for real (``Plan.execute``)."""
        assert step.plan is not None
        return self._local(step, step.plan.execute_mask(self.num_generations))

    def local_repeat_rows(self, step: _Step) -> npt.NDArray[Any]:
        """bool ``(n_local,)``: which of this rank's rows are executed a second time (``Plan.repeat``)."""
        assert step.plan is not None
        return self._local(step, step.plan.repeat_mask(self.num_generations))

    # ------------------------------------------------------------------ TRL overrides

    def train(self, *args: Any, **kwargs: Any) -> Any:
        with GracefulStop() as stop:
            self._stop = stop
            try:
                return super().train(*args, **kwargs)
            finally:
                self._stop = None

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        start = time.perf_counter()
        try:
            return super()._prepare_inputs(generation_batch)
        finally:
            self._prepare_seconds += time.perf_counter() - start

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        start, before = time.perf_counter(), self._prepare_seconds
        self.on_phase("update")
        # transformers' Trainer is unannotated (a stub gap, not ours)
        output = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[no-untyped-call]
        # forward + backward of this micro-batch, without the generation/scoring done inside it
        self.ledger.add("update", time.perf_counter() - start - (self._prepare_seconds - before))
        return output

    def _generate(self, prompts: list[Any]) -> Any:
        if self.turns > 1:  # the rollout books generation and grading itself
            return super()._generate(prompts)
        start = time.perf_counter()
        output = super()._generate(prompts)
        elapsed = time.perf_counter() - start
        self.ledger.add("generation", elapsed, items=len(prompts))
        if self._wmrl_step is not None:
            self._wmrl_step.add_time({"generation": elapsed})
        return output

    def _generation_model(self) -> Any:
        """TRL's context for generating with the policy (its weights gathered and unwrapped)."""
        from trl.models.utils import unwrap_model_for_generation

        return unwrap_model_for_generation(
            self.model_wrapped,
            self.accelerator,
            gather_deepspeed3_params=self.args.ds3_gather_for_generation,
            generation_kwargs=self.generation_kwargs,
            # TrainingArguments.__post_init__ parses a JSON string into a dict; TRL passes it the same way
            gradient_checkpointing_kwargs=cast(
                "dict[str, Any] | None", self.args.gradient_checkpointing_kwargs
            ),
        )

    def _generate_single_turn(
        self,
        prompt_ids: Any,
        images: Any,
        multimodal_fields: Any,
        num_generations: Any,
        has_tool_images: bool = False,
    ) -> Any:
        """TRL's generation, with one prefill per group on the transformers path (:mod:`.shared_prefill`).

        Anything else (vLLM, images or other multimodal inputs, tools, DeepSpeed or FSDP, groups of
        unequal size) goes to TRL's own path unchanged."""
        runs = equal_runs(prompt_ids)
        plain = (
            self.use_vllm
            or images is not None
            or bool(multimodal_fields)
            or bool(getattr(self, "tools", None))
            or self.is_deepspeed_enabled
            or self.is_fsdp_enabled
            or runs is None
            or any(len(p) < 2 for p in prompt_ids)
        )
        if plain:
            # TRL's method is unannotated (a stub gap, not ours)
            return super()._generate_single_turn(  # type: ignore[no-untyped-call]
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        assert runs is not None  # runs is None makes the call plain (above)
        firsts = [sum(runs[:k]) for k in range(len(runs))]
        with (
            self._generation_model() as model,
            torch.no_grad(),
        ):
            out = generate_shared(
                model,
                [prompt_ids[k] for k in firsts],
                runs[0],
                self._text_tokenizer.pad_token_id,
                generation_config=self.generation_config,
            )
        width = max(len(p) for p in prompt_ids)
        stops = set(self.eos_token_ids)
        completion_ids = []
        for row in out[:, width:].tolist():  # through the first stop token, as TRL masks it
            end = next((k + 1 for k, token in enumerate(row) if token in stops), len(row))
            completion_ids.append(row[:end])
        return completion_ids, None

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        assert self.model is not None  # the trainer is built with a model (TRL's Trainer keeps it)
        if not self.model.training:
            raise RuntimeError(
                "WMRLGRPOTrainer does not evaluate during training; evaluate checkpoints instead"
            )
        step = self._new_step(inputs)
        self._wmrl_step = step
        asynchronous = self.pipeline.asynchrony.enabled
        if (
            asynchronous
        ):  # what is due lands after this batch is generated (_calculate_rewards), but see below
            step.drain = self._drains_now()
            if step.drain and self.turns > 1:
                # a draining K-turn batch runs synchronously (real feedback at every turn): everything in
                # flight lands first, then the plan its rollout needs is made
                step.late_rows, step.late_metrics = self._land(True)
                step.landed = True
                if not self.pipeline.plans_after_scoring:
                    self._plan(step)
        self.on_phase("generation")
        if not self.pipeline.plans_after_scoring and not asynchronous:
            self._plan(step)  # from keys only: before generation, so K-turn rollouts know their stream
        output = super()._generate_and_score_completions(inputs)
        late = step.late_rows
        correction = step.correction
        if correction is None:  # pragma: no cover - _calculate_rewards always sets it
            raise RuntimeError("the corrector did not run for this batch")
        original_tool_mask = output.get("tool_mask")  # TRL's own (tools), before unknown rows are masked
        self._apply_advantages(output, correction, step)
        if self.pipeline.asynchrony.enabled:
            # the normaliser of a synchronous step (every row of the batch, pending ones included), so that
            # this batch's rows train at the same scale and late rows add to them without diluting them
            base = (
                output["completion_mask"]
                if original_tool_mask is None
                else output["completion_mask"] * original_tool_mask
            )
            output["num_items_in_batch"] = self.accelerator.gather(base.sum()).sum()
        if step.pending is not None:
            self._hold(step, output, original_tool_mask)
        if step.late_metrics:
            step.late_metrics["async/in_flight_executions"] = float(self.pipeline.in_flight.executions())
            correction.metrics.update(step.late_metrics)
        self._log_step(correction, step)
        self._write_completions(step, output)
        if self.pipeline.asynchrony.enabled:
            multiple = self.args.steps_per_generation
            assert multiple is not None  # GRPOConfig.__post_init__ sets it
            output = append_rows(
                output,
                late or [],
                self._text_tokenizer.pad_token_id,
                multiple,
                total_rows=self._rows_every_rank(output, late or [], multiple),
            )
        return output

    def _rows_every_rank(self, output: dict[str, Any], late: list[Any], multiple: int) -> int | None:
        """The row count every rank's batch is padded to: the most any rank has with its late rows
        (TRL gathers per-row metrics across ranks, which needs as many rows on each); ``None`` on one
        process (its own count, which ``append_rows`` works out)."""
        if self._processes == 1:
            return None
        rows = padded_rows(output["advantages"].shape[0] + live_rows(late), multiple)
        return int(max(gather_object([rows])))

    def _hold(self, step: _Step, output: dict[str, Any], tool_mask: Any) -> None:
        """Keep this batch's rows and what it trained on until its executions land (``tool_mask``: TRL's
        own, without the masking of this batch's unknown rows, which the landing may make known)."""
        assert step.plan is not None and step.correction is not None and step.columns is not None
        rows = keep_rows(output)
        rows.pop("tool_mask", None)
        if tool_mask is not None:
            rows["tool_mask"] = tool_mask.detach().to("cpu", copy=True)
        g = self.num_generations
        wm, var = step.columns[:, 0].reshape(-1, g), step.columns[:, 1].reshape(-1, g)
        n_groups = wm.shape[0]
        executed = step.plan.execute_mask(g)
        keys = step.solution_keys
        self.pipeline.in_flight.add(
            InFlight(
                step=self.corrector.step_count - 1,
                due=self.corrector.step_count - 1 + self.pipeline.asynchrony.max_anchor_lag,
                plan=step.plan,
                groups=rows,
                items=step.items,
                cells=np.ones((n_groups, g), dtype=bool),
                wm=wm,
                wm_variance=var,
                rewards=step.correction.rewards.copy(),
                advantages=step.correction.advantages.copy(),
                solution_keys=keys,
                # a K-turn trajectory executes each of its turns
                executions=int(executed.sum() * self.turns + step.plan.repeat_mask(g).sum()),
                future=step.pending,
                keys=running_keys(keys, executed),
            )
        )

    def _apply_advantages(self, output: dict[str, Any], correction: Correction, step: _Step) -> None:
        flat = np.asarray(correction.advantages, dtype=np.float64).reshape(-1)
        n = step.n_local
        first = self.accelerator.process_index * n
        local = flat[first : first + n]
        unknown = np.isnan(local)
        device = output["advantages"].device
        output["advantages"] = torch.tensor(np.nan_to_num(local, nan=0.0), dtype=torch.float32, device=device)
        if np.isnan(flat).any():  # decided on the gathered batch: every rank takes this branch together
            keep = torch.tensor(~unknown, dtype=output["completion_mask"].dtype, device=device).unsqueeze(1)
            tool_mask = output.get("tool_mask")
            if tool_mask is None:
                tool_mask = torch.ones_like(output["completion_mask"])
            output["tool_mask"] = tool_mask * keep
            loss_mask = output["completion_mask"] * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        # TRL logged its own advantages before this override; show the ones actually used.
        logged = cast(deque[Any], self._logs["advantages"])  # TRL's _logs values are deques
        for _ in range(min(len(flat), len(logged))):
            logged.pop()
        logged.extend(np.nan_to_num(flat, nan=0.0).tolist())

    def _log_step(self, correction: Correction, step: _Step) -> None:
        metrics = self._metrics["train"]
        for key, value in correction.metrics.items():
            if value is None or (self.mode is Mode.REAL and key == "wmrl/unknown_world_model"):
                continue  # unknown is not zero; real mode has no world model to be unknown
            metrics[key].append(float(value))
        # Each rank timed and executed only its own slice; the log (written by rank 0) describes the
        # whole batch: seconds summed over ranks (rank-seconds), statuses of every rank's executions.
        seconds: dict[str, float] = {}
        statuses: list[str] = []
        grades: list[Any] = []
        shared = step.real_grades if self.real_metrics is not None else []
        for rank_seconds, rank_statuses, rank_grades in gather_object(
            [(step.seconds, step.statuses, shared)]
        ):
            for name, value in rank_seconds.items():
                seconds[name] = seconds.get(name, 0.0) + value
            statuses.extend(rank_statuses)
            grades.extend(rank_grades)
        if self.real_metrics is not None and grades:
            for key, value in self.real_metrics(grades).items():
                if value is not None:
                    metrics[key].append(float(value))
        for name in ("generation", "world_model", "anchor", "corrector"):
            if name in seconds:
                metrics[f"cost/{name}_s"].append(seconds[name])
        if statuses:  # every known status every time, so averages over logging windows stay shares
            for status in dict.fromkeys([*self.statuses, *statuses]):
                metrics[f"anchor_status/{status}"].append(statuses.count(status) / len(statuses))
        if self.metrics_fn is not None:
            for key, value in self.metrics_fn().items():
                if value is not None:  # unknown is not zero
                    metrics[key].append(float(value))

    def _write_completions(self, step: _Step, output: dict[str, Any]) -> None:
        if self.completions is None and not self.completions_to_print:
            return
        texts = self._text_tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
        prompts = [_prompt_text(row.get("prompt")) for row in step.inputs]
        gathered = gather_object([(prompts, texts, step.row_statuses)])
        if not self.accelerator.is_main_process:
            return
        all_prompts = [p for rank in gathered for p in rank[0]]
        all_texts = [t for rank in gathered for t in rank[1]]
        all_statuses = [s for rank in gathered for s in rank[2]]
        assert step.columns is not None  # _calculate_rewards sets it, with the correction
        g = self.num_generations
        wm, _, real = (step.columns[:, k].reshape(-1, g) for k in range(3))
        rows = completion_rows(
            self.state.global_step,
            step.group_keys,
            step.group_tasks,
            step.correction,
            wm,
            real,
            all_statuses,
            {"prompt": all_prompts, "completion": all_texts},
        )
        if self.completions is not None:
            self.completions.write(rows)
        if self.completions_to_print:
            print(format_sample(rows, self.completions_to_print, ["completion"]), flush=True)

    def _calculate_rewards(
        self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
    ) -> Any:
        step = self._wmrl_step
        if step is None:  # pragma: no cover - set by _generate_and_score_completions
            raise RuntimeError("_calculate_rewards called outside a WMRL generation batch")
        self.on_phase("scoring")
        device = self.accelerator.device
        if self.pipeline.asynchrony.enabled and not step.landed:
            # the executions due now landed while this batch was generated; then it is planned and scored
            step.late_rows, step.late_metrics = self._land(step.drain)
            if not self.pipeline.plans_after_scoring:
                self._plan(step)
        if self.turns > 1:
            local = np.array(
                [[_nan(row.get("wmrl_wm")), np.nan, _nan(row.get("wmrl_real")), np.nan] for row in inputs],
                dtype=np.float64,
            )
            step.row_statuses = [row.get("wmrl_status") for row in inputs]
            local_keys = None
        else:
            texts = [completion_text(c) for c in completions]
            items = [self.item_fn(text, row) for text, row in zip(texts, inputs, strict=True)]
            local_keys = self.pipeline.keys_of(items)
            local = self._score_single_turn(step, items, local_keys)
        gathered = (
            self.accelerator.gather(torch.tensor(local, dtype=torch.float64, device=device)).cpu().numpy()
        )
        step.columns = gathered
        g = self.num_generations
        wm, var, real, repeats = (gathered[:, k].reshape(-1, g) for k in range(4))
        keys = None
        if local_keys is not None:
            keys = np.array([k for rank in gather_object([local_keys]) for k in rank], dtype=object).reshape(
                -1, g
            )
        step.solution_keys = keys
        if self.turns > 1 and step.turns_context is not None and step.turns_context.shadow:
            self._submit_trajectories(step, wm)
        # every path has planned by now: _score_single_turn (one turn), turn_context's rows or choose,
        # or _submit_trajectories (K turns); _rollout_entry refuses a rollout without a way to plan
        assert step.plan is not None
        start = time.perf_counter()
        correction = self.pipeline.correct(
            step.plan, wm, real, var, rollouts=step.n_local, repeats=repeats, solution_keys=keys
        )
        step.add_time({"corrector": time.perf_counter() - start})
        step.correction = correction
        return torch.tensor(correction.rewards.reshape(-1, 1), dtype=torch.float32, device=device)

    def _score_single_turn(
        self, step: _Step, items: list[Any], keys: list[str | None] | None
    ) -> npt.NDArray[Any]:
        """``(n_local, 4)``: world-model score, its per-call variance, real score, repeated real score
        (NaN = unknown / not graded)."""
        in_flight = self.pipeline.asynchrony.enabled and not step.drain
        if step.plan is None or in_flight:
            # the world model scores first: plans that read its scores, or executions submitted after it
            scores = fail_together(
                lambda: self.pipeline.score(items, anchor=False), self._processes, "world-model scoring"
            )
            step.add_time(scores.seconds)
            if step.plan is None:
                column = torch.tensor(scores.wm, dtype=torch.float64, device=self.accelerator.device)
                all_wm = self.accelerator.gather(column).cpu().numpy().reshape(-1, self.num_generations)
                all_keys = None
                if keys is not None:
                    flat = [k for rank in gather_object([keys]) for k in rank]
                    all_keys = np.array(flat, dtype=object).reshape(-1, self.num_generations)
                self._plan(step, all_wm, all_keys)
            if self._submit(step, items):
                return self._graded_without_real(step, scores)
            rows, repeats = self.local_anchor_rows(step), self.local_repeat_rows(step)
            second = fail_together(
                lambda: self.pipeline.score(items, rows, world_model=False, repeat_rows=repeats),
                self._processes,
                "an anchor execution",
            )
            step.add_time(second.seconds)
            scores.take_real(second)
            scores.seconds = {}
        else:
            rows, repeats = self.local_anchor_rows(step), self.local_repeat_rows(step)
            scores = fail_together(
                lambda: self.pipeline.score(items, rows, repeat_rows=repeats), self._processes, "scoring"
            )
            step.add_time(scores.seconds)
        step.statuses.extend(scores.statuses)
        self.pipeline.learn(items, scores.real)  # a world model that learns from the run's outcomes
        anchor_rows = self.local_anchor_rows(step)
        step.real_grades.extend(
            g for g, a in zip(scores.real_grades, anchor_rows, strict=True) if a and g is not None
        )
        step.row_statuses = [
            (real.status if real is not None else None)
            if is_anchor
            else (wm.status if wm is not None else None)
            for is_anchor, wm, real in zip(anchor_rows, scores.wm_grades, scores.real_grades, strict=True)
        ]
        return scores.columns()

    def _submit(self, step: _Step, items: list[Any]) -> bool:
        """Asynchronous anchors: submit this batch's executions and do not wait (``False``: run them now,
        synchronous or a draining batch, or none planned on any rank)."""
        if not self.pipeline.asynchrony.enabled or step.drain:
            return False
        assert step.plan is not None
        if not step.plan.execute_mask(self.num_generations).any():
            return False
        rows, repeats = self.local_anchor_rows(step), self.local_repeat_rows(step)
        step.items = list(items)
        known = self.pipeline.known_items(
            items
        )  # now, on this thread: what the worker skips is deterministic
        step.pending = self.pipeline.in_flight.submit(
            lambda: self.pipeline.score(items, rows, world_model=False, repeat_rows=repeats, known=known)
        )
        return True

    def _submit_trajectories(self, step: _Step, wm: npt.NDArray[Any]) -> None:
        """Asynchronous K-turn: plan from the shadow rollout's trajectory scores (``wm``, ``(n_groups, G)``,
        every rank's) where the plan reads them, and submit the chosen trajectories' turns for execution."""
        ctx = step.turns_context
        assert ctx is not None
        if step.plan is None:
            self._plan(step, wm)
        assert step.plan is not None
        if not step.plan.execute_mask(self.num_generations).any():
            return
        rows = self.local_anchor_rows(step)
        turn_items, episodes = list(ctx.turn_items), list(ctx.kept)
        step.items = []  # the world model learns from single-turn executions only, as a synchronous K-turn step
        step.pending = self.pipeline.in_flight.submit(
            lambda: execute_trajectories(self.pipeline, turn_items, episodes, rows)
        )

    def _graded_without_real(self, step: _Step, scores: Any) -> npt.NDArray[Any]:
        """The batch's columns while its executions are in flight: the world model's, no real scores."""
        step.row_statuses = [wm.status if wm is not None else None for wm in scores.wm_grades]
        return cast("npt.NDArray[Any]", scores.columns())

    # ------------------------------------------------------------------ K-turn episodes

    def _choose_trajectories(self, step: _Step, local_wm: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """K-turn with plans that read world-model scores: the plan from every rank's first-turn scores
        (gathered, so every rank plans the same), this rank's executed rows back."""
        column = torch.tensor(np.asarray(local_wm, dtype=np.float64), device=self.accelerator.device)
        all_wm = self.accelerator.gather(column).cpu().numpy().reshape(-1, self.num_generations)
        self._plan(step, all_wm)
        return self.local_anchor_rows(step)

    def turn_context(self, step: _Step) -> TurnContext:
        """Everything the K-turn rollout of this rank's rows needs (see :mod:`.multiturn`).

        When the plan reads world-model scores (per-rollout anchors), ``anchor`` is ``None`` and
        ``choose`` makes it from the first turn's scores: the chosen trajectories are executed at
        every turn."""
        planned = step.plan is not None
        shadow = self.pipeline.asynchrony.enabled and not step.drain
        # K > 1 (the only rollout that asks for a context): __init__ checked the episode factory, and
        # max_completion_length is args.max_completion_length, an int >= 1 (checked in __init__)
        assert self.episodes is not None and self.max_completion_length is not None
        context = TurnContext(
            rows=step.inputs,
            anchor=self.local_anchor_rows(step) if planned and not shadow else None,
            choose=None if planned or shadow else (lambda wm: self._choose_trajectories(step, wm)),
            pipeline=self.pipeline,
            item_fn=self.item_fn,
            episodes=self.episodes,
            turns=self.turns,
            tokenizer=self._text_tokenizer,
            # GRPOConfig.__post_init__ parses a JSON string into a dict
            template_kwargs=dict(cast("dict[str, Any]", self.chat_template_kwargs or {})),
            generate=self._generate_tokens_vllm if self.use_vllm else self._generate_tokens,
            max_new_tokens=self.max_completion_length,
            stop_token_ids=set(self.eos_token_ids),
            seconds=step.add_time,
            statuses=step.statuses,
            sampling_logprobs=bool(self.use_vllm),
            real_grades=step.real_grades,
            shadow=shadow,
            processes=self._processes,
        )
        step.turns_context = context
        return context

    def _generate_tokens_vllm(
        self, contexts: list[list[int]], max_new_tokens: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One reply per context from TRL's vLLM (colocate or server; TRL synced the weights before the
        rollout): the token ids through the first stop token and vLLM's log-prob of each.

        vLLM caps replies at ``max_completion_length``, which is what K-turn episodes use per turn.
        In server mode this is a collective (every rank calls it once per turn, K times)."""
        if max_new_tokens != self.max_completion_length:
            raise ValueError(
                "vLLM generation caps replies at max_completion_length; K-turn turns use that cap"
            )
        _, completion_ids, logprobs, _ = self.vllm_generation.generate(
            prompts=contexts, images=None, num_generations=1
        )
        stops = set(self.eos_token_ids)
        replies, reply_logprobs = [], []
        for ids, lps in zip(completion_ids, logprobs, strict=True):
            ids = list(ids)
            end = next((k + 1 for k, token in enumerate(ids) if token in stops), len(ids))
            replies.append(ids[:end])
            # vLLM gives per token a list (sampled token first); None where vLLM had no number (NaN)
            reply_logprobs.append([float("nan") if lp[0] is None else float(lp[0]) for lp in lps[:end]])
        return replies, reply_logprobs

    @property
    def _text_tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer (TRL's ``_tokenizer``: the processing class, or a processor's
        tokenizer), with which WMRL's rollouts pad, decode and render chat turns."""
        tokenizer = getattr(self, "_tokenizer", self.processing_class)
        if not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise TypeError(
                f"WMRLGRPOTrainer needs a tokenizer (or a processor with one) as processing_class; got "
                f"{type(tokenizer).__name__}"
            )
        return tokenizer

    def _generate_tokens(self, contexts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Sample one reply per context with the policy; the new token ids through the first stop token."""
        import copy

        tokenizer = self._text_tokenizer
        pad = tokenizer.pad_token_id
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for r, context in enumerate(contexts):
            ids[r, width - len(context) :] = torch.tensor(context)
            mask[r, width - len(context) :] = 1
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens = max_new_tokens
        with (
            self._generation_model() as model,
            torch.no_grad(),
        ):
            device = self.accelerator.device
            out = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
            )
        stops = set(self.eos_token_ids)
        replies = []
        for row in out[:, width:].tolist():
            reply = []
            for token in row:
                reply.append(token)
                if token in stops:
                    break
            while reply and reply[-1] == pad and pad not in stops:
                reply.pop()
            replies.append(reply)
        return replies

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        if self.pipeline.in_flight.pending or self.pipeline.in_flight.overdue:
            # a save between the drained steps (a stop): what is in flight lands for calibration only
            self.pipeline.drain(self._gathered_matrices)
        # transformers' Trainer is unannotated (a stub gap, not ours)
        super()._save_checkpoint(model, trial)  # type: ignore[no-untyped-call]
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        self.save_wmrl_state(folder)  # every rank takes part (the ledgers are gathered)

    def merged_ledger(self) -> CostLedger:
        """The whole run's cost ledger: every rank's, summed (see :meth:`CostLedger.merged`).

        A collective: call it on every rank (a single process gets a copy of its own ledger).
        """
        return CostLedger.merged(gather_object([self.ledger.state_dict()]))

    def save_wmrl_state(self, folder: str | os.PathLike[str]) -> None:
        """Write the correction's state and every rank's ledger into ``folder`` (a collective).

        The processes that save TRL's checkpoint (``args.should_save``: the main one, or each node's
        with ``save_on_each_node``) write it.
        """
        ranks = gather_object([self.ledger.state_dict()])
        if self.args.should_save:
            self.pipeline.save(folder, ranks)

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        # transformers' Trainer is unannotated (a stub gap, not ours)
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[no-untyped-call]
        if checkpoint is not None:
            self.load_wmrl_state(checkpoint)

    def load_wmrl_state(self, folder: str | os.PathLike[str]) -> None:
        """Restore the correction and this rank's ledger from a checkpoint folder."""
        self.pipeline.load(folder, self.accelerator.process_index, self.accelerator.num_processes)


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _prompt_text(prompt: Any) -> str:
    """The last user message of a conversational prompt, or the prompt itself."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and isinstance(prompt[-1], Mapping):
        return str(prompt[-1].get("content", ""))
    return str(prompt)


def _rollout_entry(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
    """TRL's ``rollout_func`` for K > 1 (TRL calls it with the trainer)."""
    wmrl = cast(WMRLGRPOTrainer, trainer)  # only WMRLGRPOTrainer hands this function to TRL
    step = wmrl._wmrl_step
    planned_late = (
        step is not None
        and step.plan is None
        and (wmrl.pipeline.plans_after_scoring or (wmrl.pipeline.asynchrony.enabled and not step.drain))
    )
    if step is None or (step.plan is None and not planned_late) or len(step.inputs) != len(prompts):
        raise RuntimeError("the K-turn rollout runs inside WMRLGRPOTrainer's generation step only")
    return multi_turn_rollout(wmrl.turn_context(step), prompts)
