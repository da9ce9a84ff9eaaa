"""The tiny Robometer: input format, forward shapes, heads at the progress tokens, checkpoint key mapping."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from wmrl.embodied.worldmodel.robometer import Robometer, add_robometer_tokens
from wmrl.embodied.worldmodel.robometer_checkpoint import (
    CheckpointKeyError,
    ours_to_robometer,
    read_safetensors_dir,
    robometer_to_ours,
)
from wmrl.embodied.worldmodel.robometer_config import ROBOMETER_SPECIAL_TOKENS, ImageConfig, RobometerConfig
from wmrl.embodied.worldmodel.robometer_inputs import patchify, preprocess_frame, smart_resize
from wmrl.embodied.worldmodel.robometer_model import bins_to_progress
from wmrl.embodied.worldmodel.tiny import TINY_ROBOMETER

pytestmark = pytest.mark.transformers

TASK = "put both the alphabet soup and the tomato sauce in the basket"


@pytest.fixture(scope="module")
def robometer() -> Robometer:
    return Robometer.tiny(seed=0)


def _frames(seed: int, n: int = 8, h: int = 64, w: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


# -- input format -----------------------------------------------------------------------------------
def test_prompt_is_robometers_chat_text(robometer):
    text = robometer.processor.prompt_text("open the drawer", [2, 1])
    assert text == (
        "<|im_start|>user\nThe task for the robot is 'open the drawer'. Given the trajectory video, predict the "
        "task progress at each frame, how far along the robot is towards completing the task, a float between 0 "
        "and 1, where 0 is the starting state and 1 is when the task is completed. If the robot is not performing "
        "the same task, predict 0 progress."
        "Picture 1: <|vision_start|><|image_pad|><|image_pad|><|vision_end|><|prog_token|>"
        "Picture 2: <|vision_start|><|image_pad|><|vision_end|><|prog_token|><|im_end|>\n"
    )


def test_encoded_tokens_follow_the_text(robometer):
    enc = robometer.processor.encode([(_frames(0, n=3, h=64, w=96), TASK)])
    ids = enc["input_ids"][0]
    tok = robometer.tokenizer
    # a 64x96 frame is a 4x6 patch grid: 6 merged tokens, 24 patch rows of 3*2*16*16 values
    assert enc["image_grid_thw"].tolist() == [[1, 4, 6]] * 3
    assert enc["pixel_values"].shape == (3 * 24, 1536)
    assert int((ids == tok.convert_tokens_to_ids("<|image_pad|>")).sum()) == 18
    assert enc["prog_mask"][0].sum() == 3
    torch.testing.assert_close(
        enc["mm_token_type_ids"][0], (ids == tok.convert_tokens_to_ids("<|image_pad|>")).int()
    )
    expected = robometer.processor.prompt_text(TASK, [6, 6, 6])
    assert tok.decode(ids.tolist()) == expected
    # every progress token sits right after a <|vision_end|>
    prog = torch.nonzero(enc["prog_mask"][0]).flatten()
    assert (ids[prog - 1] == tok.convert_tokens_to_ids("<|vision_end|>")).all()


def test_smart_resize_closed_forms():
    f = ImageConfig()
    assert smart_resize(256, 256, f.factor, f.min_pixels, f.max_pixels) == (256, 256)
    assert smart_resize(128, 128, f.factor, f.min_pixels, f.max_pixels) == (128, 128)
    # sides rounded to multiples of 32: round(100/32) = 3, round(70/32) = 2
    assert smart_resize(100, 70, f.factor, f.min_pixels, f.max_pixels) == (96, 64)
    # below 4*32^2 pixels: scaled up by sqrt(4096 / (40*40)) = 1.6 and rounded up to multiples of 32
    assert smart_resize(40, 40, f.factor, f.min_pixels, f.max_pixels) == (64, 64)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(1, 500, f.factor, f.min_pixels, f.max_pixels)


@pytest.mark.parametrize("shape", [(128, 128), (64, 192), (100, 70)])
def test_pixel_values_match_transformers_qwen2vl_image_processor(shape):
    """Our numpy preprocessing == transformers' own Qwen2-VL image processor (the PIL backend, no torchvision)."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil as Reference,
        )
    except ImportError:  # transformers < 5 names its numpy/PIL processor differently
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor as Reference
    from PIL import Image

    image = ImageConfig()
    frame = np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8)
    ours, gh, gw = patchify(preprocess_frame(frame, image), image)
    # Robometer's path: qwen-vl-utils resizes the PIL image, then the processor runs with do_resize=False.
    h, w = smart_resize(*shape, image.factor, image.min_pixels, image.max_pixels)
    resized = np.asarray(Image.fromarray(frame).resize((w, h), Image.Resampling.BICUBIC))
    reference = Reference(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    out = reference(images=[resized], do_resize=False, return_tensors="np")
    assert out["image_grid_thw"].tolist() == [[1, gh, gw]]
    np.testing.assert_allclose(ours, out["pixel_values"], rtol=0, atol=1e-6)


# -- forward ------------------------------------------------------------------------------------------
def test_tiny_forward_shapes(robometer):
    trajectories = [(_frames(0), TASK), (_frames(1, n=5, h=96, w=64), "open the drawer")]
    logits = robometer.logits(trajectories)
    assert [p.shape for p in logits.progress] == [(8, 10), (5, 10)]
    assert [s.shape for s in logits.success] == [(8,), (5,)]
    preds = robometer.predict(trajectories)
    for pred, k in zip(preds, (8, 5), strict=True):
        assert pred.error is None
        assert pred.progress.shape == pred.success.shape == pred.progress_std.shape == (k,)
        assert np.all((pred.progress >= 0) & (pred.progress <= 1))
        assert np.all((pred.success > 0) & (pred.success < 1))


def test_heads_read_the_final_hidden_state_at_each_progress_token(robometer):
    enc = robometer.processor.encode([(_frames(2, n=4), TASK)])
    model = robometer.model
    with torch.no_grad():
        out = model.backbone(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            pixel_values=enc["pixel_values"],
            image_grid_thw=enc["image_grid_thw"],
            mm_token_type_ids=enc["mm_token_type_ids"],
            output_hidden_states=True,
        )
        # Robometer reads hidden_states[-1]; in transformers that is the normed last_hidden_state
        torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)
        positions = torch.nonzero(enc["prog_mask"][0]).flatten()
        expected = model.progress_head(out.last_hidden_state[0, positions])
        logits = model(**enc)
    torch.testing.assert_close(logits.progress[0], expected)


def test_a_frame_only_affects_its_own_and_later_progress_tokens(robometer):
    """The LLM is causal: the progress token after frame i sees frames 0..i only."""
    frames = _frames(3)
    changed = frames.copy()
    changed[5] = 255 - changed[5]
    before, after = robometer.predict([(frames, TASK), (changed, TASK)])
    np.testing.assert_allclose(before.progress[:5], after.progress[:5], atol=1e-6)
    assert (
        np.abs(before.progress[5:] - after.progress[5:]).max() > 0
        or np.abs(before.success[5:] - after.success[5:]).max() > 0
    )


def test_progress_is_the_bin_expectation_end_to_end():
    """With the last progress layer zeroed and its bias set, every frame's progress is the hand-computed expectation."""
    model = Robometer.tiny(seed=1)
    bias = torch.tensor([0.3, -1.0, 0.0, 2.0, 0.1, 0.0, 0.0, 1.0, -0.5, 0.7])
    with torch.no_grad():
        model.model.progress_head.fc_out.weight.zero_()
        model.model.progress_head.fc_out.bias.copy_(bias)
        model.model.success_head.fc_out.weight.zero_()
        model.model.success_head.fc_out.bias.fill_(math.log(0.25 / 0.75))
    exps = np.exp(bias.numpy().astype(np.float64))
    expected = float((exps / exps.sum() * np.linspace(0, 1, 10)).sum())
    pred = model.predict([(_frames(4, n=6), TASK)])[0]
    np.testing.assert_allclose(pred.progress, expected, atol=1e-6)
    np.testing.assert_allclose(pred.success, 0.25, atol=1e-6)


def test_batched_prediction_equals_one_at_a_time(robometer):
    trajectories = [
        (_frames(5, n=8), TASK),
        (_frames(6, n=3, h=128, w=128), "turn on the stove"),
        (_frames(7, n=8), TASK),
    ]
    together = robometer.predict(trajectories)
    for traj, batched in zip(trajectories, together, strict=True):
        alone = robometer.predict([traj])[0]
        np.testing.assert_allclose(batched.progress, alone.progress, atol=1e-5)
        np.testing.assert_allclose(batched.success, alone.success, atol=1e-5)


def test_invalid_trajectories_fail_alone(robometer):
    good = (_frames(8, n=4), TASK)
    preds = robometer.predict([good, (np.zeros((4, 8, 8)), TASK), (_frames(9, n=4), "")])
    assert preds[0].error is None
    assert "shape" in preds[1].error and "task" in preds[2].error
    assert preds[1].progress.size == 0


def test_tokenizer_and_model_must_belong_together(robometer):
    from wmrl.embodied.worldmodel.robometer_inputs import RobometerProcessor

    backbone = {**TINY_ROBOMETER.backbone, "image_token_id": 3}
    with pytest.raises(ValueError, match="image_token_id"):
        RobometerProcessor(robometer.tokenizer, RobometerConfig(backbone=backbone, name="x"))
    from wmrl.embodied.policy.tokenizer import byte_level_tokenizer

    with pytest.raises(ValueError, match="special tokens"):
        RobometerProcessor(byte_level_tokenizer(), TINY_ROBOMETER)


# -- checkpoints ------------------------------------------------------------------------------------
def test_checkpoint_round_trip_through_robometers_layout(robometer, tmp_path):
    folder = robometer.save_pretrained(tmp_path / "ckpt", max_shard_bytes=200_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    theirs = read_safetensors_dir(folder)
    assert "model.visual.patch_embed.proj.weight" in theirs
    assert "model.language_model.embed_tokens.weight" in theirs
    assert {
        "progress_head.0.weight",
        "progress_head.1.weight",
        "progress_head.4.bias",
        "frame_pool_attn.weight",
    } <= set(theirs)
    assert not any("fc_in" in k or k.startswith("backbone.") for k in theirs)
    assert theirs["progress_head.4.weight"].shape == (10, 32)
    loaded = Robometer.from_pretrained(folder)
    for key, value in robometer.model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[key], value, rtol=0, atol=0)
    trajectories = [(_frames(10), TASK)]
    a, b = robometer.predict(trajectories)[0], loaded.predict(trajectories)[0]
    np.testing.assert_array_equal(a.progress, b.progress)
    np.testing.assert_array_equal(a.success, b.success)


def test_key_mapping_table():
    t = torch.zeros(1)
    ours = robometer_to_ours(
        {
            "model.visual.blocks.0.attn.qkv.weight": t,
            "model.language_model.layers.3.mlp.up_proj.weight": t,
            "model.model.visual.merger.norm.weight": t,  # lerobot's re-export
            "model.model.language_model.norm.weight": t,
            "model.lm_head.weight": t,  # lerobot's tied LM head: dropped
            "progress_head.0.weight": t,
            "progress_head.1.bias": t,
            "success_head.4.weight": t,
            "preference_head.4.bias": t,
            "frame_pool_attn.weight": t,
        }
    )
    assert sorted(ours) == sorted(
        [
            "backbone.visual.blocks.0.attn.qkv.weight",
            "backbone.language_model.layers.3.mlp.up_proj.weight",
            "backbone.visual.merger.norm.weight",
            "backbone.language_model.norm.weight",
            "progress_head.fc_in.weight",
            "progress_head.norm.bias",
            "success_head.fc_out.weight",
            "preference_head.fc_out.bias",
            "frame_pool_attn.weight",
        ]
    )


def test_every_model_key_maps_both_ways(robometer):
    state = robometer.model.state_dict()
    assert robometer_to_ours(ours_to_robometer(state)).keys() == state.keys()


def test_unmapped_and_missing_keys_are_errors(robometer, tmp_path):
    with pytest.raises(CheckpointKeyError, match=r"progress_head\.2\.weight"):
        robometer_to_ours({"progress_head.2.weight": torch.zeros(1), "model.lm_head.bias": torch.zeros(1)})
    from safetensors.torch import save_file

    folder = robometer.save_pretrained(tmp_path / "ckpt")
    theirs = read_safetensors_dir(folder)
    del theirs["success_head.4.bias"]
    save_file(theirs, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointKeyError, match=r"success_head\.fc_out\.bias"):
        Robometer.from_pretrained(folder)


def test_lerobot_layout_loads_the_same_weights(robometer, tmp_path):
    from safetensors.torch import save_file

    folder = robometer.save_pretrained(tmp_path / "ckpt")
    theirs = read_safetensors_dir(folder)
    lerobot = {("model." + k if k.startswith("model.") else k): v for k, v in theirs.items()}
    lerobot["model.lm_head.weight"] = theirs["model.language_model.embed_tokens.weight"].clone()
    (folder / "model.safetensors").unlink()
    save_file(lerobot, str(folder / "model.safetensors"))
    loaded = Robometer.from_pretrained(folder)
    torch.testing.assert_close(
        loaded.model.progress_head.fc_out.weight, robometer.model.progress_head.fc_out.weight
    )


def test_unsupported_checkpoints_are_rejected(robometer, tmp_path):
    folder = robometer.save_pretrained(tmp_path / "ckpt")
    (folder / "config.yaml").write_text("loss:\n  progress_loss_type: l2\n")
    with pytest.raises(ValueError, match="progress_loss_type"):
        Robometer.from_pretrained(folder)
    (folder / "config.yaml").write_text("model:\n  use_per_frame_progress_token: false\n")
    with pytest.raises(ValueError, match="use_per_frame_progress_token"):
        Robometer.from_pretrained(folder)
    (folder / "config.yaml").unlink()
    (folder / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="PEFT"):
        Robometer.from_pretrained(folder)
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        Robometer.from_pretrained(folder, tokenizer_path=tmp_path)


def test_robometer_tokens_are_added_in_robometers_order():
    from wmrl.embodied.policy.tokenizer import byte_level_tokenizer

    tok = add_robometer_tokens(byte_level_tokenizer())
    ids = tok.convert_tokens_to_ids(list(ROBOMETER_SPECIAL_TOKENS))
    assert ids == list(range(len(tok) - 5, len(tok)))
    assert add_robometer_tokens(tok) is tok and len(tok) == 256 + 3 + 5  # idempotent


def test_config_json_round_trip_and_validation():
    assert RobometerConfig.from_json(TINY_ROBOMETER.to_json()) == TINY_ROBOMETER
    with pytest.raises(ValueError, match="unknown RobometerConfig keys"):
        RobometerConfig.from_json({**TINY_ROBOMETER.to_json(), "frames": 8})
    from wmrl.core.config import ConfigError

    with pytest.raises(ConfigError, match="patch_size"):
        RobometerConfig(backbone=TINY_ROBOMETER.backbone, image=ImageConfig(patch_size=14))
    with pytest.raises(ConfigError, match="n_bins"):
        RobometerConfig(backbone=TINY_ROBOMETER.backbone, n_bins=1)


def test_bins_to_progress_is_what_predict_reports(robometer):
    trajectories = [(_frames(11, n=4), TASK)]
    logits = robometer.logits(trajectories).progress[0]
    np.testing.assert_allclose(
        robometer.predict(trajectories)[0].progress, bins_to_progress(logits).numpy(), atol=1e-6
    )


def test_config_yaml_resized_size_is_read_and_not_applied_in_multi_image_mode(robometer, tmp_path):
    from wmrl.embodied.worldmodel.robometer_checkpoint import read_robometer_config

    folder = robometer.save_pretrained(tmp_path / "ckpt")
    assert read_robometer_config(folder).data_resized is None
    text = (folder / "config.yaml").read_text()
    (folder / "config.yaml").write_text(
        text.replace("resized_height: null", "resized_height: 128").replace(
            "resized_width: null", "resized_width: 96"
        )
    )
    assert read_robometer_config(folder).data_resized == (128, 96)
    loaded = Robometer.from_pretrained(folder)
    trajectories = [(_frames(3, n=3), TASK)]
    # Robometer's collator ignores the size in multi-image mode: the same frames give the same scores
    np.testing.assert_allclose(
        loaded.predict(trajectories)[0].progress, robometer.predict(trajectories)[0].progress, atol=1e-6
    )
    (folder / "config.yaml").write_text(text.replace("resized_height: null", "resized_height: 128"))
    with pytest.raises(ValueError, match="set together"):
        read_robometer_config(folder)
