"""MiniVLA: a Prismatic VLM (fused DINOv2 + SigLIP ViT, fused-GELU MLP projector, Qwen2.5 LLM) that writes actions.

Architecture (Prismatic ``prism-qwen25-extra-dinosiglip-224px+0_5b``, arch ``no-align+fused-gelu-mlp``):

* vision: two timm-compatible ViTs (:mod:`wmrl.embodied.policy.vit`) read the same 224 px image, each
  normalised its own way; the patch tokens of each one's *second-to-last* block are concatenated along
  the channel axis: ``(B, 256, 1024 + 1152 = 2176)``. Multi-image variants (openvla-mini's
  ``image_sequence_len > 1``: the ``-wrist`` checkpoints read the third-person and the wrist image)
  featurise each image alone with the same ViTs and concatenate the patch sequences in input order,
  ``(B, T·256, 2176)``, with no separator (openvla-mini's ``compute_sequence_patches``);
* projector (Prismatic's ``FusedMLPProjector``): ``Linear(2176, 4·2176) -> GELU -> Linear(8704, 896)
  -> GELU -> Linear(896, 896)``;
* LLM: ``transformers.Qwen2ForCausalLM`` (Qwen2.5-0.5B: 24 layers, width 896) whose vocabulary holds
  the 256 ``<|extra_i|>`` tokens appended by Prismatic (embedding rows padded to a multiple of 64);
* the projected patches are spliced into the token embeddings *after the first prompt token*, as in
  ``PrismaticVLM.forward``.

Sequences are assembled with **left padding** and explicit position ids (``cumsum(mask) - 1``), so the
last positions of every row line up: the 7 action-token logits of a batch are always its last 7
positions, during generation and when RL re-scores stored tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from wmrl.core.config import require
from wmrl.embodied.policy.vit import DINOV2_VITL14_REG4_224, SIGLIP_SO400M14_224, VisionTransformer, ViTConfig

__all__ = [
    "MINIVLA_1B",
    "QWEN25_05B",
    "DinoSigLIPBackbone",
    "FusedMLPProjector",
    "MiniVLA",
    "MiniVLAConfig",
    "padded_vocab_size",
]

# Qwen/Qwen2.5-0.5B's config.json (the fields a Qwen2Config needs); vocab_size is the embedding
# row count, 151 936 = 151 921 tokens (151 665 + 256 extra) padded to a multiple of 64.
QWEN25_05B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}


def padded_vocab_size(vocab_len: int, multiple: int = 64) -> int:
    """Embedding rows after Prismatic's ``resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)``."""
    return -(-vocab_len // multiple) * multiple


@dataclass(frozen=True)
class MiniVLAConfig:
    """Shape of a MiniVLA model.

    Attributes:
        dino, siglip: the two ViTs (same image size and patch grid).
        llm: keyword arguments of ``transformers.Qwen2Config`` (``vocab_size`` = embedding rows).
        projector_mult: first projector width = ``projector_mult * (dino + siglip width)`` (4 in Prismatic).
        action_dim: action tokens per step.
        n_bins: action bins (the extra tokens are the last ``n_bins`` ids of the tokenizer).
        name: a label for reports.
        image_sequence_len: images read per step (openvla-mini's setting of the same name): 1, or 2
            for the wrist-camera variant (third-person image, then wrist image).
    """

    dino: ViTConfig
    siglip: ViTConfig
    llm: Mapping[str, Any] = field(default_factory=lambda: dict(QWEN25_05B))
    projector_mult: int = 4
    action_dim: int = 7
    n_bins: int = 256
    name: str = "minivla"
    image_sequence_len: int = 1

    def __post_init__(self) -> None:
        require(
            self.dino.image_size == self.siglip.image_size,
            f"dino and siglip must read the same image size; got {self.dino.image_size} and {self.siglip.image_size}",
        )
        require(
            self.dino.num_patches == self.siglip.num_patches,
            "dino and siglip must produce the same number of patches (their features are concatenated per patch)",
        )
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
            require(key in self.llm, f"llm config needs {key!r}")
        require(self.action_dim > 0, "action_dim must be > 0")
        require(self.n_bins >= 2, "n_bins must be >= 2")
        require(
            self.llm["vocab_size"] > self.n_bins,
            "the LLM vocabulary must be larger than the number of action bins",
        )
        require(self.projector_mult > 0, "projector_mult must be > 0")
        require(
            isinstance(self.image_sequence_len, int) and self.image_sequence_len >= 1,
            f"image_sequence_len must be an integer >= 1; got {self.image_sequence_len!r}",
        )
        object.__setattr__(self, "llm", dict(self.llm))

    @property
    def image_size(self) -> int:
        return self.dino.image_size

    @property
    def vision_dim(self) -> int:
        return self.dino.embed_dim + self.siglip.embed_dim

    @property
    def llm_dim(self) -> int:
        return int(self.llm["hidden_size"])

    @property
    def num_patches(self) -> int:
        """Patches of one image."""
        return self.dino.num_patches

    @property
    def image_tokens(self) -> int:
        """Patch tokens a step's images put into the LLM's sequence (all ``image_sequence_len`` images)."""
        return self.dino.num_patches * self.image_sequence_len

    def with_vocab(self, vocab_size: int) -> MiniVLAConfig:
        return replace(self, llm={**self.llm, "vocab_size": vocab_size})

    def to_json(self) -> dict[str, Any]:
        from wmrl.core.config import to_dict

        return to_dict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MiniVLAConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown MiniVLAConfig keys: {sorted(unknown)}")
        kwargs = dict(data)
        kwargs["dino"] = ViTConfig(**data["dino"])
        kwargs["siglip"] = ViTConfig(**data["siglip"])
        return cls(**kwargs)


MINIVLA_1B = MiniVLAConfig(dino=DINOV2_VITL14_REG4_224, siglip=SIGLIP_SO400M14_224, name="minivla-1b")


class DinoSigLIPBackbone(nn.Module):
    """Both ViTs; ``forward`` returns the concatenated second-to-last-block patch features."""

    def __init__(self, dino: ViTConfig, siglip: ViTConfig) -> None:
        super().__init__()
        self.dino = VisionTransformer(dino)
        self.siglip = VisionTransformer(siglip)

    def forward(self, pixel_values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Concatenated patch features of one image or of a sequence of images per row.

        ``{"dino", "siglip"}`` each ``(B, 3, S, S)`` -> ``(B, P, D_dino + D_siglip)``, or each
        ``(B, T, 3, S, S)`` -> ``(B, T·P, D_dino + D_siglip)``: every image featurised alone, the
        sequences concatenated in image order.
        """
        missing = {"dino", "siglip"} - set(pixel_values)
        if missing:
            raise KeyError(f"pixel_values needs keys 'dino' and 'siglip'; missing {sorted(missing)}")
        dino, siglip = pixel_values["dino"], pixel_values["siglip"]
        if dino.ndim != siglip.ndim or dino.shape[:-3] != siglip.shape[:-3] or dino.ndim not in (4, 5):
            raise ValueError(
                "pixel_values must be (B, 3, S, S) or (B, T, 3, S, S) for both backbones; got "
                f"dino {tuple(dino.shape)}, siglip {tuple(siglip.shape)}"
            )
        lead = dino.shape[:-3]
        features = torch.cat(
            [
                self.dino.patch_features(dino.reshape(-1, *dino.shape[-3:])),
                self.siglip.patch_features(siglip.reshape(-1, *siglip.shape[-3:])),
            ],
            dim=2,
        )
        # (B·T, P, D) -> (B, T·P, D): each row's images' patches one after the other
        return features.reshape(lead[0], -1, features.shape[-1])


class FusedMLPProjector(nn.Module):
    """Prismatic's ``FusedMLPProjector``: three linear layers with GELU between them."""

    def __init__(self, vision_dim: int, llm_dim: int, mult: int = 4) -> None:
        super().__init__()
        hidden = vision_dim * mult
        self.fc1 = nn.Linear(vision_dim, hidden)
        self.fc2 = nn.Linear(hidden, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def _cache_kwarg(forward: Any) -> str:
    # transformers 5.x calls the KV cache argument ``cache``; 4.x called it ``past_key_values``.
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass
class _Assembled:
    embeds: torch.Tensor  # (B, T, H)
    mask: torch.Tensor  # (B, T) long, 0 on left padding
    positions: torch.Tensor  # (B, T) long


class MiniVLA(nn.Module):
    """The network: ``vision`` -> ``projector`` -> ``llm`` (a ``Qwen2ForCausalLM``)."""

    def __init__(self, config: MiniVLAConfig) -> None:
        super().__init__()
        from transformers import Qwen2Config, Qwen2ForCausalLM

        self.config = config
        self.vision = DinoSigLIPBackbone(config.dino, config.siglip)
        self.projector = FusedMLPProjector(config.vision_dim, config.llm_dim, config.projector_mult)
        llm_config = Qwen2Config(**config.llm)
        # fp32 SDPA runs everywhere; the checkpoint's dtype is chosen by the policy when loading.
        llm_config._attn_implementation = "sdpa"
        # a Qwen2ForCausalLM, or peft's model wrapping it once LoRA is applied
        self.llm: Any = Qwen2ForCausalLM(llm_config)
        self._cache_arg = _cache_kwarg(self.causal_lm().model.forward)

    # -- pieces ---------------------------------------------------------------------------------
    def causal_lm(self) -> Any:
        """The ``Qwen2ForCausalLM`` (under a peft wrapper when LoRA is applied; LoRA layers live inside it)."""
        llm = self.llm
        return llm.get_base_model() if hasattr(llm, "get_base_model") else llm

    def embed_images(self, pixel_values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(B, image_tokens, llm_dim)`` projected patch embeddings.

        Raises:
            ValueError: the rows carry another number of images than ``config.image_sequence_len``.
        """
        given = pixel_values["dino"].shape[1] if pixel_values["dino"].ndim == 5 else 1
        if given != self.config.image_sequence_len:
            raise ValueError(
                f"this MiniVLA reads {self.config.image_sequence_len} image(s) a step, got {given} "
                "(a wrist-camera model needs the wrist image too)"
            )
        return self.projector(self.vision(pixel_values))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.causal_lm().get_input_embeddings()(ids)

    def assemble(
        self,
        patches: torch.Tensor,
        prompt_ids: Sequence[Sequence[int]],
        suffix_ids: torch.Tensor | None = None,
    ) -> _Assembled:
        """Left-padded ``[tok_0, patches, tok_1..tok_n, suffix]`` rows with mask and position ids.

        Args:
            patches: ``(B, P, H)`` projected image patches.
            prompt_ids: B token-id lists (at least one token each).
            suffix_ids: optional ``(B, S)`` tokens appended after each prompt (teacher-forced actions).
        """
        b = patches.shape[0]
        if len(prompt_ids) != b:
            raise ValueError(f"{len(prompt_ids)} prompts for {b} images")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token (patches are inserted after the first)")
        device = patches.device
        suffix_len = 0 if suffix_ids is None else suffix_ids.shape[1]
        lengths = [len(p) + patches.shape[1] + suffix_len for p in prompt_ids]
        total = max(lengths)
        hidden = patches.shape[2]
        embeds = patches.new_zeros(b, total, hidden)
        mask = torch.zeros(b, total, dtype=torch.long, device=device)
        suffix_emb = self.embed_tokens(suffix_ids.to(device)) if suffix_ids is not None else None
        for i, prompt in enumerate(prompt_ids):
            tok = self.embed_tokens(torch.as_tensor(list(prompt), dtype=torch.long, device=device))
            parts = [tok[:1], patches[i], tok[1:]]
            if suffix_emb is not None:
                parts.append(suffix_emb[i])
            row = torch.cat(parts, dim=0)
            embeds[i, total - row.shape[0] :] = row
            mask[i, total - row.shape[0] :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return _Assembled(embeds, mask, positions)

    def hidden_states(self, inputs: _Assembled, cache: Any = None) -> torch.Tensor:
        """Last-layer hidden states ``(B, T, H)`` of the LLM for assembled inputs."""
        kwargs = {self._cache_arg: cache, "use_cache": cache is not None}
        out = self.causal_lm().model(
            inputs_embeds=inputs.embeds, attention_mask=inputs.mask, position_ids=inputs.positions, **kwargs
        )
        return out.last_hidden_state

    def logits(self, hidden: torch.Tensor, vocab_slice: slice | None = None) -> torch.Tensor:
        """LM-head logits for ``hidden`` (``(..., H)``), optionally only for a slice of the vocabulary.

        Restricting to the 256 action rows avoids the 151 936-wide head when sampling is constrained.
        """
        head = self.causal_lm().get_output_embeddings()
        if vocab_slice is None:
            return head(hidden)
        weight = head.weight[vocab_slice]
        bias = head.bias[vocab_slice] if getattr(head, "bias", None) is not None else None
        return nn.functional.linear(hidden, weight, bias)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()
