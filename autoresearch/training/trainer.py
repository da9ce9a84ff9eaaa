"""``WMRLGRPOTrainer``: TRL's GRPO with the core corrector deciding rewards and advantages.

Per generation batch (one corrector step), on every rank:

1. **plan** (before generation; from keys only): group keys are ``<prompt id>@<global step>``
   (gathered from every rank, so the plan is identical everywhere without communication beyond the
   gather); ``corrector.plan`` picks the anchor groups;
2. **generate**: TRL's own generation (K = 1), or the K-turn rollout (:mod:`.rollout`), in which
   anchor groups see real execution feedback each turn and world-model groups the world model's
   predicted feedback;
3. **score** (``_calculate_rewards``): each rank turns its local completions into items; the
   world model scores every completion while the sandbox executes the anchor groups' completions,
   CONCURRENTLY (two threads); the (world model, real, variance) columns are gathered to the whole
   batch;
4. **correct**: ``corrector.correct`` on the gathered batch, identically on every rank: calibrated
   rewards (NaN = unknown) go back to TRL (its reward metrics describe them);
5. **advantages** (``_generate_and_score_completions``): TRL's own advantages are replaced by the
   corrector's (fusion weights applied to the *advantages*, never the rewards), this rank's slice;
   unknown rollouts get advantage 0 AND are removed from the loss mask, so they carry no gradient
   and do not dilute the token normaliser. The ``wmrl/*`` metrics join TRL's metrics.

Modes: ``real`` (every group executed; the world model is never called), ``world_model`` (raw world
model only; nothing is executed), ``wmrl``. The corrector's state and the cost ledger are written
into every checkpoint folder and restored by ``trainer.train(resume_from_checkpoint=...)``.

TRL's private methods are overridden here (``_calculate_rewards``, ``_generate_and_score_completions``,
``_generate``, ``_save_checkpoint``, ``_load_optimizer_and_scheduler``); they are checked against
TRL 1.16 by the tests.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from wmrl.autoresearch.agent.episode import EpisodeConfig
from wmrl.autoresearch.grading.ladder import STATUSES as LADDER_STATUSES
from wmrl.autoresearch.training.streams import (
    Exact,
    ItemFn,
    completion_text,
    execution_turns,
    solution_items,
    world_model_turns,
)
from wmrl.core.corrector import Correction, Corrector, Plan
from wmrl.core.ledger import CostLedger
from wmrl.core.sources import Grade, RewardSource, check_pair, check_source, collect_grades

__all__ = [
    "CORRECTOR_FILE",
    "LEDGER_FILE",
    "MODES",
    "WMRLGRPOTrainer",
    "check_mode",
    "wmrl_reward",
]

MODES = ("real", "world_model", "wmrl")
#: Outcomes of real executions logged as ``anchor_status/<status>`` shares (the grading ladder's
#: statuses, ``malformed`` for replies without a script, ``unknown`` for a source without statuses).
ANCHOR_STATUSES = (*LADDER_STATUSES, "malformed", "unknown")
#: File names inside every checkpoint folder.
CORRECTOR_FILE = "wmrl_corrector.json"
LEDGER_FILE = "wmrl_ledger.json"


def wmrl_reward(**_: Any) -> list[float]:
    """The reward function TRL sees. Never called: ``WMRLGRPOTrainer._calculate_rewards`` replaces
    TRL's reward loop (it needs the whole gathered batch and both streams at once)."""
    raise RuntimeError(
        "wmrl_reward is computed by WMRLGRPOTrainer._calculate_rewards; it is not a stand-alone TRL reward function"
    )


def check_mode(mode: str, corrector: Corrector) -> None:
    """Reject a corrector whose configuration contradicts the mode (build it with ``CorrectorConfig.preset(mode)``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    sched = corrector.config.scheduler
    if mode == "real" and sched.fraction != 1.0:
        raise ValueError(
            f"mode 'real' executes every group, but the corrector's scheduler.fraction is {sched.fraction}: "
            "build it with CorrectorConfig.preset('real')"
        )
    if mode == "world_model" and (sched.fraction != 0.0 or sched.floor != 0):
        raise ValueError(
            "mode 'world_model' executes nothing, but the corrector schedules anchors "
            f"(fraction {sched.fraction}, floor {sched.floor}): build it with CorrectorConfig.preset('world_model')"
        )
    if mode == "wmrl" and sched.fraction == 0.0 and sched.floor == 0:
        raise ValueError(
            "mode 'wmrl' needs an anchor stream, but scheduler.fraction and scheduler.floor are both 0 "
            "(that is mode 'world_model')"
        )
    if mode == "wmrl" and sched.fraction == 1.0:
        raise ValueError("mode 'wmrl' with scheduler.fraction 1.0 executes every group: use mode 'real'")


@dataclass
class _Step:
    """What one generation batch knows between planning, scoring and the advantages."""

    group_keys: list[str]
    group_tasks: list[str] | None
    n_local: int
    plan: Plan | None = None
    correction: Correction | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    #: statuses of this rank's real executions (anchor rollouts; every turn when K > 1)
    statuses: list[str] = field(default_factory=list)

    def add_time(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


class _OptimizerTimer(TrainerCallback):
    """Books the optimiser step (between ``on_pre_optimizer_step`` and ``on_optimizer_step``) to ``update``."""

    def __init__(self, trainer: WMRLGRPOTrainer) -> None:
        self.trainer = trainer
        self.start: float | None = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.start is not None:
            self.trainer.ledger.add("update", time.perf_counter() - self.start)
            self.start = None


class WMRLGRPOTrainer(GRPOTrainer):
    """TRL ``GRPOTrainer`` whose rewards and advantages come from a :class:`~wmrl.core.corrector.Corrector`.

    Args:
        model: the policy (a model or a model spec TRL accepts).
        args: TRL ``GRPOConfig``. ``multi_objective_aggregation`` must be ``sum_then_normalize``;
            evaluation during training is not supported (use ``wmrl eval autoresearch``).
        train_dataset: rows with ``prompt``, a prompt-id column (``prompt_id_column``: one id per
            distinct prompt) and, for AutoResearch, ``task_ref`` (a loadable task) and ``task_id``.
        corrector: the run's corrector; its configuration must match ``mode`` (see :func:`check_mode`).
        mode: ``real`` | ``world_model`` | ``wmrl``.
        world_model: the world-model :class:`~wmrl.core.sources.RewardSource` (not used in ``real``).
        anchor: the real-execution source (not used in ``world_model``).
        item_fn: ``(completion text, row) -> item | Exact`` (default: AutoResearch solutions).
        episode: K-turn settings; ``turns > 1`` runs the rollout of :mod:`.rollout` through TRL's
            ``rollout_func`` and needs the AutoResearch sources (their feedback is the next observation).
        ledger: the cost ledger (default: accelerator counts from the training device).
        prompt_id_column / task_column: dataset columns of the prompt id and the task key (the
            scheduler stratifies by task; ``None``: no strata).
        processing_class, callbacks, peft_config: as in TRL.
    """

    def __init__(
        self,
        model: Any,
        *,
        args: Any,
        train_dataset: Any,
        corrector: Corrector,
        mode: str = "wmrl",
        world_model: RewardSource | None = None,
        anchor: RewardSource | None = None,
        item_fn: ItemFn | None = None,
        episode: EpisodeConfig | None = None,
        ledger: CostLedger | None = None,
        prompt_id_column: str = "prompt_id",
        task_column: str | None = "task_id",
        processing_class: Any = None,
        callbacks: Sequence[TrainerCallback] | None = None,
        peft_config: Any = None,
    ) -> None:
        check_mode(mode, corrector)
        if getattr(args, "multi_objective_aggregation", "sum_then_normalize") == "normalize_then_sum":
            raise ValueError(
                "multi_objective_aggregation='normalize_then_sum' is not supported by WMRLGRPOTrainer: it "
                "re-normalises each reward function separately and across the batch, which would undo the "
                "corrector's per-group advantages and fusion weights; use 'sum_then_normalize' (the default)"
            )
        if str(getattr(args, "eval_strategy", "no")) not in ("no", "IntervalStrategy.NO"):
            raise ValueError(
                "evaluation inside GRPO training is not supported by WMRLGRPOTrainer (the corrector would "
                "treat eval batches as training steps); set eval_strategy='no' and use `wmrl eval autoresearch`"
            )
        if mode != "real":
            problems = (
                check_source(world_model, role="world_model") if world_model is not None else ["missing"]
            )
            if problems:
                raise ValueError(f"mode {mode!r} needs a world-model reward source: {'; '.join(problems)}")
        if mode != "world_model":
            problems = check_source(anchor, role="anchor") if anchor is not None else ["missing"]
            if problems:
                raise ValueError(
                    f"mode {mode!r} needs a real-execution (anchor) source: {'; '.join(problems)}"
                )
        if mode == "wmrl":
            check_pair(world_model, anchor)
        train_dataset_columns = getattr(train_dataset, "column_names", None)
        if train_dataset_columns is not None and prompt_id_column not in train_dataset_columns:
            raise ValueError(
                f"the training dataset has no {prompt_id_column!r} column: every row needs a prompt id "
                "(anchor groups are chosen from it, identically on every rank)"
            )
        self.episode = episode or EpisodeConfig()
        multi_turn = self.episode.turns > 1
        self._turn_real = self._turn_wm = None  # per-turn graders of the K-turn rollout
        if multi_turn:
            if corrector.config.scheduler.active_share > 0:
                raise ValueError(
                    "the active scheduler (scheduler.active_share > 0) needs world-model scores before choosing "
                    "anchors, but with K > 1 anchors must be chosen before the rollout: set active_share to 0"
                )
            self._turn_real = execution_turns(anchor) if mode != "world_model" else None
            self._turn_wm = world_model_turns(world_model) if mode != "real" else None
        self.mode = mode
        self.corrector = corrector
        self.wmrl_world_model = world_model if mode != "real" else None
        self.wmrl_anchor = anchor if mode != "world_model" else None
        self.item_fn = item_fn or solution_items()
        self.prompt_id_column = prompt_id_column
        self.task_column = task_column
        self._wmrl_step: _Step | None = None
        self._wmrl_inputs: list[dict[str, Any]] | None = None
        self._prepare_seconds = 0.0
        rollout = _rollout_entry if multi_turn else None
        super().__init__(
            model=model,
            reward_funcs=[wmrl_reward],
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            callbacks=list(callbacks) if callbacks else None,
            peft_config=peft_config,
            rollout_func=rollout,
        )
        if multi_turn and self.use_vllm:
            raise ValueError(
                "K-turn rollouts generate with the in-process transformers model; set use_vllm=False"
            )
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
            ledger = CostLedger({"generation": held, "update": held, "world_model": held, "anchor": 0.0})
        self.ledger = ledger
        self.add_callback(_OptimizerTimer(self))

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
        group_keys, group_tasks, seen = [], [], {}
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
        return _Step(group_keys, group_tasks if all_tasks is not None else None, len(inputs))

    def _plan(self, step: _Step, wm_scores: np.ndarray | None = None) -> None:
        start = time.perf_counter()
        step.plan = self.corrector.plan(step.group_keys, step.group_tasks, wm_scores)
        step.add_time("corrector", time.perf_counter() - start)

    def _local_anchor_rows(self, step: _Step) -> np.ndarray:
        """bool ``(n_local,)``: which of this rank's rows belong to anchor groups."""
        assert step.plan is not None
        first = self.accelerator.process_index * step.n_local
        rows = np.arange(first, first + step.n_local)
        return np.asarray(step.plan.anchor)[rows // self.num_generations]

    # ------------------------------------------------------------------ TRL overrides

    def _prepare_inputs(self, generation_batch):
        start = time.perf_counter()
        try:
            return super()._prepare_inputs(generation_batch)
        finally:
            self._prepare_seconds += time.perf_counter() - start

    def training_step(self, model, inputs, num_items_in_batch=None):
        start, before = time.perf_counter(), self._prepare_seconds
        output = super().training_step(model, inputs, num_items_in_batch)
        # forward + backward of this micro-batch, without the generation/scoring done inside it
        self.ledger.add("update", time.perf_counter() - start - (self._prepare_seconds - before))
        return output

    def _generate(self, prompts: list):
        if self.episode.turns > 1:  # the rollout books generation and grading itself
            return super()._generate(prompts)
        start = time.perf_counter()
        output = super()._generate(prompts)
        elapsed = time.perf_counter() - start
        self.ledger.add("generation", elapsed, items=len(prompts))
        if self._wmrl_step is not None:
            self._wmrl_step.add_time("generation", elapsed)
        return output

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            raise RuntimeError(
                "WMRLGRPOTrainer does not evaluate during training; use `wmrl eval autoresearch` on a checkpoint"
            )
        step = self._new_step(inputs)
        self._wmrl_step, self._wmrl_inputs = step, list(inputs)
        if self.corrector.config.scheduler.active_share == 0:
            self._plan(step)  # from keys only: before generation, so K-turn rollouts know their stream
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._wmrl_inputs = None
        correction = step.correction
        if correction is None:  # pragma: no cover - _calculate_rewards always sets it
            raise RuntimeError("the corrector did not run for this batch")
        self._apply_advantages(output, correction, step)
        self._log_step(correction, step)
        return output

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
        logged = self._logs["advantages"]
        for _ in range(min(len(flat), len(logged))):
            logged.pop()
        logged.extend(np.nan_to_num(flat, nan=0.0).tolist())

    def _log_step(self, correction: Correction, step: _Step) -> None:
        metrics = self._metrics["train"]
        for key, value in correction.metrics.items():
            if value is None or (self.mode == "real" and key == "wmrl/unknown_world_model"):
                continue  # unknown is not zero; real mode has no world model to be unknown
            metrics[key].append(float(value))
        # Each rank timed and executed only its own slice; the log (written by rank 0) describes the
        # whole batch: seconds summed over ranks (rank-seconds), statuses of every rank's executions.
        seconds: dict[str, float] = {}
        statuses: list[str] = []
        for rank_seconds, rank_statuses in gather_object([(step.seconds, step.statuses)]):
            for name, value in rank_seconds.items():
                seconds[name] = seconds.get(name, 0.0) + value
            statuses.extend(rank_statuses)
        for name in ("generation", "world_model", "anchor", "corrector"):
            if name in seconds:
                metrics[f"cost/{name}_s"].append(seconds[name])
        if statuses:  # every status every time, so averages over logging windows stay shares
            for status in ANCHOR_STATUSES:
                metrics[f"anchor_status/{status}"].append(statuses.count(status) / len(statuses))

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        step = self._wmrl_step
        if step is None:  # pragma: no cover - set by _generate_and_score_completions
            raise RuntimeError("_calculate_rewards called outside a WMRL generation batch")
        device = self.accelerator.device
        if self.episode.turns > 1:
            local = np.array(
                [[_nan(row.get("wmrl_wm")), np.nan, _nan(row.get("wmrl_real"))] for row in inputs],
                dtype=np.float64,
            )
        else:
            texts = [completion_text(c) for c in completions]
            items = [self.item_fn(text, row) for text, row in zip(texts, inputs, strict=True)]
            local = self._score_single_turn(step, items)
        gathered = (
            self.accelerator.gather(torch.tensor(local, dtype=torch.float64, device=device)).cpu().numpy()
        )
        g = self.num_generations
        wm, var, real = (gathered[:, k].reshape(-1, g) for k in range(3))
        known_var = ~np.isnan(var)
        start = time.perf_counter()
        correction = self.corrector.correct(step.plan, wm, real, var if known_var.any() else None)
        step.add_time("corrector", time.perf_counter() - start)
        self.ledger.count_rollouts(step.n_local)  # this rank's; merged_ledger() sums the ranks
        step.correction = correction
        rewards = torch.tensor(correction.rewards.reshape(-1, 1), dtype=torch.float32, device=device)
        return rewards

    def _score_single_turn(self, step: _Step, items: list[Any]) -> np.ndarray:
        """``(n_local, 3)``: world-model score, its per-call variance, real score (NaN = unknown / not graded)."""
        n = len(items)
        out = np.full((n, 3), np.nan)
        exact = [isinstance(item, Exact) for item in items]
        for i, item in enumerate(items):
            if exact[i] and item.value is not None and self.mode != "real":
                out[i, 0], out[i, 1] = item.value, 0.0
        wm_rows = [i for i in range(n) if not exact[i]] if self.mode != "real" else []
        if step.plan is None:  # active scheduler: the world model must score before anchors are chosen
            self._fill_wm(out, items, wm_rows, step)
            g = self.num_generations
            column = torch.tensor(out[:, 0], dtype=torch.float64, device=self.accelerator.device)
            all_wm = self.accelerator.gather(column).cpu().numpy()
            self._plan(step, all_wm.reshape(-1, g))
            wm_rows = []
        anchor_local = self._local_anchor_rows(step)
        for i, item in enumerate(items):
            if anchor_local[i] and exact[i]:
                step.statuses.append(item.status)
                if item.value is not None:
                    out[i, 2] = item.value
        anchor_rows = [i for i in range(n) if anchor_local[i] and not exact[i]]
        # Rollouts graded exactly (no script) cost nothing in either stream; booking them as free items
        # keeps the per-item costs, and so the ledger's real-mode estimate, true to the whole mix.
        exact_anchor = sum(1 for i in range(n) if anchor_local[i] and exact[i])
        if exact_anchor:
            self.ledger.add("anchor", 0.0, items=exact_anchor)
        if self.mode != "real" and any(exact):
            self.ledger.add("world_model", 0.0, items=sum(exact))
        # Real execution is the slow part; the world model scores meanwhile.
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = []
            if wm_rows:
                futures.append(pool.submit(self._fill_wm, out, items, wm_rows, step))
            if anchor_rows:
                futures.append(pool.submit(self._fill_real, out, items, anchor_rows, step))
            for future in futures:
                future.result()
        return out

    def _grades(self, source: RewardSource, items: list[Any], stream: str, step: _Step) -> list[Grade]:
        start = time.perf_counter()
        try:
            return collect_grades(source, items)
        finally:
            elapsed = time.perf_counter() - start
            self.ledger.add(stream, elapsed, items=len(items))
            step.add_time(stream, elapsed)

    def _fill_wm(self, out: np.ndarray, items: list[Any], rows: list[int], step: _Step) -> None:
        if not rows:
            return
        grades = self._grades(self.wmrl_world_model, [items[i] for i in rows], "world_model", step)
        for i, grade in zip(rows, grades, strict=True):
            out[i, 0] = _nan(grade.value)
            out[i, 1] = _nan(grade.variance) if grade.value is not None else np.nan

    def _fill_real(self, out: np.ndarray, items: list[Any], rows: list[int], step: _Step) -> None:
        grades = self._grades(self.wmrl_anchor, [items[i] for i in rows], "anchor", step)
        for i, grade in zip(rows, grades, strict=True):
            out[i, 2] = _nan(grade.value)
            step.statuses.append(grade.status or "unknown")

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        self.save_wmrl_state(folder)  # every rank takes part (the ledgers are gathered)

    def merged_ledger(self) -> CostLedger:
        """The whole run's cost ledger: every rank's, summed (see :meth:`CostLedger.merged`).

        A collective: call it on every rank (a single process gets a copy of its own ledger).
        """
        return CostLedger.merged(gather_object([self.ledger.state_dict()]))

    def save_wmrl_state(self, folder: str | os.PathLike) -> None:
        """Write the corrector's state and every rank's cost ledger into ``folder``.

        A collective: call it on every rank. The corrector is identical on all ranks; the processes
        that save TRL's checkpoint (``args.should_save``: the main one, or each node's with
        ``save_on_each_node``) write it. Each rank's ledger is kept apart (``{"ranks": [...]}``) so
        that a resume with the same number of ranks gives each rank back its own costs.
        """
        ranks = gather_object([self.ledger.state_dict()])
        if not self.args.should_save:
            return
        os.makedirs(folder, exist_ok=True)
        self.corrector.save(os.path.join(folder, CORRECTOR_FILE))
        tmp = os.path.join(folder, LEDGER_FILE + ".tmp")
        with open(tmp, "w") as fh:
            json.dump({"ranks": ranks}, fh)
        os.replace(tmp, os.path.join(folder, LEDGER_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_wmrl_state(checkpoint)

    def load_wmrl_state(self, folder: str | os.PathLike) -> None:
        """Restore the corrector and the ledger from a checkpoint folder written by :meth:`save_wmrl_state`."""
        path = os.path.join(folder, CORRECTOR_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"checkpoint {folder} has no {CORRECTOR_FILE}: it was not written by WMRLGRPOTrainer, so the "
                "corrector (calibration map, fusion estimates, anchor counts) cannot be restored"
            )
        restored = Corrector.load(path)
        if restored.config != self.corrector.config:
            raise ValueError(
                f"the corrector saved in {folder} was configured differently from this run's; resume with the "
                "same configuration"
            )
        self.corrector.load_state_dict(restored.state_dict())
        ledger_path = os.path.join(folder, LEDGER_FILE)
        if os.path.exists(ledger_path):
            with open(ledger_path) as fh:
                saved = json.load(fh)
            self.ledger.load_state_dict(self._own_ledger_state(saved))

    def _own_ledger_state(self, saved: dict[str, Any]) -> dict[str, Any]:
        """This rank's part of a saved ledger, with the accelerators this rank holds now.

        With a different number of ranks than at saving, the main process takes the saved total and
        the others start from zero, so the run-wide sum stays right.
        """
        ranks = saved.get("ranks", [saved])  # a single state: the one-rank format
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        if len(ranks) == world:
            own = dict(ranks[rank])
        elif rank == 0:
            own = CostLedger.merged(ranks).state_dict()
        else:
            own = CostLedger().state_dict()
        own["accelerators"] = dict(self.ledger.accelerators)
        return own


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _rollout_entry(prompts: list, trainer: WMRLGRPOTrainer) -> dict[str, Any]:
    """TRL's ``rollout_func`` for K > 1 (TRL calls it with the trainer)."""
    from wmrl.autoresearch.training.rollout import multi_turn_rollout

    return multi_turn_rollout(trainer, prompts)
