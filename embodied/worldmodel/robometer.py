"""Robometer in this process: tokenizer + preprocessing + network, batched, on CPU or GPU.

``Robometer.from_pretrained(folder)`` loads a local Robometer checkpoint (see
:mod:`robometer_checkpoint` for the key mapping); ``Robometer.tiny()`` builds the random tiny model
for tests and CPU runs. ``predict`` implements :class:`~wmrl.embodied.worldmodel.backend.RobometerBackend`.
On a CPU use ``float32`` (bf16 matmuls are very slow on CPUs without AMX); on a GPU ``bfloat16``
(Robometer-4B's training dtype, about 9 GB of weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from wmrl.embodied.worldmodel.backend import FramePredictions, Trajectory
from wmrl.embodied.worldmodel.frames import check_frames
from wmrl.embodied.worldmodel.robometer_checkpoint import load_robometer_state, write_robometer_dir
from wmrl.embodied.worldmodel.robometer_config import ROBOMETER_SPECIAL_TOKENS, RobometerConfig
from wmrl.embodied.worldmodel.robometer_inputs import RobometerProcessor
from wmrl.embodied.worldmodel.robometer_model import RobometerModel, bins_to_progress, progress_std

__all__ = ["Robometer", "add_robometer_tokens"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_robometer_tokens(tokenizer: Any) -> Any:
    """Add Robometer's five special tokens (in Robometer's order) to a Qwen3-VL tokenizer that lacks them."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in ROBOMETER_SPECIAL_TOKENS if t not in vocab]
    if missing and len(missing) != len(ROBOMETER_SPECIAL_TOKENS):
        raise ValueError(
            f"the tokenizer holds some of Robometer's tokens but not {missing}; it was not made for Robometer"
        )
    for token in missing:
        tokenizer.add_special_tokens({"additional_special_tokens": [token]})
    return tokenizer


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()


def _empty_model(config: RobometerConfig) -> RobometerModel:
    """The network with parameters on the meta device when accelerate is there (no 2× memory while loading)."""
    try:
        from accelerate import init_empty_weights
    except ImportError:
        return RobometerModel(config)
    with init_empty_weights(include_buffers=False):
        return RobometerModel(config)


class Robometer:
    """The in-process Robometer backend.

    Args:
        model: the network.
        tokenizer: its tokenizer (Robometer's special tokens included).
        device, dtype: where and in which precision the network runs.
        batch_size: trajectories per forward pass.
    """

    name = "robometer-local"

    def __init__(
        self,
        model: RobometerModel,
        tokenizer: Any,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 4,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}; got {dtype!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} ids but the model only {model.config.vocab_size} embedding rows"
            )
        self.config = model.config
        self.processor = RobometerProcessor(tokenizer, model.config)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.dtype = _DTYPES[dtype]
        self.batch_size = batch_size
        self.model = model.to(device=self.device, dtype=self.dtype).eval()

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        tokenizer_path: str | Path | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 4,
    ) -> Robometer:
        """Load a local Robometer checkpoint folder (never the hub).

        Args:
            path: folder with ``config.json``, ``config.yaml`` and the safetensors weights.
            tokenizer_path: a local Qwen3-VL tokenizer folder; default ``path`` itself. Robometer's
                special tokens are added if missing, in Robometer's order.
        """
        path = Path(path)
        tok_dir = Path(tokenizer_path) if tokenizer_path is not None else path
        if not _has_tokenizer(tok_dir):
            raise FileNotFoundError(
                f"no tokenizer in {tok_dir}: pass tokenizer_path= a local copy of the Qwen/Qwen3-VL-4B-Instruct tokenizer"
            )
        from transformers import AutoTokenizer

        tokenizer = add_robometer_tokens(AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True))
        config, state = load_robometer_state(path, device="cpu")
        model = _empty_model(config)
        state = {k: v.to(_DTYPES[dtype]) for k, v in state.items()}
        ours = set(model.state_dict())
        missing, unexpected = sorted(ours - set(state)), sorted(set(state) - ours)
        if missing or unexpected:
            from wmrl.embodied.worldmodel.robometer_checkpoint import CheckpointKeyError

            raise CheckpointKeyError(
                f"{path} does not match the Robometer architecture: missing {missing[:20]}, unexpected {unexpected[:20]}"
            )
        model.load_state_dict(state, strict=True, assign=True)
        return cls(model, tokenizer, device=device, dtype=dtype, batch_size=batch_size)

    @classmethod
    def tiny(cls, seed: int = 0, patch_size: int = 16, **kwargs: Any) -> Robometer:
        """The random tiny model (:mod:`wmrl.embodied.worldmodel.tiny`), ``patch_size``-pixel patches."""
        from wmrl.embodied.worldmodel.tiny import tiny_robometer_config, tiny_robometer_tokenizer

        torch.manual_seed(seed)
        return cls(RobometerModel(tiny_robometer_config(patch_size)), tiny_robometer_tokenizer(), **kwargs)

    def save_pretrained(self, path: str | Path, max_shard_bytes: int | None = None) -> Path:
        """Write a Robometer-layout checkpoint folder (weights, config.json, config.yaml, tokenizer)."""
        return write_robometer_dir(
            path, self.model.state_dict(), self.config, self.tokenizer, max_shard_bytes=max_shard_bytes
        )

    # -- inference -----------------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, trajectories: Sequence[Trajectory]) -> list[FramePredictions]:
        """Per-frame progress, success probability and progress std for each ``(frames, task)``.

        Trajectories with invalid frames or task get an error entry; a failing forward pass marks
        its whole chunk of ``batch_size`` trajectories with the error.
        """
        results: list[FramePredictions | None] = [None] * len(trajectories)
        valid: list[int] = []
        for i, item in enumerate(trajectories):
            try:
                frames, task = item
                check_frames(frames, what=f"trajectory {i} frames")
                if not isinstance(task, str) or not task.strip():
                    raise ValueError(f"trajectory {i} needs a non-empty task string; got {task!r}")
                valid.append(i)
            except (ValueError, TypeError) as err:
                results[i] = FramePredictions.failed(f"invalid input: {err}")
        for start in range(0, len(valid), self.batch_size):
            chunk = valid[start : start + self.batch_size]
            try:
                outputs = self._forward([trajectories[i] for i in chunk])
            except Exception as err:  # a model crash marks the chunk unknown; it must not stop the run
                outputs = [FramePredictions.failed(f"forward failed: {type(err).__name__}: {err}")] * len(
                    chunk
                )
            for i, out in zip(chunk, outputs, strict=True):
                results[i] = out
        return [r if r is not None else FramePredictions.failed("not scored") for r in results]

    def _forward(self, batch: Sequence[Trajectory]) -> list[FramePredictions]:
        inputs = self.processor.encode(batch)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        logits = self.model(**inputs)
        out = []
        for prog, succ in zip(logits.progress, logits.success, strict=True):
            out.append(
                FramePredictions(
                    progress=bins_to_progress(prog).cpu().double().numpy(),
                    success=torch.sigmoid(succ.float()).cpu().double().numpy(),
                    progress_std=progress_std(prog).cpu().double().numpy(),
                )
            )
        return out

    def logits(self, trajectories: Sequence[Trajectory]) -> Any:
        """Raw head logits (:class:`RobometerLogits`) for valid trajectories (tests and diagnostics)."""
        inputs = {k: v.to(self.device) for k, v in self.processor.encode(trajectories).items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        with torch.no_grad():
            return self.model(**inputs)
