"""The typed configuration of ``wmrl train embodied-sft``: behaviour cloning of a VLA on demonstrations.

Why not :class:`~wmrl.core.train_config.TrainConfigBase`: its shared keys are those of a GRPO run
(``mode``, ``groups_per_step``, ``group_size >= 2``, ``corrector`` resolved from the mode), none of
which means anything for supervised fine-tuning, and "every setting honoured or refused" forbids
carrying keys that do nothing. The keys SFT does share keep their names and their types from core
(``learning_rate``, ``seed``, ``lora``: :class:`~wmrl.core.train_config.LoraConfig`, ``logging``,
``checkpoint``), so a user reads one vocabulary, and the resume rule is core's
(:data:`~wmrl.core.train_config.RESUMABLE`). Defaults follow the official recipe: one demonstration
(``demo_0``) per LIBERO-Long task, replayed in the simulator, LoRA r16/α32 on every linear of the
decoder, 5 epochs, microbatch 8 x accumulation 3 (24 samples per optimiser step), lr 1e-4 (the
official run swept 1e-4 and 5e-4), the last epoch kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from wmrl.core.config import load_config, require, require_int, to_dict
from wmrl.core.train_config import (
    RESUMABLE,
    CheckpointConfig,
    LoggingConfig,
    LoraConfig,
    refuse_resume_changes,
)
from wmrl.embodied.env.suites import DEFAULT_SUITE, SUITE_NUM_TASKS, check_suite
from wmrl.embodied.training.config import _LORA_TARGETS, check_loading

__all__ = [
    "PRESETS",
    "EmbodiedSFTConfig",
    "SFTDataConfig",
    "SFTEvalConfig",
    "SFTPolicySpec",
    "load_sft_config",
]

FORMATS = ("libero_hdf5", "lerobot")


@dataclass(frozen=True)
class SFTPolicySpec:
    """The VLA to fine-tune (what ``wmrl train embodied`` reads as ``policy.source`` afterwards).

    Attributes:
        source: ``tiny`` (random tiny MiniVLA, for tests), a ``MiniVLAPolicy.save`` folder, or a
            Prismatic / openvla-mini run directory (e.g. ``minivla-libero90-prismatic``).
        tokenizer_path: Qwen2.5 tokenizer folder for a Prismatic run (default ``source/tokenizer``).
        checkpoint_step: which ``step-*.pt`` of a Prismatic run (default: the highest).
        center_crop: the 0.9-area centre crop in preprocessing (``null``: the source's, else true);
            training and acting use the same preprocessing.
        jpeg_quality: JPEG round trip of every frame (the official worker's, 95), ``null`` = none;
            recorded in the checkpoint and applied by everything that loads it.
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
    center_crop: bool | None = None
    jpeg_quality: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    tiny_seed: int = 0
    wrist_camera: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.source), "policy.source must be 'tiny' or a policy folder")
        check_loading(self)

    def as_policy_spec(self):
        """The RL trainer's :class:`~wmrl.embodied.training.config.PolicySpec` for the same source."""
        from wmrl.embodied.training.config import PolicySpec

        return PolicySpec(
            source=self.source,
            tokenizer_path=self.tokenizer_path,
            checkpoint_step=self.checkpoint_step,
            center_crop=self.center_crop,
            jpeg_quality=self.jpeg_quality,
            device=self.device,
            dtype=self.dtype,
            tiny_seed=self.tiny_seed,
            wrist_camera=self.wrist_camera,
        )


@dataclass(frozen=True)
class SFTDataConfig:
    """Where the demonstrations come from and how the training frames are made.

    Attributes:
        format: ``libero_hdf5`` (LIBERO's ``*_demo.hdf5`` files) or ``lerobot`` (a LeRobot dataset folder).
        paths: HDF5 files or folders of them, or LeRobot dataset folders.
        demos: which demonstrations of each file (HDF5 ``demo_<i>``) or which episodes (LeRobot);
            ``null`` = all. The official SFT uses ``[0]``: one demonstration per task.
        suite: the LIBERO suite the demonstrations belong to (task ids come from their instructions).
        tasks: keep only these task ids (``null`` = every task found).
        replay: replay each demonstration's actions in our simulator from its first MuJoCo state and
            train on the regenerated frames (needs states: LIBERO HDF5; what the official SFT does).
        skip_noops: drop OpenVLA's no-op actions while replaying.
        keep_failed_replays: keep a replay that does not reach the goal (OpenVLA drops them).
        settle_steps: no-op steps after placing a replay's first state (as in every episode).
        camera: the camera the policy sees (our name: ``agentview``).
        camera_key: the LeRobot feature of that camera (``null`` = the LIBERO datasets' key).
        stored_orientation: orientation of the stored frames (``null``: LIBERO HDF5's convention
            attribute; a LeRobot dataset's own record, else ``rotate180`` as on the hub).
        orientation: orientation of the training frames; recorded in the checkpoint, and what RL and
            evaluation render.
        image_size: square render side of the training frames (replay renders at it; stored frames
            must have it); ``null`` = 256 for replays, the stored size otherwise. Recorded in the checkpoint.
        stats_key: the name the action statistics are saved under (``null`` = the suite).
        statistics: ``demos`` computes the action statistics (q01/q99) from these demonstrations;
            ``source`` keeps the source policy's, so that its action tokens keep their meaning while
            it is fine-tuned (demonstrations beyond its bounds are clipped to its end bins). With
            ``demos``, data whose statistics differ (DAgger's recoveries) re-map every token.
    """

    format: str = "libero_hdf5"
    paths: tuple[str, ...] = ()
    demos: tuple[int, ...] | None = (0,)
    suite: str = DEFAULT_SUITE
    tasks: tuple[int, ...] | None = None
    replay: bool = True
    skip_noops: bool = True
    keep_failed_replays: bool = False
    settle_steps: int = 10
    camera: str = "agentview"
    camera_key: str | None = None
    stored_orientation: str | None = None
    orientation: str = "upright"
    image_size: int | None = None
    stats_key: str | None = None
    statistics: str = "demos"

    def __post_init__(self) -> None:
        from wmrl.embodied.env.images import check_orientation

        require(
            self.statistics in ("demos", "source"),
            f"data.statistics must be 'demos' or 'source'; got {self.statistics!r}",
        )
        require(self.format in FORMATS, f"data.format must be one of {list(FORMATS)}; got {self.format!r}")
        require(len(self.paths) > 0, "data.paths must name at least one demonstration file or dataset")
        check_suite(self.suite)
        if self.tasks is not None:
            bad = [t for t in self.tasks if not (isinstance(t, int) and 0 <= t < SUITE_NUM_TASKS[self.suite])]
            require(not bad, f"data.tasks: {bad} are not tasks of {self.suite}")
        if self.demos is not None:
            require(all(isinstance(d, int) and d >= 0 for d in self.demos), "data.demos must be indices >= 0")
        require(
            not (self.replay and self.format == "lerobot"),
            "data.replay needs the demonstrations' MuJoCo states, which LeRobot datasets do not store; "
            "set data.replay=false (the stored frames are used)",
        )
        require_int(self.settle_steps, "data.settle_steps", 0)
        check_orientation(self.orientation)
        if self.stored_orientation is not None:
            check_orientation(self.stored_orientation)
        if self.image_size is not None:
            require_int(self.image_size, "data.image_size", 8)


@dataclass(frozen=True)
class SFTEvalConfig:
    """The evaluation hook: a LIBERO evaluation of the policy every few epochs (and at the end).

    Attributes:
        every_epochs: epochs between evaluations (``null``: none).
        tasks, states: what to evaluate (``null``: the trained tasks; in-domain states 0-15).
        rollouts_per_state: k.
        max_steps: policy steps per episode (``null``: the suite's, 520 for LIBERO-Long).
        workers: simulator processes.
    """

    every_epochs: int | None = None
    tasks: tuple[int, ...] | None = None
    states: tuple[int, ...] | None = None
    rollouts_per_state: int = 1
    max_steps: int | None = None
    workers: int = 1

    def __post_init__(self) -> None:
        if self.every_epochs is not None:
            require_int(self.every_epochs, "evaluation.every_epochs", 1)
        require_int(self.rollouts_per_state, "evaluation.rollouts_per_state", 1)
        require_int(self.workers, "evaluation.workers", 0)
        if self.max_steps is not None:
            require_int(self.max_steps, "evaluation.max_steps", 1)


def _lora() -> LoraConfig:
    return LoraConfig(r=16, alpha=32, target_modules=_LORA_TARGETS)


@dataclass(frozen=True)
class EmbodiedSFTConfig:
    """Everything ``wmrl train embodied-sft`` does (see the module docstring for the shared keys).

    Attributes:
        epochs: passes over the demonstrations' (frame, action) samples.
        learning_rate: AdamW's learning rate.
        seed: sample order (a pure function of the seed and the epoch) and the policy's initialisation.
        microbatch_size: samples per forward pass.
        grad_accumulation: microbatches per optimiser step (samples per step = their product).
        weight_decay: AdamW's weight decay.
        max_grad_norm: global gradient-norm clip (``null``: none; the norm is logged either way).
        lora: adapters on the LLM (``enabled=false``: projector + LLM fully; the vision towers stay frozen).
        train_vision: also train the vision towers, fully. For a policy learned from scratch (the tiny
            random one): a frozen *random* tower leaves the policy only random image features. A
            pretrained MiniVLA keeps its towers frozen, as the official recipe does.
        policy: the VLA to fine-tune.
        data: the demonstrations.
        evaluation: the LIBERO evaluation hook.
        logging: trackers, progress, plots (``completions`` is refused: SFT has no rollouts).
        checkpoint: optimiser steps between checkpoints (``null``: only the last) and how many to keep.
        torch_threads: torch intra-op threads (``null``: torch's default).
    """

    #: Keys a resumed run may change, besides core's RESUMABLE.
    resumable: ClassVar[tuple[str, ...]] = ("epochs", "torch_threads", "evaluation")

    epochs: int = 5
    learning_rate: float = 1e-4
    seed: int = 0
    microbatch_size: int = 8
    grad_accumulation: int = 3
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    lora: LoraConfig = field(default_factory=_lora)
    train_vision: bool = False
    policy: SFTPolicySpec = field(default_factory=SFTPolicySpec)
    data: SFTDataConfig = field(default_factory=lambda: SFTDataConfig(paths=("demos",)))
    evaluation: SFTEvalConfig = field(default_factory=SFTEvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        require_int(self.epochs, "epochs", 1)
        require(
            self.lora.last_layers == 0,
            "lora.last_layers is not supported by the MiniVLA policy's adapters: set 0 (every layer)",
        )
        require(self.learning_rate > 0, f"learning_rate must be > 0; got {self.learning_rate}")
        require_int(self.seed, "seed", 0)
        require_int(self.microbatch_size, "microbatch_size", 1)
        require_int(self.grad_accumulation, "grad_accumulation", 1)
        require(self.weight_decay >= 0, f"weight_decay must be >= 0; got {self.weight_decay}")
        require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            f"max_grad_norm must be > 0 or null; got {self.max_grad_norm}",
        )
        require(not self.logging.completions, "logging.completions: SFT has no rollouts to tabulate")
        if self.torch_threads is not None:
            require_int(self.torch_threads, "torch_threads", 1)

    @property
    def samples_per_step(self) -> int:
        return self.microbatch_size * self.grad_accumulation

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def check_resume(self, saved: Mapping[str, Any]) -> None:
        """Refuse to resume a run saved with config ``saved`` if anything but the resumable keys differ."""
        refuse_resume_changes(saved, self.to_dict(), (*RESUMABLE, *self.resumable))


PRESETS: dict[str, dict[str, Any]] = {
    # The CPU smoke run: the tiny random MiniVLA on whatever demonstrations data.paths names, 64 px.
    "smoke": {
        "epochs": 2,
        "learning_rate": 1e-3,
        "microbatch_size": 4,
        "grad_accumulation": 2,
        "lora": {"enabled": True, "r": 4, "alpha": 8},
        "policy": {"source": "tiny"},
        "data": {"image_size": 64},
        "logging": {"report_to": []},
        "torch_threads": 1,
    },
}


def load_sft_config(
    config: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> EmbodiedSFTConfig:
    """Build the SFT config from a preset, a file or a dict, then ``key=value`` overrides."""
    return load_config(EmbodiedSFTConfig, config, overrides, PRESETS)
