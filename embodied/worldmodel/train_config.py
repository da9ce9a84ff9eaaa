"""The typed configuration of ``wmrl train embodied-wm``: a Robometer trained on recorded episodes.

Why a config of its own: the world model is a supervised stage (no rollouts, no correction), like
SFT; the keys it shares with the other trainers keep their names and types from core
(``learning_rate``, ``seed``, ``logging``, ``torch_threads``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wmrl.core.config import load_config, require, require_int, to_dict
from wmrl.core.train_config import LoggingConfig

__all__ = ["PRESETS", "WorldModelTrainConfig", "load_wm_config"]


@dataclass(frozen=True)
class WorldModelTrainConfig:
    """Everything ``wmrl train embodied-wm`` does.

    Attributes:
        paths: LIBERO HDF5 files, or folders of them, whose episodes are trained on: successes
            (``wmrl embodied record-demos``) and failures (``--keep-failures``: a policy's failed
            episodes, perturbed expert runs with ``--action-noise``). Each episode must record
            whether it succeeded.
        held_out: HDF5 files or folders of episodes never trained on; the fidelity report is
            measured on them (``[]``: no held-out report, only the training episodes').
        init: ``tiny`` (the random tiny Robometer: same architecture, small widths) or a Robometer
            checkpoint folder to fine-tune (``Robometer.from_pretrained``).
        patch_size: ``init=tiny`` only: the vision tower's patch side in pixels (16 = Qwen3-VL's; 8
            gives a 64 px frame 16 tokens instead of 4). Saved in the checkpoint's config; the
            preprocessing of everything that loads it follows.
        camera: the camera whose frames it watches (the one the RL reward source reads).
        num_frames: frames per window, subsampled as the reward source subsamples an episode (8).
        windows_per_episode: windows drawn per episode per epoch: the whole episode, and prefixes
            of it ending at a uniform time in ``[min_window · T, T]`` (a prefix of a successful
            episode is an unfinished one: progress below 1, not a success).
        min_window: the shortest prefix, as a fraction of the episode's length.
        epochs: passes over the episodes.
        batch_size: windows per optimiser step.
        learning_rate, weight_decay: AdamW.
        max_grad_norm: global gradient-norm clip (``null``: none).
        progress_weight, success_weight: the weights of the two losses.
        seed: the model's initialisation (``init=tiny``), the windows and their order.
        bootstrap: resamples of the fidelity intervals.
        logging: trackers, progress bars, plots (``completions`` is refused: no rollouts).
        torch_threads: torch intra-op threads (``null``: torch's default).
    """

    paths: tuple[str, ...] = ("runs/demos/libero_hdf5",)
    held_out: tuple[str, ...] = ()
    init: str = "tiny"
    patch_size: int = 16
    camera: str = "agentview"
    num_frames: int = 8
    windows_per_episode: int = 4
    min_window: float = 0.3
    epochs: int = 30
    batch_size: int = 8
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0
    progress_weight: float = 1.0
    success_weight: float = 1.0
    seed: int = 0
    bootstrap: int = 1000
    logging: LoggingConfig = field(default_factory=lambda: LoggingConfig(report_to=()))
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        require(len(self.paths) > 0, "paths must name at least one HDF5 file or folder of episodes")
        require(bool(self.init), "init must be 'tiny' or a Robometer checkpoint folder")
        require_int(self.patch_size, "patch_size", 2)
        require(
            self.patch_size == 16 or self.init == "tiny",
            "patch_size is the tiny model's; a checkpoint (init=FOLDER) keeps its own vision tower",
        )
        require(bool(self.camera), "camera must name the camera the world model watches")
        require_int(self.num_frames, "num_frames", 2)
        require_int(self.windows_per_episode, "windows_per_episode", 1)
        require(0 < self.min_window <= 1, f"min_window must be in (0, 1]; got {self.min_window}")
        require_int(self.epochs, "epochs", 1)
        require_int(self.batch_size, "batch_size", 1)
        require(self.learning_rate > 0, f"learning_rate must be > 0; got {self.learning_rate}")
        require(self.weight_decay >= 0, f"weight_decay must be >= 0; got {self.weight_decay}")
        require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            f"max_grad_norm must be > 0 or null; got {self.max_grad_norm}",
        )
        require(
            self.progress_weight >= 0
            and self.success_weight >= 0
            and self.progress_weight + self.success_weight > 0,
            "progress_weight and success_weight must be >= 0 and not both 0",
        )
        require_int(self.seed, "seed", 0)
        require_int(self.bootstrap, "bootstrap", 0)
        require(not self.logging.completions, "logging.completions: this stage has no rollouts to tabulate")
        if self.torch_threads is not None:
            require_int(self.torch_threads, "torch_threads", 1)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


PRESETS: dict[str, dict[str, Any]] = {
    # A minute on a CPU: a few epochs of whatever paths names.
    "smoke": {"epochs": 2, "windows_per_episode": 2, "bootstrap": 100, "torch_threads": 1},
}


def load_wm_config(
    config: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> WorldModelTrainConfig:
    """Build the config from a preset, a file or a dict, then ``key=value`` overrides."""
    return load_config(WorldModelTrainConfig, config, overrides, PRESETS)
