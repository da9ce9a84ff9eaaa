"""The MiniVLA policy: preprocessing, acting, RL log-probs (consistency, gradients), LoRA, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from wmrl.core.config import ConfigError
from wmrl.embodied.policy.base import ActionStep, TrainablePolicy, VLAPolicy
from wmrl.embodied.policy.image_transforms import DINO_MEAN, DINO_STD, DinoSigLIPTransform, center_crop_resize
from wmrl.embodied.policy.minivla_policy import LORA_TARGETS, MiniVLAPolicy, MiniVLAPolicyConfig

SHORT, LONG = "open the top drawer", "put both the alphabet soup and the cream cheese box in the basket"


@pytest.fixture(scope="module")
def policy() -> MiniVLAPolicy:
    return MiniVLAPolicy.tiny(seed=0)


def _obs(seed: int, size: int = 224) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "agentview_image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "state": np.zeros(8, np.float32),
    }


# -- preprocessing -------------------------------------------------------------------------------------
def test_uniform_frame_normalises_to_the_closed_form_at_any_size():
    for size, crop in ((224, False), (256, True), (128, True)):
        out = DinoSigLIPTransform(center_crop=crop)(np.full((size, size, 3), 128, np.uint8))
        assert out["dino"].shape == out["siglip"].shape == (3, 224, 224)
        dino = (torch.tensor(128 / 255) - torch.tensor(DINO_MEAN)) / torch.tensor(DINO_STD)
        torch.testing.assert_close(out["dino"], dino.view(3, 1, 1).expand(3, 224, 224))
        torch.testing.assert_close(out["siglip"], torch.full((3, 224, 224), (128 / 255 - 0.5) / 0.5))


def test_224_frame_without_crop_is_only_rescaled():
    frame = _obs(1)["agentview_image"]
    out = DinoSigLIPTransform(center_crop=False)(frame)
    expected = (torch.from_numpy(frame).permute(2, 0, 1).float() / 255 - 0.5) / 0.5
    assert torch.equal(out["siglip"], expected)


def test_center_crop_removes_the_border():
    # sqrt(0.9)·224 = 212.5 -> a 212 px crop starting at row/column 6: a 6 px red frame disappears.
    frame = np.zeros((224, 224, 3), np.uint8)
    frame[..., 2] = 255
    frame[:6, :, :] = frame[-6:, :, :] = frame[:, :6, :] = frame[:, -6:, :] = (255, 0, 0)
    out = np.asarray(center_crop_resize(Image.fromarray(frame)))
    assert out.shape == (224, 224, 3) and out[..., 0].max() == 0


def test_frames_must_be_uint8_rgb():
    with pytest.raises(ValueError, match="uint8"):
        DinoSigLIPTransform()(np.zeros((224, 224, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        DinoSigLIPTransform()(np.zeros((224, 224), np.uint8))


# -- acting ------------------------------------------------------------------------------------------------
def test_prompt_is_prismatics_qwen_prompt(policy):
    assert policy.prompt("Open The Drawer") == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat action should the robot take to open the drawer?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_policy_implements_the_protocols(policy):
    assert isinstance(policy, VLAPolicy) and isinstance(policy, TrainablePolicy)


def test_act_returns_a_valid_step(policy):
    step = policy.act(_obs(0, size=256), SHORT)
    assert isinstance(step, ActionStep)
    assert step.action.shape == (7,) and step.action.dtype == np.float32
    assert step.action[-1] in (-1.0, 1.0)
    first, last = policy.action_tokenizer.token_range
    assert step.token_ids.shape == (7,) and np.all((step.token_ids >= first) & (step.token_ids <= last))
    assert np.isfinite(step.log_prob) and step.log_prob < 0
    assert abs(step.log_prob - step.info["token_log_probs"].sum()) < 1e-4


def test_missing_image_key_is_a_clear_error(policy):
    with pytest.raises(KeyError, match="image_key"):
        policy.act({"wrist": np.zeros((224, 224, 3), np.uint8)}, SHORT)


@pytest.mark.parametrize("temperature", [0.0, 1.3])
@pytest.mark.parametrize("constrain", [True, False])
def test_act_log_prob_equals_rl_log_prob(policy, temperature, constrain):
    p = policy.with_config(temperature=temperature, constrain_to_actions=constrain)
    observations, instructions = [_obs(0), _obs(1), _obs(2)], [SHORT, LONG, SHORT]
    steps = p.act_batch(observations, instructions)
    ids = np.stack([s.token_ids for s in steps])
    with torch.no_grad():
        per_token = p.action_log_probs(observations, instructions, ids)
    assert per_token.shape == (3, 7) and per_token.dtype == torch.float32
    np.testing.assert_allclose(
        per_token.numpy(), np.stack([s.info["token_log_probs"] for s in steps]), atol=1e-4
    )
    np.testing.assert_allclose(per_token.sum(1).numpy(), [s.log_prob for s in steps], atol=5e-4)


def test_batched_acting_equals_one_at_a_time(policy):
    # Prompts of different lengths are left-padded; the pads must not change any row.
    observations, instructions = [_obs(3), _obs(4)], [SHORT, LONG]
    batch = policy.act_batch(observations, instructions)
    for obs, instr, b in zip(observations, instructions, batch, strict=True):
        single = policy.act(obs, instr)
        np.testing.assert_array_equal(single.token_ids, b.token_ids)
        assert abs(single.log_prob - b.log_prob) < 1e-4


def test_sampling_is_reproducible_from_the_seed():
    a = MiniVLAPolicy.tiny(seed=0, config=MiniVLAPolicyConfig(temperature=2.0, seed=5))
    b = MiniVLAPolicy.tiny(seed=0, config=MiniVLAPolicyConfig(temperature=2.0, seed=5))
    obs = _obs(7)
    ta = np.stack([a.act(obs, SHORT).token_ids for _ in range(3)])
    tb = np.stack([b.act(obs, SHORT).token_ids for _ in range(3)])
    np.testing.assert_array_equal(ta, tb)
    assert len(np.unique(ta)) > 3  # at temperature 2 over 256 tokens the samples vary


def test_out_of_support_tokens_are_rejected(policy):
    with pytest.raises(ValueError, match="outside the action range"):
        policy.action_log_probs([_obs(0)], [SHORT], np.zeros((1, 7), dtype=np.int64))
    with pytest.raises(ValueError, match=r"shape \(1, 7\)"):
        policy.action_log_probs([_obs(0)], [SHORT], np.zeros((1, 6), dtype=np.int64))


def test_config_is_validated():
    with pytest.raises(ConfigError, match="temperature"):
        MiniVLAPolicyConfig(temperature=-1)
    with pytest.raises(ConfigError, match="gripper"):
        MiniVLAPolicyConfig(gripper="flip")


# -- gradients and LoRA -------------------------------------------------------------------------------------
def test_gradients_reach_llm_and_projector_but_not_frozen_vision():
    p = MiniVLAPolicy.tiny(seed=1)
    obs = [_obs(0), _obs(1)]
    ids = np.stack([s.token_ids for s in p.act_batch(obs, [SHORT, LONG])])
    p.action_log_probs(obs, [SHORT, LONG], ids).sum().backward()
    grads = {n: q.grad for n, q in p.model.named_parameters()}
    assert grads["projector.fc1.weight"].abs().sum() > 0
    assert grads["llm.model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    assert all(g is None for n, g in grads.items() if n.startswith("vision."))


def test_lora_trains_only_adapters_and_round_trips(tmp_path):
    p = MiniVLAPolicy.tiny(seed=2)
    p.apply_lora(r=4, alpha=8)
    params = dict(p.model.named_parameters())
    trainable = {n for n, q in params.items() if q.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {t for t in LORA_TARGETS if any(f".{t}.lora_A" in n for n in trainable)} == set(LORA_TARGETS)
    before = {k: v.clone() for k, v in p.base_state_dict().items()}
    obs, instr = [_obs(5), _obs(6)], [SHORT, LONG]
    ids = np.stack([s.token_ids for s in p.with_config(temperature=1.0).act_batch(obs, instr)])
    old = p.action_log_probs(obs, instr, ids).detach()
    opt = torch.optim.SGD(p.trainable_parameters(), lr=0.05)
    for _ in range(3):  # lora_B starts at zero, so the first step moves only B
        opt.zero_grad()
        (-p.action_log_probs(obs, instr, ids).sum()).backward()
        opt.step()
    new = p.action_log_probs(obs, instr, ids).detach()
    assert (new.sum() - old.sum()).item() > 0  # ascent on the log-likelihood of the taken tokens
    after = p.base_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)

    with torch.no_grad():
        unmerged = p.action_log_probs(obs, instr, ids)
        p.merge_lora()
        merged = p.action_log_probs(obs, instr, ids)
        p.unmerge_lora()
        current = p.action_log_probs(obs, instr, ids)  # after unmerge: equal up to round-off
    torch.testing.assert_close(merged, unmerged, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(current, unmerged, atol=1e-5, rtol=1e-5)

    p.save(tmp_path / "policy")
    q = MiniVLAPolicy.from_saved(tmp_path / "policy")
    assert q.lora is not None and q.lora["r"] == 4
    with torch.no_grad():
        torch.testing.assert_close(q.action_log_probs(obs, instr, ids), current, atol=0, rtol=0)
    # The Prismatic export carries the merged weights: same predictions without any adapter.
    p.save_prismatic(tmp_path / "run")
    r = MiniVLAPolicy.from_prismatic(tmp_path / "run")
    assert r.lora is None
    with torch.no_grad():
        torch.testing.assert_close(r.action_log_probs(obs, instr, ids), current, atol=1e-4, rtol=1e-4)
    assert all(torch.equal(v, p.base_state_dict()[k]) for k, v in q.base_state_dict().items())


def test_save_load_in_place_without_lora(tmp_path):
    p = MiniVLAPolicy.tiny(seed=4)
    p.save(tmp_path)
    q = MiniVLAPolicy.tiny(seed=5)
    assert not torch.equal(
        p.base_state_dict()["projector.fc1.weight"], q.base_state_dict()["projector.fc1.weight"]
    )
    q.load(tmp_path)
    for k, v in p.base_state_dict().items():
        assert torch.equal(v, q.base_state_dict()[k]), k
    with pytest.raises(FileNotFoundError, match=r"minivla\.json"):
        q.load(tmp_path / "nowhere")


def test_saved_folder_loads_through_the_eval_policy_loader(tmp_path):
    from wmrl.embodied.eval.policy_loader import load_policy

    p = MiniVLAPolicy.tiny(seed=6)
    p.save(tmp_path)
    q = load_policy(tmp_path, temperature=1.0, seed=3)
    assert isinstance(q, MiniVLAPolicy) and q.config.temperature == 1.0
    obs = _obs(2)
    q.reset(seed=17)
    first = q.act(obs, SHORT).token_ids
    q.reset(seed=17)
    np.testing.assert_array_equal(q.act(obs, SHORT).token_ids, first)
