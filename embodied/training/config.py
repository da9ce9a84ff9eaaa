"""The typed configuration of ``wmrl train embodied``: one frozen dataclass tree, validated at construction.

Load it with :func:`load_train_config` (a preset name or a JSON/TOML file, then ``key=value``
overrides); every run writes the resolved tree to ``RUN/config.json``, which loads back unchanged.
Unknown keys, wrong types and broken rules raise :class:`~wmrl.core.config.ConfigError` naming the key.

Defaults follow the official WMRL LIBERO-Long recipe where it states a value (``libero_long.yaml`` and
``train_grpo.py``: group size 8, 520 policy steps, LoRA r16/α32 on q/k/v/o/gate/up/down, PPO clip 0.2,
gradient clip 1.0, KL β 0.04, 12 sampled timesteps per rollout, initial states 0-15) and say so where
they depart from it (several PPO epochs instead of one, so that the ratio and the clip are real).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from wmrl.core.config import load_config, require, require_int
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.engines.ray.config import RayPoolConfig
from wmrl.core.modes import Mode
from wmrl.core.train_config import CheckpointConfig, LoraConfig, TrainConfigBase
from wmrl.embodied.env.splits import IN_DOMAIN_STATES, NUM_INIT_STATES
from wmrl.embodied.env.suites import DEFAULT_SUITE, SUITE_NUM_TASKS, check_suite
from wmrl.embodied.sources import RobometerSourceConfig

__all__ = ["PRESETS", "EmbodiedTrainConfig", "EnvSpec", "PPOConfig", "PolicySpec", "load_train_config"]

# The official trainer's LoRA targets (every linear of the Qwen2 decoder).
_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_loading(policy: Any) -> None:
    """The checks of how a policy is loaded, shared by the RL and SFT ``policy`` sections
    (``dtype``, ``checkpoint_step``, ``jpeg_quality``)."""
    require(
        policy.dtype in ("auto", "float32", "bfloat16", "float16"),
        f"policy.dtype must be auto, float32, bfloat16 or float16; got {policy.dtype!r}",
    )
    require(
        policy.wrist_camera is None or bool(policy.wrist_camera),
        "policy.wrist_camera must name a camera (robot0_eye_in_hand) or be null",
    )
    if policy.checkpoint_step is not None:
        require_int(policy.checkpoint_step, "policy.checkpoint_step", 0)
    if policy.jpeg_quality is not None:
        require(
            isinstance(policy.jpeg_quality, int) and 1 <= policy.jpeg_quality <= 100,
            f"policy.jpeg_quality must be an integer in [1, 100] or null; got {policy.jpeg_quality!r}",
        )


@dataclass(frozen=True)
class PolicySpec:
    """Which VLA to train and how it samples.

    Attributes:
        source: ``"tiny"`` (the random tiny MiniVLA, smoke runs only), a folder written by
            ``MiniVLAPolicy.save`` (``minivla.json``; e.g. an SFT checkpoint), or a Prismatic /
            openvla-mini run directory (``config.json`` + ``checkpoints/step-*.pt``).
        tokenizer_path: Qwen2.5 tokenizer folder for a Prismatic run (default ``source/tokenizer``).
        checkpoint_step: which ``step-*.pt`` of a Prismatic run (default: the highest).
        unnorm_key: dataset statistics used to un-normalise actions (default: the saved policy's, else
            the suite's, with upstream's ``<suite>_no_noops`` fallback; statistics of another suite are
            an error).
        temperature: sampling temperature of the rollouts (> 0); the PPO ratio and the KL are taken
            under this same tempered distribution.
        center_crop: openvla-mini's test-time centre crop (checkpoints trained with image augmentation);
            ``null`` = the saved policy's setting, else true.
        jpeg_quality: JPEG round trip of every frame before the policy sees it (the official worker's,
            quality 95), ``null`` = the saved policy's setting, else none; recorded in checkpoints.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:N``.
        dtype: ``auto`` (bfloat16 on CUDA, float32 on a CPU), ``float32``, ``bfloat16``, ``float16``.
        tiny_seed: initialisation seed of the tiny model.
        wrist_camera: the wrist camera (``robot0_eye_in_hand``) a ``tiny`` policy reads after the
            third-person one (openvla-mini's ``-wrist`` variant: two images a step); ``null`` = none.
            A checkpoint reads what it was trained on; another value than its own is refused.
    """

    source: str = "tiny"
    tokenizer_path: str | None = None
    checkpoint_step: int | None = None
    unnorm_key: str | None = None
    temperature: float = 1.0
    center_crop: bool | None = None
    jpeg_quality: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    tiny_seed: int = 0
    wrist_camera: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.source), "policy.source must be 'tiny' or a policy folder")
        require(
            self.temperature > 0,
            f"policy.temperature must be > 0 (RL samples its rollouts); got {self.temperature}",
        )
        check_loading(self)

    @property
    def on_cuda(self) -> bool:
        """Whether the policy will run on CUDA (``auto`` resolved on this machine)."""
        if self.device == "auto":
            import torch

            return torch.cuda.is_available()
        return self.device.startswith("cuda")

    @property
    def is_tiny(self) -> bool:
        return self.source == "tiny"


@dataclass(frozen=True)
class EnvSpec:
    """The LIBERO tasks, initial states and rendering of the training rollouts.

    Attributes:
        suite: LIBERO suite (``libero_10`` = LIBERO-Long).
        tasks: task indices trained on (``None``: every task of the suite).
        states: training initial states; must be in-domain (``None``: all in-domain states, 0-15).
            Held-out states are rejected: they are kept for evaluation.
        max_episode_steps: policy steps per episode (``None``: the suite's standard, 520 for libero_10).
        settle_steps: no-op steps after placing the initial state.
        camera: the one camera rendered; the policy acts on it and Robometer watches it.
        image_size: square render side in pixels (the policy resizes to 224); ``null`` = the size the
            policy's checkpoint records, else 256.
        orientation: image orientation of the rendered frames (``upright``, ``rotate180``, ``raw``);
            ``null`` = the policy checkpoint's, else ``upright``.
        allow_observation_mismatch: train even when ``image_size``/``orientation`` differ from what
            the policy's checkpoint records (refused otherwise).
        hard_reset: rebuild the MuJoCo model at every reset (slower; the initial state overwrites the
            whole simulator state either way).
        workers: simulators running at once (0 = one in this process).
        simulators: ``local`` (worker processes on this machine) or ``ray`` (one Ray actor per worker
            on any node of a cluster with the resources ``ray`` asks for; an episode whose simulator or
            node is lost is run again on another, up to ``ray.retries`` times; ``docs/scale-out.md``).
        ray: the Ray placement of the simulators (``simulators: ray``): cluster address, slots
            (= ``workers``), CPUs/memory/custom resources per slot, the deadline of one command.
        frame_stride: record every n-th frame for Robometer (plus the first and last); each episode is
            cut to Robometer's window of frames as it ends, so 1 (exact windows) costs little memory.
    """

    suite: str = DEFAULT_SUITE
    tasks: tuple[int, ...] | None = None
    states: tuple[int, ...] | None = None
    max_episode_steps: int | None = None
    settle_steps: int = 10
    camera: str = "agentview"
    image_size: int | None = None
    orientation: str | None = None
    allow_observation_mismatch: bool = False
    hard_reset: bool = False
    workers: int = 1
    frame_stride: int = 1
    simulators: Literal["local", "ray"] = "local"
    ray: RayPoolConfig = field(default_factory=RayPoolConfig)

    def __post_init__(self) -> None:
        check_suite(self.suite)
        n_tasks = SUITE_NUM_TASKS[self.suite]
        if self.tasks is not None:
            require(len(self.tasks) > 0, "env.tasks must not be empty (None = every task)")
            for t in self.tasks:
                require(
                    isinstance(t, int) and 0 <= t < n_tasks, f"env.tasks: {t!r} is not a task of {self.suite}"
                )
            require(len(set(self.tasks)) == len(self.tasks), f"env.tasks must not repeat; got {self.tasks}")
        if self.states is not None:
            require(len(self.states) > 0, "env.states must not be empty (None = every in-domain state)")
            held_out = [s for s in self.states if s not in IN_DOMAIN_STATES]
            require(
                not held_out,
                f"env.states {held_out} are held-out initial states (in-domain = {IN_DOMAIN_STATES[0]}-"
                f"{IN_DOMAIN_STATES[-1]} of {NUM_INIT_STATES}); training uses in-domain states only",
            )
            require(
                len(set(self.states)) == len(self.states), f"env.states must not repeat; got {self.states}"
            )
        if self.max_episode_steps is not None:
            require_int(self.max_episode_steps, "env.max_episode_steps")
        require_int(self.settle_steps, "env.settle_steps", 0)
        require(bool(self.camera) and "," not in self.camera, "env.camera must be one camera name")
        if self.image_size is not None:
            require_int(self.image_size, "env.image_size", 8)
        if self.orientation is not None:
            from wmrl.embodied.env.images import check_orientation

            check_orientation(self.orientation)
        require_int(self.workers, "env.workers", 0)
        require_int(self.frame_stride, "env.frame_stride")
        if self.simulators == "ray":
            require(
                self.workers >= 1 and self.ray.slots == self.workers,
                f"env.workers ({self.workers}, simulators at once) must be >= 1 and equal env.ray.slots "
                f"({self.ray.slots}, Ray actors) with env.simulators=ray",
            )

    @property
    def task_ids(self) -> tuple[int, ...]:
        return self.tasks if self.tasks is not None else tuple(range(SUITE_NUM_TASKS[self.suite]))

    @property
    def state_ids(self) -> tuple[int, ...]:
        return self.states if self.states is not None else IN_DOMAIN_STATES


@dataclass(frozen=True)
class PPOConfig:
    """The policy update: PPO-clip on the action tokens over several epochs of the collected batch.

    Attributes:
        epochs: passes over the batch per training step (the official trainer made one, so its ratio
            was identically 1 and its clip never bound).
        minibatch_size: (episode, timestep) samples per optimiser step.
        microbatch_size: samples per forward pass (gradients accumulate up to ``minibatch_size``).
        timesteps_per_episode: timesteps sampled from each episode (``None``: all); equal per episode so a
            long failed episode does not outweigh a short successful one (official: 12).
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]`` (clip-higher when
            ``clip_high > clip_low``).
        kl_beta: weight of the KL penalty to the reference (frozen initial) policy; 0 = none.
        weight_decay, betas: AdamW (its learning rate is the shared ``learning_rate``).
        max_grad_norm: global gradient-norm clip (``None``: no clipping; the norm is logged either way).
        drop_zero_advantage: skip samples whose advantage is exactly 0 when ``kl_beta == 0`` (they carry no
            gradient; as the official trainer does).
    """

    epochs: int = 2
    minibatch_size: int = 64
    microbatch_size: int = 8
    timesteps_per_episode: int | None = 12
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_beta: float = 0.04
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = 1.0
    drop_zero_advantage: bool = True

    def __post_init__(self) -> None:
        require_int(self.epochs, "ppo.epochs")
        require_int(self.minibatch_size, "ppo.minibatch_size")
        require_int(self.microbatch_size, "ppo.microbatch_size")
        require(
            self.microbatch_size <= self.minibatch_size,
            f"ppo.microbatch_size ({self.microbatch_size}) must be <= ppo.minibatch_size ({self.minibatch_size})",
        )
        if self.timesteps_per_episode is not None:
            require_int(self.timesteps_per_episode, "ppo.timesteps_per_episode")
        require(0 < self.clip_low < 1, f"ppo.clip_low must be in (0, 1); got {self.clip_low}")
        require(self.clip_high > 0, f"ppo.clip_high must be > 0; got {self.clip_high}")
        require(self.kl_beta >= 0, f"ppo.kl_beta must be >= 0; got {self.kl_beta}")
        require(self.weight_decay >= 0, f"ppo.weight_decay must be >= 0; got {self.weight_decay}")
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            f"ppo.betas must be two numbers in [0, 1); got {self.betas}",
        )
        require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            f"ppo.max_grad_norm must be > 0 or None; got {self.max_grad_norm}",
        )


def _tiny_world_model() -> RobometerSourceConfig:
    return RobometerSourceConfig(backend="tiny")


def _lora() -> LoraConfig:
    # The official trainer's LoRA (r16/alpha32 on every linear of the Qwen2 decoder).
    return LoraConfig(r=16, alpha=32, target_modules=_LORA_TARGETS)


def _default_corrector() -> CorrectorConfig:
    # The core's default (issue 32): per-rollout anchors (half of each group, its top-ranked episodes by
    # the world model), isotonic calibration, every rollout weighted 1. An episode has no solution key
    # (its actions are continuous), so the execution memory stays empty; the design still ranks and
    # calibrates. The group design it replaced (``corrector_preset=wmrl_groups``) pinned its mse fusion
    # at ``max_ratio`` in every recorded LIBERO run, and trailed this design on the simulation where
    # nothing recurs (docs/benchmarks/embodied.md, "The default on LIBERO").
    return CorrectorConfig()


def _checkpoint() -> CheckpointConfig:
    return CheckpointConfig(every=20, keep=2)


@dataclass(frozen=True)
class EmbodiedTrainConfig(TrainConfigBase):
    """Everything ``wmrl train embodied`` does (the shared keys are those of every domain).

    Attributes:
        mode: ``real`` (sparse-success GRPO: every group graded by the simulator's success flag;
            ``sparse`` is its deprecated name), ``world_model`` (Robometer alone) or ``wmrl`` (anchors +
            isotonic debiasing + fusion). It presets ``corrector``.
        steps: training steps (each: roll out, score, correct, update).
        group_size: G, rollouts per group; a group is G rollouts from ONE (task, initial state).
        groups_per_step: groups per step, each a distinct (task, initial state), tasks in rotation.
        learning_rate: AdamW's learning rate of the PPO update.
        seed: base seed of group choice, episode seeds, timestep sampling and shuffling.
        lora: adapters on the LLM (``enabled=false`` fine-tunes the projector and the LLM fully; the
            vision towers stay frozen).
        policy: the VLA.
        env: the simulator.
        ppo: the policy update.
        world_model: the Robometer source (``tiny``, ``local`` = a checkpoint folder, ``http`` = its server).
        corrector: the correction; the core's default (per-rollout anchors on half of each group,
            calibration, weights of 1; episodes have no solution key, so its execution memory stays
            empty). ``corrector_preset=wmrl_groups`` is the group design it replaced.
        world_model_in_real: also run Robometer in ``real`` mode (diagnostics only; it then costs its
            compute for nothing the update uses).
        torch_threads: torch intra-op threads (``null``: torch's default). On a small, shared CPU one
            thread is much faster than oversubscribed ones.
    """

    resumable: ClassVar[tuple[str, ...]] = ("torch_threads",)

    steps: int = 2000
    group_size: int = 8
    groups_per_step: int = 10
    lora: LoraConfig = field(default_factory=_lora)
    checkpoint: CheckpointConfig = field(default_factory=_checkpoint)
    corrector: CorrectorConfig = field(default_factory=_default_corrector)
    policy: PolicySpec = field(default_factory=PolicySpec)
    env: EnvSpec = field(default_factory=EnvSpec)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    world_model: RobometerSourceConfig = field(default_factory=_tiny_world_model)
    world_model_in_real: bool = False
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.torch_threads is not None:
            require_int(self.torch_threads, "torch_threads")
        require(
            self.lora.last_layers == 0,
            "lora.last_layers is not supported by the MiniVLA policy's adapters: set 0 (every layer)",
        )
        n_tasks, n_states = len(self.env.task_ids), len(self.env.state_ids)
        per_task = -(-self.groups_per_step // n_tasks)
        require(
            per_task <= n_states,
            f"groups_per_step ({self.groups_per_step}) over {n_tasks} task(s) needs {per_task} distinct initial "
            f"states per task, but only {n_states} are trained on: the groups of one step are distinct",
        )
        if self.uses_world_model:
            require(
                self.world_model.camera == self.env.camera,
                f"world_model.camera ({self.world_model.camera!r}) must be the rendered camera env.camera "
                f"({self.env.camera!r})",
            )

    @property
    def uses_world_model(self) -> bool:
        """Whether Robometer is loaded and run (always, except ``real`` without diagnostics)."""
        return self.mode is not Mode.REAL or self.world_model_in_real

    @property
    def uses_tiny_models(self) -> bool:
        return self.policy.is_tiny or (self.uses_world_model and self.world_model.backend == "tiny")

    def replace(self, **changes: Any) -> EmbodiedTrainConfig:
        return replace(self, **changes)


# -- presets -------------------------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    # The CPU smoke run: the real simulator end to end in a few minutes. Tiny random MiniVLA, one task,
    # one group of 2 rollouts, 12 policy steps per episode, one 64x64 camera, tiny random Robometer.
    "smoke": {
        "steps": 3,
        "group_size": 2,
        "groups_per_step": 1,
        "policy": {"source": "tiny"},
        "learning_rate": 1e-3,
        "lora": {"enabled": True, "r": 4, "alpha": 8},
        "env": {
            "suite": "libero_10",
            "tasks": [0],
            "max_episode_steps": 12,
            "camera": "agentview",
            "image_size": 64,
            "workers": 0,
        },
        "ppo": {
            "epochs": 2,
            "minibatch_size": 8,
            "microbatch_size": 8,
            "timesteps_per_episode": 8,
        },
        "world_model": {"backend": "tiny"},
        # One group of 2 per step: the default executes its top-ranked episode and grades the other with
        # the world model, so both streams run; the calibration starts from its second pair (step 2).
        "corrector": {"debias": {"min_pairs": 2}},
        "checkpoint": {"every": 1, "keep": 2},
        "logging": {"report_to": []},
        "torch_threads": 1,
    },
}
"""Named configurations for ``--config NAME``, as plain data over the defaults."""


def load_train_config(
    config: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> EmbodiedTrainConfig:
    """Build the training config from a preset name, a file or a dict, then ``key=value`` overrides.

    Args:
        config: ``None`` (defaults), a name in :data:`PRESETS` (``"smoke"``), a ``.yaml``/``.json``/``.toml``
            file (for example a run's ``config.json``) or a mapping.
        overrides: ``a.b=value`` strings (``env.tasks=[0,1]``, ``learning_rate=3e-5``, ``mode=real``).

    Raises:
        ConfigError: unknown preset/file, unknown key, wrong type or a broken rule (named).
    """
    return load_config(EmbodiedTrainConfig, config, overrides, PRESETS)
