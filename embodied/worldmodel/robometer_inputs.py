"""Turn (frames, task) trajectories into Robometer's model inputs, without torchvision.

What ``Qwen3VLProcessor`` + qwen-vl-utils do for Robometer's collator, done here in numpy/PIL:
transformers' ``Qwen3VLProcessor`` cannot be built without its torchvision video processor, and
torchvision cannot be installed next to the CPU torch this project uses (it pulls a CUDA torch).
Step by step, for every frame (``uint8 (H, W, 3)``, upright):

1. ``smart_resize`` (qwen-vl-utils' ``fetch_image``): sides rounded to the nearest multiple of
   ``patch_size · merge_size`` (32), area kept within ``[min_pixels, max_pixels]``; PIL bicubic
   resize only if the size changes (Robometer then calls the processor with ``do_resize=False``);
2. rescale by 1/255, normalise ``(x - mean) / std`` (mean = std = 0.5), float32, channels first;
3. patchify exactly as ``Qwen2VLImageProcessor`` does: the ``(3, H, W)`` image is cut into
   ``(gh/2, gw/2, 2, 2)`` groups of ``16×16`` patches (row-major groups, row-major inside a group),
   each patch repeated ``temporal_patch_size = 2`` times (a still image is a 2-frame clip) and
   flattened channel-major to ``3·2·16·16 = 1536`` values. ``image_grid_thw = (1, H/16, W/16)``.

The text is the Qwen3-VL chat template's rendering of Robometer's progress conversation (see
:mod:`robometer_config`), with each ``<|image_pad|>`` expanded to ``gh·gw/4`` copies as the processor
does, tokenised with the model's tokenizer (no special tokens added) and right-padded. The
``mm_token_type_ids`` row that transformers' M-RoPE needs marks image-pad tokens with 1.
``tests/embodied/test_robometer_inputs.py`` checks steps 1-3 against transformers' own
``Qwen2VLImageProcessorPil`` (which needs no torchvision) value for value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from wmrl.embodied.worldmodel.frames import check_frames
from wmrl.embodied.worldmodel.robometer_config import (
    PROG_TOKEN,
    QWEN_VL_SPECIAL_TOKENS,
    ImageConfig,
    RobometerConfig,
)

__all__ = ["RobometerProcessor", "patchify", "preprocess_frame", "smart_resize"]

_MAX_ASPECT = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """qwen-vl-utils' target size: both sides multiples of ``factor``, area in ``[min_pixels, max_pixels]``."""
    if max(height, width) / min(height, width) > _MAX_ASPECT:
        raise ValueError(f"frame aspect ratio must be below {_MAX_ASPECT}; got {height}x{width}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess_frame(frame: np.ndarray, image: ImageConfig) -> np.ndarray:
    """Steps 1-2: ``uint8 (H, W, 3)`` -> normalised ``float32 (3, H', W')`` at the smart-resized size."""
    height, width = frame.shape[:2]
    new_h, new_w = smart_resize(height, width, image.factor, image.min_pixels, image.max_pixels)
    if (new_h, new_w) != (height, width):
        from PIL import Image

        frame = np.asarray(Image.fromarray(frame).resize((new_w, new_h), Image.Resampling.BICUBIC))
    chw = frame.transpose(2, 0, 1).astype(np.float32) * np.float32(1 / 255)
    mean = np.asarray(image.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(image.image_std, dtype=np.float32)[:, None, None]
    return (chw - mean) / std


def patchify(chw: np.ndarray, image: ImageConfig) -> tuple[np.ndarray, int, int]:
    """Step 3: ``float32 (3, H, W)`` -> ``(gh·gw, 3·T·P·P)`` patch rows, ``gh = H/P``, ``gw = W/P``."""
    channels, height, width = chw.shape
    p, m, t = image.patch_size, image.merge_size, image.temporal_patch_size
    if height % (p * m) or width % (p * m):
        raise ValueError(
            f"a {height}x{width} frame is not a multiple of {p * m} pixels per side (resize first)"
        )
    gh, gw = height // p, width // p
    grid = chw.reshape(channels, gh // m, m, p, gw // m, m, p)
    grid = grid.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, P, P)
    grid = np.broadcast_to(grid[:, :, :, :, :, None], (*grid.shape[:5], t, p, p))
    return np.ascontiguousarray(grid.reshape(gh * gw, channels * t * p * p)), gh, gw


class RobometerProcessor:
    """Builds the model inputs for a batch of trajectories (see the module docstring).

    Args:
        tokenizer: a Qwen3-VL tokenizer holding Robometer's special tokens (or the tiny test tokenizer).
        config: the model's :class:`RobometerConfig`.
    """

    def __init__(self, tokenizer: Any, config: RobometerConfig) -> None:
        self.tokenizer = tokenizer
        self.config = config
        vocab = tokenizer.get_vocab()
        missing = [t for t in (*QWEN_VL_SPECIAL_TOKENS[1:6], PROG_TOKEN) if t not in vocab]
        if missing:
            raise ValueError(
                f"the Robometer tokenizer lacks the special tokens {missing}; load the tokenizer saved with the "
                "Robometer checkpoint (or add Robometer's tokens with add_robometer_tokens)"
            )
        self.image_pad_id = int(tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        self.prog_token_id = int(tokenizer.convert_tokens_to_ids(PROG_TOKEN))
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.convert_tokens_to_ids("<|endoftext|>"))
        backbone = config.backbone
        for key, token in (
            ("image_token_id", "<|image_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
        ):
            if key in backbone and int(backbone[key]) != int(tokenizer.convert_tokens_to_ids(token)):
                raise ValueError(
                    f"the backbone's {key}={backbone[key]} is not the tokenizer's id of {token} "
                    f"({tokenizer.convert_tokens_to_ids(token)}): tokenizer and model do not belong together"
                )

    def prompt_text(self, task: str, tokens_per_frame: Sequence[int]) -> str:
        """The chat text of one trajectory, image pads already expanded (one entry per frame)."""
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"the task instruction must be a non-empty string; got {task!r}")
        parts = ["<|im_start|>user\n", self.config.prompt.format(task=task)]
        for i, n in enumerate(tokens_per_frame, start=1):
            if self.config.add_vision_id:
                parts.append(f"Picture {i}: ")
            parts.append("<|vision_start|>" + "<|image_pad|>" * int(n) + "<|vision_end|>" + PROG_TOKEN)
        parts.append("<|im_end|>\n")
        return "".join(parts)

    def encode(self, trajectories: Sequence[tuple[np.ndarray, str]]) -> dict[str, torch.Tensor]:
        """Model inputs for B trajectories of ``uint8 (K_b, H, W, 3)`` frames and a task string each.

        Returns:
            ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``prog_mask`` (bool): ``(B, L)``;
            ``pixel_values`` ``float32 (N, 1536)`` over all frames' patches in order; ``image_grid_thw``
            ``int64 (ΣK_b, 3)``.
        """
        if len(trajectories) == 0:
            raise ValueError("encode needs at least one trajectory")
        image = self.config.image
        rows, grids, texts = [], [], []
        for b, (frames, task) in enumerate(trajectories):
            frames = check_frames(frames, what=f"trajectory {b} frames")
            counts = []
            for frame in frames:
                patches, gh, gw = patchify(preprocess_frame(frame, image), image)
                rows.append(patches)
                grids.append((1, gh, gw))
                counts.append(gh * gw // image.merge_size**2)
            texts.append(self.prompt_text(task, counts))
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        length = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(ids), length), dtype=torch.long)
        for b, seq in enumerate(ids):
            input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention_mask[b, : len(seq)] = 1
        image_tokens = (input_ids == self.image_pad_id) & attention_mask.bool()
        expected = sum(g[1] * g[2] for g in grids) // image.merge_size**2
        if int(image_tokens.sum()) != expected:
            raise ValueError(
                f"the tokenizer split <|image_pad|> into {int(image_tokens.sum())} ids for {expected} image tokens: "
                "<|image_pad|> must be a single special token"
            )
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "mm_token_type_ids": image_tokens.to(torch.int32),
            "prog_mask": (input_ids == self.prog_token_id) & attention_mask.bool(),
            "pixel_values": torch.from_numpy(np.concatenate(rows, axis=0)),
            "image_grid_thw": torch.tensor(grids, dtype=torch.long),
        }
