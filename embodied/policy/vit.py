"""Vision transformers whose parameter names and shapes are identical to timm's ``VisionTransformer``.

MiniVLA (a Prismatic VLM) encodes each image with two timm ViTs, DINOv2 ViT-L/14 with four register
tokens (``vit_large_patch14_reg4_dinov2.lvd142m``) and SigLIP So400m/14 (``vit_so400m_patch14_siglip_224``),
and concatenates the patch features of their *second-to-last* block. timm cannot be installed beside
the CPU torch this project pins, so the architecture is written here from timm 0.9.10's definition
(the version Prismatic pins): same module tree, same parameter names (``patch_embed.proj.weight``,
``cls_token``, ``reg_token``, ``pos_embed``, ``blocks.N.{norm1,attn.qkv,attn.proj,ls1.gamma,norm2,
mlp.fc1,mlp.fc2,ls2.gamma}``, ``norm``, ``attn_pool.*``), same shapes, same numerics (LayerNorm
eps 1e-6, exact-erf GELU, fused scaled-dot-product attention), so a timm state dict loads with
``strict=True`` and a Prismatic checkpoint's ``vision_backbone`` maps onto it one to one.

Conventions: images are ``float32`` tensors ``(B, 3, H, W)`` already normalised per backbone;
token tensors are ``(B, N, D)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from wmrl.core.config import require

__all__ = [
    "DINOV2_VITL14_REG4_224",
    "SIGLIP_SO400M14_224",
    "ViTConfig",
    "VisionTransformer",
    "resample_abs_pos_embed",
]


@dataclass(frozen=True)
class ViTConfig:
    """Hyper-parameters of a timm ``VisionTransformer`` (only the options the two backbones use).

    Attributes:
        name: timm model name this configuration mirrors (for messages and docs).
        image_size: input height = width in pixels.
        patch_size: square patch side in pixels; ``image_size`` must be a multiple of it.
        embed_dim: token width D.
        depth: number of transformer blocks.
        num_heads: attention heads; must divide ``embed_dim``.
        mlp_ratio: MLP hidden width = ``int(embed_dim * mlp_ratio)`` (timm truncates, e.g. 1152·3.7362 → 4304).
        class_token: prepend a learned class token.
        reg_tokens: number of learned register tokens after the class token (DINOv2-reg uses 4).
        no_embed_class: position embeddings cover patches only, prefix tokens get none (DINOv2-reg).
        init_values: layer-scale initial value; ``None`` disables layer scale (no ``ls*.gamma``).
        global_pool: ``"token"`` (class token), ``"map"`` (attention-pool head ``attn_pool``), ``"avg"`` or ``""``.
        norm_eps: LayerNorm epsilon (timm uses 1e-6 for ViTs).
    """

    name: str
    image_size: int
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0
    class_token: bool = True
    reg_tokens: int = 0
    no_embed_class: bool = False
    init_values: float | None = None
    global_pool: str = "token"
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        require(self.patch_size > 0, f"{self.name}: patch_size must be > 0, got {self.patch_size}")
        require(
            self.image_size > 0 and self.image_size % self.patch_size == 0,
            f"{self.name}: image_size ({self.image_size}) must be a positive multiple of patch_size ({self.patch_size})",
        )
        require(self.embed_dim > 0 and self.depth > 0, f"{self.name}: embed_dim and depth must be > 0")
        require(
            self.num_heads > 0 and self.embed_dim % self.num_heads == 0,
            f"{self.name}: num_heads ({self.num_heads}) must divide embed_dim ({self.embed_dim})",
        )
        require(self.mlp_ratio > 0, f"{self.name}: mlp_ratio must be > 0")
        require(self.reg_tokens >= 0, f"{self.name}: reg_tokens must be >= 0")
        require(
            self.global_pool in ("", "avg", "token", "map"),
            f"{self.name}: global_pool must be one of '', 'avg', 'token', 'map'; got {self.global_pool!r}",
        )
        require(
            self.class_token or self.global_pool != "token",
            f"{self.name}: global_pool='token' needs class_token=True",
        )

    @property
    def grid_size(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    @property
    def num_prefix_tokens(self) -> int:
        """Class token plus register tokens (the tokens Prismatic strips from the features)."""
        return int(self.class_token) + self.reg_tokens

    @property
    def mlp_hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    def resized(self, image_size: int) -> ViTConfig:
        """The same architecture at another input resolution (position embeddings are resampled on load)."""
        from dataclasses import replace

        return replace(self, image_size=image_size)


# The two timm models of Prismatic's "dinosiglip-vit-so-224px" backbone, at Prismatic's 224 px
# (``timm.create_model(name, num_classes=0, img_size=224)``).
DINOV2_VITL14_REG4_224 = ViTConfig(
    name="vit_large_patch14_reg4_dinov2.lvd142m",
    image_size=224,
    patch_size=14,
    embed_dim=1024,
    depth=24,
    num_heads=16,
    init_values=1e-5,
    reg_tokens=4,
    no_embed_class=True,
    global_pool="token",
)
SIGLIP_SO400M14_224 = ViTConfig(
    name="vit_so400m_patch14_siglip_224",
    image_size=224,
    patch_size=14,
    embed_dim=1152,
    depth=27,
    num_heads=16,
    mlp_ratio=3.7362,
    class_token=False,
    global_pool="map",
)


class PatchEmbed(nn.Module):
    """Non-overlapping patches by a strided convolution: ``(B, 3, H, W) -> (B, H/p · W/p, D)``."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.image_size = config.image_size
        self.proj = nn.Conv2d(3, config.embed_dim, kernel_size=config.patch_size, stride=config.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"expected images of {self.image_size}x{self.image_size} px, got {tuple(x.shape[-2:])}: "
                "resize them with the backbone's image transform first"
            )
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection (timm's ``Attention``)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class LayerScale(nn.Module):
    """Per-channel learned scale ``x * gamma`` (parameter name ``gamma``, as in timm)."""

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """``fc1 -> GELU (exact erf) -> fc2`` (timm's ``Mlp`` without dropout)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block with optional layer scale (timm's ``Block``)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        dim = config.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.attn = Attention(dim, config.num_heads)
        self.ls1 = LayerScale(dim, config.init_values) if config.init_values else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.mlp = Mlp(dim, config.mlp_hidden)
        self.ls2 = LayerScale(dim, config.init_values) if config.init_values else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class AttentionPoolLatent(nn.Module):
    """SigLIP's multi-head attention-pooling head (timm's ``AttentionPoolLatent``, one latent query).

    Prismatic keeps it in the checkpoint (timm builds it for ``global_pool='map'`` even with
    ``num_classes=0``) but never uses it: the VLM reads patch tokens of an earlier block.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        dim = config.embed_dim
        self.num_heads = config.num_heads
        self.head_dim = dim // config.num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=config.norm_eps)
        self.mlp = Mlp(dim, config.mlp_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, D) -> (B, D)``."""
        b, n, c = x.shape
        q = self.q(self.latent.expand(b, -1, -1)).reshape(b, 1, self.num_heads, self.head_dim).transpose(1, 2)
        kv = self.kv(x).reshape(b, n, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, 1, c)
        x = self.proj(x)
        x = x + self.mlp(self.norm(x))
        return x[:, 0]


def resample_abs_pos_embed(
    pos_embed: torch.Tensor, new_grid: int, num_prefix_tokens: int = 0, antialias: bool = True
) -> torch.Tensor:
    """Resize a square grid of absolute position embeddings, as timm does when loading at a new size.

    Bicubic interpolation with anti-aliasing (timm's ``resample_abs_pos_embed`` defaults), computed in
    float32; prefix (class/register) embeddings, if the table has any, are kept unchanged.

    Args:
        pos_embed: ``(1, P + G_old², D)`` where ``P = num_prefix_tokens``.
        new_grid: the new number of patches per side.
        num_prefix_tokens: leading rows that are not part of the grid.

    Returns:
        ``(1, P + new_grid², D)`` in the input dtype.
    """
    total = pos_embed.shape[1] - num_prefix_tokens
    old_grid = math.isqrt(total)
    if old_grid * old_grid != total:
        raise ValueError(f"position embedding grid of {total} tokens is not square")
    if old_grid == new_grid:
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    grid = grid.float().reshape(1, old_grid, old_grid, dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(new_grid, new_grid), mode="bicubic", antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, dim).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)


class VisionTransformer(nn.Module):
    """timm's ``VisionTransformer`` restricted to what DINOv2-reg and SigLIP need (no classifier head).

    Attribute registration order follows timm so ``state_dict()`` lists keys in timm's order.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        d = config.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if config.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, config.reg_tokens, d)) if config.reg_tokens else None
        embed_len = config.num_patches + (0 if config.no_embed_class else config.num_prefix_tokens)
        self.pos_embed = nn.Parameter(torch.randn(1, embed_len, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.depth)])
        # timm: final norm unless global_pool == "avg" (then fc_norm after pooling instead).
        self.norm = nn.LayerNorm(d, eps=config.norm_eps) if config.global_pool != "avg" else nn.Identity()
        self.attn_pool = AttentionPoolLatent(config) if config.global_pool == "map" else None
        self.fc_norm = nn.LayerNorm(d, eps=config.norm_eps) if config.global_pool == "avg" else nn.Identity()
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A random initialisation in timm's spirit (truncated normal, zero biases); for tiny test models."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=self.config.embed_dim**-0.5)

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        prefix = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        if self.config.no_embed_class:
            # DINOv2-reg: patches get position embeddings, then class/register tokens are prepended.
            x = x + self.pos_embed
            return torch.cat([*prefix, x], dim=1) if prefix else x
        if prefix:
            x = torch.cat([*prefix, x], dim=1)
        return x + self.pos_embed

    def block_outputs(self, pixels: torch.Tensor, last_block: int) -> torch.Tensor:
        """Tokens (prefix included) after block ``last_block`` (0-based); later blocks are not run.

        Returns:
            ``(B, num_prefix_tokens + num_patches, D)``, without the final norm.
        """
        if not 0 <= last_block < self.config.depth:
            raise ValueError(f"last_block must be in [0, {self.config.depth}); got {last_block}")
        x = self._pos_embed(self.patch_embed(pixels))
        # a slice of an nn.Sequential is an nn.Sequential (torch types __getitem__ as Sequential | Module)
        for block in cast(nn.Sequential, self.blocks[: last_block + 1]):
            x = block(x)
        return x

    def patch_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """Prismatic's featurizer: patch tokens of the second-to-last block, no final norm, prefix removed.

        This equals timm's ``get_intermediate_layers(x, n={depth - 2})[0]`` (what Prismatic
        monkey-patches in as ``forward``); the last block is skipped because its output is unused.

        Args:
            pixels: ``(B, 3, image_size, image_size)`` normalised images.

        Returns:
            ``(B, num_patches, embed_dim)``.
        """
        tokens = self.block_outputs(pixels, self.config.depth - 2)
        return tokens[:, self.config.num_prefix_tokens :]

    def forward_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """All blocks then the final norm (timm's ``forward_features``): ``(B, prefix + patches, D)``."""
        x = self.block_outputs(pixels, self.config.depth - 1)
        return self.norm(x)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pooled embedding ``(B, D)`` as timm's ``forward`` with ``num_classes=0``."""
        x = self.forward_features(pixels)
        if self.attn_pool is not None:
            x = self.attn_pool(x)
        elif self.config.global_pool == "avg":
            x = x[:, self.config.num_prefix_tokens :].mean(dim=1)
        elif self.config.global_pool:
            x = x[:, 0]
        return self.fc_norm(x)

    def load_timm_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load a timm state dict strictly, resampling ``pos_embed`` when it was saved at another size.

        Raises:
            RuntimeError: missing or unexpected keys, or a shape mismatch (from ``load_state_dict``).
        """
        state = dict(state_dict)
        pos = state.get("pos_embed")
        if pos is not None and pos.shape != self.pos_embed.shape:
            prefix = 0 if self.config.no_embed_class else self.config.num_prefix_tokens
            state["pos_embed"] = resample_abs_pos_embed(pos, self.config.grid_size, num_prefix_tokens=prefix)
        self.load_state_dict(state, strict=True)
