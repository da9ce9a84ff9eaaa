"""A tiny, random-initialised MiniVLA of the same architecture, for tests and CPU smoke runs.

Same image size (224), patch size (14, so 256 patches per backbone), register tokens, layer scale,
SigLIP attention-pool head, fused projector, Qwen2 decoder with tied embeddings and 256 extra action
tokens; only the widths and depths are small. Its tokenizer is the offline byte-level BPE of
:func:`~wmrl.embodied.policy.tokenizer.byte_level_tokenizer` with the three Qwen chat specials, so the
vocabulary is ``256 + 3 + 256 = 515`` ids, padded to 576 embedding rows as Prismatic pads to 64.
"""

from __future__ import annotations

from typing import Any

from wmrl.embodied.policy.minivla import MiniVLAConfig, padded_vocab_size
from wmrl.embodied.policy.tokenizer import add_extra_tokens, byte_level_tokenizer
from wmrl.embodied.policy.vit import ViTConfig

__all__ = ["TINY_DINO", "TINY_MINIVLA", "TINY_SIGLIP", "tiny_dataset_statistics", "tiny_tokenizer"]

TINY_DINO = ViTConfig(
    name="tiny-dinov2-reg4",
    image_size=224,
    patch_size=14,
    embed_dim=32,
    depth=3,
    num_heads=2,
    init_values=1e-5,
    reg_tokens=4,
    no_embed_class=True,
    global_pool="token",
)
TINY_SIGLIP = ViTConfig(
    name="tiny-siglip",
    image_size=224,
    patch_size=14,
    embed_dim=48,
    depth=3,
    num_heads=2,
    mlp_ratio=3.7362,
    class_token=False,
    global_pool="map",
)
TINY_VOCAB_LEN = 256 + 3 + 256
TINY_MINIVLA = MiniVLAConfig(
    dino=TINY_DINO,
    siglip=TINY_SIGLIP,
    llm={
        "vocab_size": padded_vocab_size(TINY_VOCAB_LEN),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": 256,
        "eos_token_id": 256,
    },
    name="tiny-minivla",
)


def tiny_tokenizer(with_extra_tokens: bool = True) -> Any:
    """The tiny model's tokenizer (byte-level BPE + Qwen chat specials [+ the 256 extra tokens])."""
    tok = byte_level_tokenizer()
    return add_extra_tokens(tok) if with_extra_tokens else tok


def tiny_dataset_statistics(name: str = "libero_10_no_noops") -> dict[str, Any]:
    """Placeholder action statistics in Prismatic's format for the *random* tiny model.

    They are made-up bounds of LIBERO's scale (translations ±0.94, rotations ±0.38, gripper not
    normalised), used only so that the tiny model exercises the real un-normalisation code.
    """
    q01 = [-0.9375, -0.9375, -0.9375, -0.375, -0.375, -0.375, 0.0]
    q99 = [0.9375, 0.9375, 0.9375, 0.375, 0.375, 0.375, 1.0]
    return {
        name: {
            "action": {
                "q01": q01,
                "q99": q99,
                "min": q01,
                "max": q99,
                "mean": [0.0] * 6 + [0.5],
                "std": [0.3] * 6 + [0.5],
                "mask": [True] * 6 + [False],
            },
            "num_transitions": 0,
            "num_trajectories": 0,
        }
    }
