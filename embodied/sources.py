"""The embodied reward sources: the simulator's sparse success (anchor) and Robometer (world model).

Both grade *episodes*. An episode is anything with the three attributes of :class:`EpisodeLike`
(``wmrl.embodied.rollout.EpisodeRecord`` has them): ``instruction``, ``success`` (LIBERO's
``check_success`` at the end of the episode) and ``frames`` (camera name -> ``uint8 (N, H, W, 3)``
upright frames in time order, recorded when the rollout asked for them).

* :class:`SparseSuccessSource` (role ``anchor``): 1.0 if the simulator reported success, 0.0 if it
  reported failure, ``None`` if the episode carries no success flag. It is real execution: the
  expensive, trusted signal.
* :class:`RobometerSource` (role ``world_model``): the episode's frames from one camera, uniformly
  subsampled to ``num_frames`` (8) as Robometer was trained, go to a Robometer backend (in process or
  its HTTP server); the per-frame progress/success curves become one score by :class:`ScoreConfig`
  (``potential`` by default). It never reads ``success``. A failure anywhere (no frames, a crashed
  forward pass, a dead server, a malformed curve) is *unknown*: ``Grade(value=None)`` with the
  reason in ``info["reason"]`` and a status of ``no_frames``, ``invalid_episode``,
  ``backend_error`` or ``invalid_output``, never a default value.

Robometer is deterministic (no sampling), so it reports no per-call variance (``Grade.variance`` is
``None``): the core's fusion reads that field as noise that averages out across calls, which a
deterministic model does not have. The spread of its progress-bin distribution goes to
``info["progress_std"]`` for logging only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from wmrl.core.config import require
from wmrl.core.rollouts import RolloutNeeds
from wmrl.core.sources import Grade, NoiseModel, Role
from wmrl.embodied.worldmodel.backend import FramePredictions, RobometerBackend
from wmrl.embodied.worldmodel.frames import subsample_frames
from wmrl.embodied.worldmodel.scoring import SCORE_MODES, ScoreConfig, ScoreError, ScoreMode, episode_score

__all__ = [
    "EpisodeLike",
    "RobometerSource",
    "RobometerSourceConfig",
    "SparseSuccessSource",
    "make_robometer_source",
]


@runtime_checkable
class EpisodeLike(Protocol):
    """What the embodied sources read from an episode record."""

    instruction: str
    success: bool
    frames: Mapping[str, np.ndarray]


@dataclass
class SparseSuccessSource:
    """The anchor: LIBERO's sparse success flag, 1.0 or 0.0 (``None`` when the record has none)."""

    name: str = "libero_success"
    role: Role = Role.ANCHOR
    #: grading a finished episode again reads the same flag: the randomness is in the rollout, not here
    noise: NoiseModel = field(default_factory=NoiseModel.deterministic)

    def grade(self, items: Sequence[Any]) -> list[Grade]:
        grades = []
        for episode in items:
            success = getattr(episode, "success", None)
            if isinstance(success, (bool, np.bool_)):
                info = {k: getattr(episode, k) for k in ("steps", "truncated") if hasattr(episode, k)}
                grades.append(
                    Grade(1.0 if success else 0.0, status="success" if success else "failure", info=info)
                )
            else:
                reason = f"the episode has no boolean success flag (got {type(success).__name__})"
                grades.append(Grade(None, status="missing_success", info={"reason": reason}))
        return grades

    def score(self, items: Sequence[Any]) -> list[float | None]:
        return [g.value for g in self.grade(items)]


@dataclass
class RobometerSource:
    """The world model: Robometer's per-frame curves collapsed to one score per episode.

    Args:
        backend: a :class:`~wmrl.embodied.worldmodel.backend.RobometerBackend` (``Robometer`` in
            process or ``RobometerHTTPClient``).
        score_config: how curves become a score (default ``potential``, ``k = 3``).
        camera: which recorded camera Robometer watches (``agentview``, the third-person view).
        num_frames: frames subsampled uniformly from each episode (Robometer-4B's window: 8).
        name: the source's name in logs.
    """

    backend: RobometerBackend
    score_config: ScoreConfig = field(default_factory=ScoreConfig)
    camera: str = "agentview"
    num_frames: int = 8
    name: str = "robometer"
    role: Role = Role.WORLD_MODEL

    @property
    def needs(self) -> RolloutNeeds:
        """It watches ``num_frames`` frames of ``camera`` per episode (the trainer keeps just that window)."""
        return RolloutNeeds(frames=self.num_frames, camera=self.camera)

    def __post_init__(self) -> None:
        if not callable(getattr(self.backend, "predict", None)):
            raise TypeError("the Robometer backend needs a predict(trajectories) method")
        require(
            isinstance(self.num_frames, int) and self.num_frames >= 1,
            f"num_frames must be >= 1; got {self.num_frames!r}",
        )
        require(bool(self.camera), "camera must be a non-empty camera name")

    def _trajectory(self, episode: Any) -> tuple[tuple[np.ndarray, str], np.ndarray]:
        frames_by_camera = getattr(episode, "frames", None)
        if not isinstance(frames_by_camera, Mapping) or self.camera not in frames_by_camera:
            have = sorted(frames_by_camera) if isinstance(frames_by_camera, Mapping) else []
            raise LookupError(
                f"the episode has no frames from camera {self.camera!r} (recorded: {have}); "
                "run the rollout with record_frames=True and that camera rendered"
            )
        instruction = getattr(episode, "instruction", None)
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError(f"the episode needs a non-empty instruction; got {instruction!r}")
        frames, idx = subsample_frames(frames_by_camera[self.camera], self.num_frames)
        return (frames, instruction), idx

    def _grade_prediction(self, pred: FramePredictions, idx: np.ndarray, episode: Any) -> Grade:
        backend = getattr(self.backend, "name", type(self.backend).__name__)
        if pred.error is not None:
            return Grade(None, status="backend_error", info={"reason": pred.error, "backend": backend})
        info: dict[str, Any] = {
            "backend": backend,
            "mode": self.score_config.mode,
            "progress": pred.progress.tolist(),
            "success_prob": pred.success.tolist(),
            "frame_indices": idx.tolist(),
        }
        steps = getattr(episode, "frame_steps", None)
        if steps is not None and len(steps) > int(idx.max()):
            info["frame_steps"] = np.asarray(steps)[idx].tolist()
        if pred.progress_std is not None:
            info["progress_std"] = pred.progress_std.tolist()
        try:
            value = episode_score(
                pred.progress, pred.success if pred.success.size else None, self.score_config
            )
        except ScoreError as err:
            return Grade(None, status="invalid_output", info={**info, "reason": str(err)})
        return Grade(value, status="scored", info=info)

    def grade(self, items: Sequence[Any]) -> list[Grade]:
        grades: list[Grade | None] = [None] * len(items)
        batch, where, indices = [], [], []
        for i, episode in enumerate(items):
            try:
                trajectory, idx = self._trajectory(episode)
            except LookupError as err:
                grades[i] = Grade(None, status="no_frames", info={"reason": str(err)})
                continue
            except (ValueError, TypeError) as err:
                grades[i] = Grade(None, status="invalid_episode", info={"reason": str(err)})
                continue
            batch.append(trajectory)
            where.append(i)
            indices.append(idx)
        if batch:
            try:
                preds = list(self.backend.predict(batch))
                if len(preds) != len(batch):
                    raise RuntimeError(
                        f"the backend returned {len(preds)} predictions for {len(batch)} trajectories"
                    )
            except Exception as err:  # any backend failure is unknown, never a default score
                reason = f"{type(err).__name__}: {err}"
                preds = [FramePredictions.failed(reason)] * len(batch)
            for i, idx, pred in zip(where, indices, preds, strict=True):
                grades[i] = self._grade_prediction(pred, idx, items[i])
        return [g if g is not None else Grade(None, status="not_scored") for g in grades]

    def score(self, items: Sequence[Any]) -> list[float | None]:
        return [g.value for g in self.grade(items)]


@dataclass(frozen=True)
class RobometerSourceConfig:
    """Everything needed to build the Robometer reward source.

    Attributes:
        backend: ``local`` (a checkpoint in this process), ``http`` (Robometer's evaluation server)
            or ``tiny`` (the random tiny model, for smoke runs).
        model_path, tokenizer_path: local checkpoint and Qwen3-VL tokenizer folders (``local``).
        url, timeout_s, use_frame_steps: the server and how to call it (``http``).
        device, dtype, batch_size: how the in-process model runs (``local``/``tiny``).
        camera, num_frames: which frames Robometer watches.
        mode, k: the episode score (:class:`~wmrl.embodied.worldmodel.scoring.ScoreConfig`).
    """

    backend: Literal["local", "http", "tiny"] = "local"
    model_path: str | None = None
    tokenizer_path: str | None = None
    url: str | None = None
    timeout_s: float = 120.0
    use_frame_steps: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 4
    camera: str = "agentview"
    num_frames: int = 8
    mode: ScoreMode = "potential"
    k: int = 3

    def __post_init__(self) -> None:
        require(
            self.backend in ("local", "http", "tiny"),
            f"backend must be 'local', 'http' or 'tiny'; got {self.backend!r}",
        )
        require(
            self.backend != "local" or bool(self.model_path),
            "backend 'local' needs model_path (a local Robometer checkpoint)",
        )
        require(self.backend != "http" or bool(self.url), "backend 'http' needs url (the Robometer server)")
        require(self.timeout_s > 0, f"timeout_s must be > 0; got {self.timeout_s}")
        require(
            isinstance(self.batch_size, int) and self.batch_size >= 1,
            f"batch_size must be >= 1; got {self.batch_size}",
        )
        require(self.mode in SCORE_MODES, f"mode must be one of {SCORE_MODES}; got {self.mode!r}")
        ScoreConfig(mode=self.mode, k=self.k)  # validates k


def make_robometer_source(config: RobometerSourceConfig) -> RobometerSource:
    """Build the backend ``config`` names and wrap it as the world-model reward source."""
    backend: RobometerBackend
    if config.backend == "http":
        from wmrl.embodied.worldmodel.http_client import RobometerHTTPClient

        backend = RobometerHTTPClient(
            str(config.url),
            timeout_s=config.timeout_s,
            use_frame_steps=config.use_frame_steps,
            batch_size=config.batch_size,
        )
    else:
        from wmrl.embodied.worldmodel.robometer import Robometer

        options: dict[str, Any] = {
            "device": config.device,
            "dtype": config.dtype,
            "batch_size": config.batch_size,
        }
        if config.backend == "tiny":
            backend = Robometer.tiny(**options)
        else:
            backend = Robometer.from_pretrained(
                str(config.model_path), tokenizer_path=config.tokenizer_path, **options
            )
    return RobometerSource(
        backend=backend,
        score_config=ScoreConfig(mode=config.mode, k=config.k),
        camera=config.camera,
        num_frames=config.num_frames,
    )
