"""The timm-compatible ViTs: parameter names/shapes, sizes of the real backbones, numerics, pos-embed resampling."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from wmrl.core.config import ConfigError
from wmrl.embodied.policy.tiny import TINY_DINO, TINY_SIGLIP
from wmrl.embodied.policy.vit import (
    DINOV2_VITL14_REG4_224,
    SIGLIP_SO400M14_224,
    VisionTransformer,
    ViTConfig,
    resample_abs_pos_embed,
)

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("config", [TINY_DINO, TINY_SIGLIP], ids=lambda c: c.name)
def test_tiny_state_dict_matches_timm_names_and_shapes(config):
    expected = json.loads((DATA / "timm_vit_tiny_keys.json").read_text())[config.name]
    got = [[k, list(v.shape)] for k, v in VisionTransformer(config).state_dict().items()]
    assert got == expected


def _param_count(config: ViTConfig) -> int:
    with torch.device("meta"):
        model = VisionTransformer(config)
    return sum(p.numel() for p in model.parameters())


def test_real_backbones_have_timms_published_parameter_counts():
    # timm's results/benchmark-*.csv list param_count (millions): vit_so400m_patch14_siglip_224 427.68
    # at 224 px; vit_large_patch14_reg4_dinov2 304.37 at its native 518 px.
    assert round(_param_count(SIGLIP_SO400M14_224) / 1e6, 2) == 427.68
    assert round(_param_count(DINOV2_VITL14_REG4_224.resized(518)) / 1e6, 2) == 304.37
    # At Prismatic's 224 px only the position table shrinks: 37² -> 16² rows of 1024.
    assert (
        _param_count(DINOV2_VITL14_REG4_224)
        == _param_count(DINOV2_VITL14_REG4_224.resized(518)) - (37**2 - 16**2) * 1024
    )


def test_real_backbone_key_layout():
    with torch.device("meta"):
        dino = VisionTransformer(DINOV2_VITL14_REG4_224).state_dict()
        siglip = VisionTransformer(SIGLIP_SO400M14_224).state_dict()
    assert dino["reg_token"].shape == (1, 4, 1024) and dino["pos_embed"].shape == (1, 256, 1024)
    assert dino["blocks.23.ls2.gamma"].shape == (1024,) and "blocks.24.norm1.weight" not in dino
    assert "cls_token" not in siglip and siglip["pos_embed"].shape == (1, 256, 1152)
    assert siglip["blocks.26.mlp.fc1.weight"].shape == (4304, 1152)
    assert siglip["attn_pool.kv.weight"].shape == (2304, 1152)


def _reference_tokens(model: VisionTransformer, pixels: torch.Tensor, last_block: int) -> torch.Tensor:
    """timm's ``_intermediate_layers`` written out with explicit math (non-fused attention, erf GELU)."""
    c, sd = model.config, model.state_dict()
    d, p = c.embed_dim, c.patch_size
    patches = F.unfold(pixels, kernel_size=p, stride=p).transpose(1, 2)  # (B, N, 3·p·p)
    x = patches @ sd["patch_embed.proj.weight"].reshape(d, -1).T + sd["patch_embed.proj.bias"]
    prefix = []
    if c.class_token:
        prefix.append(sd["cls_token"].expand(x.shape[0], -1, -1))
    if c.reg_tokens:
        prefix.append(sd["reg_token"].expand(x.shape[0], -1, -1))
    if c.no_embed_class:
        x = torch.cat([*prefix, x + sd["pos_embed"]], dim=1)
    else:
        x = torch.cat([*prefix, x], dim=1) + sd["pos_embed"]

    def ln(t, name):
        mu = t.mean(-1, keepdim=True)
        var = ((t - mu) ** 2).mean(-1, keepdim=True)
        return (t - mu) / torch.sqrt(var + 1e-6) * sd[name + ".weight"] + sd[name + ".bias"]

    def gelu(t):
        return 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))

    h = c.num_heads
    for i in range(last_block + 1):
        b = f"blocks.{i}."
        y = ln(x, b + "norm1")
        qkv = y @ sd[b + "attn.qkv.weight"].T + sd[b + "attn.qkv.bias"]
        q, k, v = qkv.reshape(x.shape[0], x.shape[1], 3, h, d // h).permute(2, 0, 3, 1, 4)
        att = torch.softmax((q * (d // h) ** -0.5) @ k.transpose(-2, -1), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(x.shape) @ sd[b + "attn.proj.weight"].T + sd[
            b + "attn.proj.bias"
        ]
        x = x + (y * sd[b + "ls1.gamma"] if c.init_values else y)
        y = ln(x, b + "norm2")
        y = gelu(y @ sd[b + "mlp.fc1.weight"].T + sd[b + "mlp.fc1.bias"])
        y = y @ sd[b + "mlp.fc2.weight"].T + sd[b + "mlp.fc2.bias"]
        x = x + (y * sd[b + "ls2.gamma"] if c.init_values else y)
    return x


@pytest.mark.parametrize("config", [TINY_DINO, TINY_SIGLIP], ids=lambda c: c.name)
def test_patch_features_are_second_to_last_block_without_prefix_or_norm(config):
    torch.manual_seed(0)
    model = VisionTransformer(config).eval()
    with torch.no_grad():  # make layer scale non-trivial so a missing gamma would show
        for name, param in model.named_parameters():
            if name.endswith("gamma"):
                param.uniform_(0.5, 1.5)
    pixels = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        feats = model.patch_features(pixels)
        ref = _reference_tokens(model, pixels, config.depth - 2)[:, config.num_prefix_tokens :]
    assert feats.shape == (2, 256, config.embed_dim)
    torch.testing.assert_close(feats, ref, rtol=1e-4, atol=1e-5)


def test_siglip_pooled_output_matches_attention_pool_reference():
    torch.manual_seed(1)
    model = VisionTransformer(TINY_SIGLIP).eval()
    sd = model.state_dict()
    pixels = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        pooled = model(pixels)
        x = _reference_tokens(model, pixels, TINY_SIGLIP.depth - 1)
        x = F.layer_norm(x, (48,), sd["norm.weight"], sd["norm.bias"], eps=1e-6)
        q = (sd["attn_pool.latent"] @ sd["attn_pool.q.weight"].T + sd["attn_pool.q.bias"]).reshape(
            1, 1, 2, 24
        )
        kv = (x @ sd["attn_pool.kv.weight"].T + sd["attn_pool.kv.bias"]).reshape(1, -1, 2, 2, 24)
        k, v = kv[:, :, 0], kv[:, :, 1]
        att = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(24), dim=-1)
        y = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(1, 1, 48)
        y = y @ sd["attn_pool.proj.weight"].T + sd["attn_pool.proj.bias"]
        z = F.layer_norm(y, (48,), sd["attn_pool.norm.weight"], sd["attn_pool.norm.bias"], eps=1e-6)
        z = F.gelu(z @ sd["attn_pool.mlp.fc1.weight"].T + sd["attn_pool.mlp.fc1.bias"])
        ref = (y + z @ sd["attn_pool.mlp.fc2.weight"].T + sd["attn_pool.mlp.fc2.bias"])[:, 0]
    torch.testing.assert_close(pooled, ref, rtol=1e-4, atol=1e-5)


def test_timm_state_dict_at_another_resolution_is_resampled_on_load():
    small = VisionTransformer(TINY_DINO.resized(112))  # 8x8 patch grid
    big = VisionTransformer(TINY_DINO)  # 16x16
    state = small.state_dict()
    with torch.no_grad():
        state["pos_embed"] = torch.full_like(state["pos_embed"], 0.25)
    big.load_timm_state_dict(state)
    assert big.pos_embed.shape == (1, 256, 32)
    # Interpolating a constant field gives the same constant (bicubic weights sum to one).
    torch.testing.assert_close(big.pos_embed, torch.full((1, 256, 32), 0.25))
    torch.testing.assert_close(big.blocks[0].attn.qkv.weight, small.blocks[0].attn.qkv.weight)


def test_resample_keeps_prefix_rows_and_identity_at_same_size():
    pos = torch.randn(1, 1 + 16, 8)
    assert resample_abs_pos_embed(pos, 4, num_prefix_tokens=1) is pos
    out = resample_abs_pos_embed(pos, 6, num_prefix_tokens=1)
    assert out.shape == (1, 37, 8)
    torch.testing.assert_close(out[:, :1], pos[:, :1])
    with pytest.raises(ValueError, match="not square"):
        resample_abs_pos_embed(torch.randn(1, 15, 8), 4)


def test_load_rejects_unexpected_keys_and_wrong_image_size():
    model = VisionTransformer(TINY_DINO)
    state = dict(model.state_dict())
    state["head.weight"] = torch.zeros(3, 32)
    with pytest.raises(RuntimeError, match=r"head\.weight"):
        model.load_timm_state_dict(state)
    with pytest.raises(ValueError, match="224x224"):
        model.patch_features(torch.zeros(1, 3, 112, 112))


def test_config_rules_are_enforced():
    with pytest.raises(ConfigError, match="multiple of patch_size"):
        ViTConfig(name="bad", image_size=225, patch_size=14, embed_dim=32, depth=2, num_heads=2)
    with pytest.raises(ConfigError, match="must divide"):
        ViTConfig(name="bad", image_size=224, patch_size=14, embed_dim=30, depth=2, num_heads=4)
    with pytest.raises(ConfigError, match="class_token"):
        ViTConfig(
            name="bad", image_size=224, patch_size=14, embed_dim=32, depth=2, num_heads=2, class_token=False
        )
