"""A tiny, random-initialised Robometer of the same architecture, for tests and CPU smoke runs.

Same Qwen3-VL structure (16-pixel patches, 2×2 merge, temporal patch 2, deepstack, interleaved
M-RoPE, tied embeddings), the same heads, prompt and special tokens; only widths, depths and the
vocabulary are small. Its tokenizer is the offline byte-level BPE of
:func:`wmrl.embodied.policy.tokenizer.byte_level_tokenizer` with the Qwen-VL chat/vision specials
and Robometer's five tokens: 256 byte ids + 12 specials = 268 ids (``<|image_pad|>`` = 261).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from wmrl.embodied.policy.tokenizer import byte_level_tokenizer
from wmrl.embodied.worldmodel.robometer_config import (
    QWEN_VL_SPECIAL_TOKENS,
    ROBOMETER_SPECIAL_TOKENS,
    RobometerConfig,
)

__all__ = ["TINY_ROBOMETER", "tiny_robometer_config", "tiny_robometer_tokenizer"]

_SPECIALS = (*QWEN_VL_SPECIAL_TOKENS, *ROBOMETER_SPECIAL_TOKENS)
_ID = {token: 256 + i for i, token in enumerate(_SPECIALS)}

TINY_ROBOMETER = RobometerConfig(
    backbone={
        "model_type": "qwen3_vl",
        "image_token_id": _ID["<|image_pad|>"],
        "video_token_id": _ID["<|video_pad|>"],
        "vision_start_token_id": _ID["<|vision_start|>"],
        "vision_end_token_id": _ID["<|vision_end|>"],
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_vl_text",
            "vocab_size": 256 + len(_SPECIALS),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        },
        "vision_config": {
            "model_type": "qwen3_vl_vision",
            "depth": 2,
            "hidden_size": 32,
            "hidden_act": "gelu_pytorch_tanh",
            "intermediate_size": 64,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0, 1],
        },
    },
    n_bins=10,
    name="tiny-robometer",
)


def tiny_robometer_config(patch_size: int = 16) -> RobometerConfig:
    """The tiny configuration with the vision tower cutting frames into ``patch_size``-pixel patches.

    16 is Qwen3-VL's (a 64 px frame: 4 LLM tokens after the 2x2 merge); 8 gives the same frame 16
    tokens, the resolution a world model needs to see small objects in small renders.
    """
    if patch_size == 16:
        return TINY_ROBOMETER
    if not isinstance(patch_size, int) or patch_size < 2:
        raise ValueError(f"patch_size must be an integer >= 2; got {patch_size!r}")
    backbone = dict(TINY_ROBOMETER.backbone)
    backbone["vision_config"] = dict(backbone["vision_config"], patch_size=patch_size)
    return dataclasses.replace(
        TINY_ROBOMETER,
        backbone=backbone,
        image=dataclasses.replace(TINY_ROBOMETER.image, patch_size=patch_size),
    )


def tiny_robometer_tokenizer() -> Any:
    """The tiny model's tokenizer (byte-level BPE + Qwen-VL specials + Robometer's tokens)."""
    tok = byte_level_tokenizer(_SPECIALS)
    if tok.convert_tokens_to_ids("<|image_pad|>") != _ID["<|image_pad|>"]:
        raise RuntimeError(
            "the tiny tokenizer's special-token ids moved; TINY_ROBOMETER no longer matches it"
        )
    return tok
