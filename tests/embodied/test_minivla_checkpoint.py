"""Prismatic checkpoint directories: the explicit key mapping and a bit-identical round trip through the loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from wmrl.embodied.policy.minivla import MINIVLA_1B
from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy, MiniVLAPolicyConfig
from wmrl.embodied.policy.prismatic_checkpoint import (
    KEY_MAP,
    CheckpointKeyError,
    find_checkpoint,
    load_checkpoint_groups,
    load_mapped_state,
    ours_to_prismatic,
    prismatic_to_ours,
    read_run,
)

DATA = Path(__file__).parent / "data"
INSTRUCTION = "put both the alphabet soup and the tomato sauce in the basket"


@pytest.fixture(scope="module")
def policy() -> MiniVLAPolicy:
    return MiniVLAPolicy.tiny(seed=3)


@pytest.fixture(scope="module")
def run_dir(policy, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prismatic_run")
    policy.save_prismatic(path, step=1200)
    return path


def _frame(seed: int) -> dict[str, np.ndarray]:
    return {"agentview_image": np.random.default_rng(seed).integers(0, 256, (224, 224, 3), dtype=np.uint8)}


def test_written_checkpoint_uses_prismatic_and_timm_names(run_dir, policy):
    groups = load_checkpoint_groups(find_checkpoint(run_dir))
    assert set(groups) == {"vision_backbone", "projector", "llm_backbone"}
    timm = json.loads((DATA / "timm_vit_tiny_keys.json").read_text())
    expected_vision = [f"dino_featurizer.{k}" for k, _ in timm["tiny-dinov2-reg4"]] + [
        f"siglip_featurizer.{k}" for k, _ in timm["tiny-siglip"]
    ]
    assert list(groups["vision_backbone"]) == expected_vision
    assert set(groups["projector"]) == {f"projector.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")}
    hf_keys = set(policy.model.causal_lm().state_dict())
    assert set(groups["llm_backbone"]) == {f"llm.{k}" for k in hf_keys}
    assert "llm.lm_head.weight" in groups["llm_backbone"]  # tied head saved under both names, like FSDP
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["vla"]["action_tokenizer"] == "extra_action_tokenizer"


def test_every_key_is_mapped_both_ways(policy):
    ours = policy.base_state_dict()
    groups = ours_to_prismatic(ours)
    back = prismatic_to_ours(groups)
    assert set(back) == set(ours)
    for group, prefix, our_prefix in KEY_MAP:
        assert any(k.startswith(prefix) for k in groups[group]), (group, prefix)
        assert any(k.startswith(our_prefix) for k in ours), our_prefix


def test_unmapped_keys_are_listed():
    with pytest.raises(
        CheckpointKeyError, match=r"2 checkpoint keys.*mystery/\*, projector/projector\.6\.weight"
    ):
        prismatic_to_ours(
            {"projector": {"projector.6.weight": torch.zeros(1)}, "mystery": {"x": torch.zeros(1)}}
        )
    with pytest.raises(CheckpointKeyError, match=r"model keys have no mapping rule: head\.weight"):
        ours_to_prismatic({"head.weight": torch.zeros(1)})


def test_missing_and_unexpected_keys_are_errors(policy):
    state = {k: v.clone() for k, v in policy.base_state_dict().items()}
    extra = dict(state, **{"llm.model.layers.9.mlp.up_proj.weight": torch.zeros(1)})
    with pytest.raises(CheckpointKeyError, match=r"unexpected 1: llm\.model\.layers\.9"):
        load_mapped_state(policy.model, extra)
    missing = {k: v for k, v in state.items() if k != "projector.fc2.bias"}
    with pytest.raises(CheckpointKeyError, match=r"missing 1: projector\.fc2\.bias"):
        load_mapped_state(policy.model, missing)
    bad_shape = dict(state, **{"projector.fc3.bias": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"projector\.fc3\.bias"):
        load_mapped_state(policy.model, bad_shape)
    untied = dict(state, **{"llm.lm_head.weight": state["llm.model.embed_tokens.weight"] + 1})
    with pytest.raises(ValueError, match="ties its head"):
        load_mapped_state(policy.model, untied)


def test_checkpoint_without_vision_backbone(policy):
    state = {k: v.clone() for k, v in policy.base_state_dict().items() if not k.startswith("vision.")}
    with pytest.raises(CheckpointKeyError, match="frozen vision tower"):
        load_mapped_state(policy.model, state)
    load_mapped_state(policy.model, state, allow_missing_vision=True)


def test_round_trip_through_the_loader_is_bit_identical(policy, run_dir):
    loaded = MiniVLAPolicy.from_prismatic(run_dir)
    a, b = policy.base_state_dict(), loaded.base_state_dict()
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    obs = _frame(0)
    s1, s2 = policy.act(obs, INSTRUCTION), loaded.act(obs, INSTRUCTION)
    np.testing.assert_array_equal(s1.token_ids, s2.token_ids)
    np.testing.assert_array_equal(s1.action, s2.action)
    assert s1.log_prob == s2.log_prob
    ids = np.stack([s1.token_ids])
    assert torch.equal(
        policy.action_log_probs([obs], [INSTRUCTION], ids), loaded.action_log_probs([obs], [INSTRUCTION], ids)
    )
    sampling = MiniVLAPolicyConfig(temperature=1.0, seed=11)
    x, y = (
        policy.with_config(temperature=1.0, seed=11),
        MiniVLAPolicy.from_prismatic(run_dir, config=sampling),
    )
    x._generator.manual_seed(11)
    np.testing.assert_array_equal(x.act(obs, INSTRUCTION).token_ids, y.act(obs, INSTRUCTION).token_ids)


def test_find_checkpoint_and_run_parsing(tmp_path, run_dir):
    assert find_checkpoint(run_dir).name.startswith("step-001200")
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for step in (5, 20000, 150):
        (ckpts / f"step-{step:06d}-epoch-00-loss=0.1.pt").touch()
    assert find_checkpoint(tmp_path).name.startswith("step-020000")
    assert find_checkpoint(tmp_path, step=150).name.startswith("step-000150")
    with pytest.raises(FileNotFoundError, match="have steps"):
        find_checkpoint(tmp_path, step=7)


def _fake_run(tmp_path: Path, vla: dict) -> Path:
    (tmp_path / "checkpoints").mkdir(parents=True, exist_ok=True)
    (tmp_path / "checkpoints" / "step-000001-epoch-00-loss=inf.pt").touch()
    (tmp_path / "config.json").write_text(json.dumps({"vla": vla}))
    (tmp_path / "dataset_statistics.json").write_text("{}")
    return tmp_path


def test_read_run_knows_minivla_and_rejects_other_variants(tmp_path):
    base = {
        "base_vlm": "prism-qwen25-extra-dinosiglip-224px+0_5b",
        "action_tokenizer": "extra_action_tokenizer",
    }
    assert read_run(_fake_run(tmp_path, base)).model_config == MINIVLA_1B
    assert (
        read_run(
            _fake_run(tmp_path, dict(base, base_vlm="/runs/prism-qwen25-extra-dinosiglip-224px+0_5b"))
        ).model_config
        == MINIVLA_1B
    )
    with pytest.raises(NotImplementedError, match="VQ"):
        read_run(_fake_run(tmp_path, dict(base, action_tokenizer="libero_vq_extra_action_tokenizer")))
    # the -wrist variant: two images a step (third-person, wrist); a history (-t2) is not implemented
    wrist = dict(base, use_wrist_image=True, image_sequence_len=2)
    assert read_run(_fake_run(tmp_path, wrist)).model_config.image_sequence_len == 2
    for vla in (
        dict(base, image_sequence_len=2),
        dict(base, use_wrist_image=True),
        dict(wrist, image_sequence_len=4),
    ):
        with pytest.raises(NotImplementedError, match="history"):
            read_run(_fake_run(tmp_path, vla))
    with pytest.raises(ValueError, match="unknown base_vlm"):
        read_run(_fake_run(tmp_path, dict(base, base_vlm="prism-dinosiglip+7b")))


def test_base_vlm_given_as_a_snapshot_folder_is_resolved_as_upstream(tmp_path):
    # openvla-mini's load_vla: a base_vlm folder -> its config.json["model"]["model_id"]
    snapshot = tmp_path / "hub" / "models--Stanford-ILIAD--prism-qwen25" / "snapshots" / "0a1b2c"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(
        json.dumps({"model": {"model_id": "prism-qwen25-extra-dinosiglip-224px+0_5b"}})
    )
    vla = {"base_vlm": str(snapshot), "action_tokenizer": "extra_action_tokenizer"}
    assert read_run(_fake_run(tmp_path / "run", vla)).model_config == MINIVLA_1B
    gone = dict(vla, base_vlm="/elsewhere/snapshots/0a1b2c")  # copied from another machine
    with pytest.raises(ValueError, match="not on this machine"):
        read_run(_fake_run(tmp_path / "run2", gone))
    assert read_run(_fake_run(tmp_path / "run2", gone), base_vlm="prism-qwen25-extra-dinosiglip-224px+0_5b")
    (snapshot / "config.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(ValueError, match="model_id"):
        read_run(_fake_run(tmp_path / "run3", vla))


def test_policy_json_minivla_type_loads_saved_folders_and_prismatic_runs(policy, run_dir, tmp_path):
    from wmrl.embodied.eval.policy_loader import load_policy

    obs, task = _frame(0), INSTRUCTION
    # a Prismatic run directory with a policy.json next to its config.json
    (run_dir / "policy.json").write_text(json.dumps({"type": "minivla", "kwargs": {"step": 1200}}))
    loaded = load_policy(run_dir, unnorm_key="libero_10")  # tiny statistics are libero_10_no_noops: fallback
    np.testing.assert_array_equal(loaded.act(obs, task).token_ids, policy.act(obs, task).token_ids)
    assert loaded.config.device == "cpu" and loaded.config.dtype == "float32"  # auto on a CPU
    # statistics of another suite are an error, not a silent use
    with pytest.raises(KeyError, match="libero_90"):
        load_policy(run_dir, unnorm_key="libero_90")
    # a saved folder round-trips the observation contract, and auto device/dtype are stored
    saved = policy.with_config(orientation="rotate180", render_size=224, jpeg_quality=95)
    saved.save(tmp_path / "saved")
    meta = json.loads((tmp_path / "saved" / "minivla.json").read_text())["policy"]
    assert (meta["device"], meta["dtype"], meta["render_size"]) == ("auto", "auto", 224)
    back = load_policy(tmp_path / "saved", temperature=0.0)
    assert back.observation_contract == {
        "camera": "agentview", "wrist_camera": None, "orientation": "rotate180", "render_size": 224, "jpeg_quality": 95,
    }  # fmt: skip
    with pytest.raises(ValueError, match="apply to Prismatic run directories"):
        load_policy(tmp_path / "saved", step=3)


def test_jpeg_round_trip_changes_pixels_like_a_codec_and_is_applied_before_preprocessing(policy):
    from wmrl.embodied.policy.image_transforms import jpeg_round_trip

    frame = _frame(1)["agentview_image"]
    back = jpeg_round_trip(frame, 95)
    assert back.shape == frame.shape and back.dtype == np.uint8 and not np.array_equal(back, frame)
    np.testing.assert_array_equal(jpeg_round_trip(frame, 95), back)  # deterministic
    with_jpeg = policy.with_config(jpeg_quality=95)
    np.testing.assert_allclose(
        with_jpeg.pixel_values([{"agentview_image": frame}])["dino"].numpy(),
        policy.pixel_values([{"agentview_image": back}])["dino"].numpy(),
    )
