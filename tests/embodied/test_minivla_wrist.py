"""The wrist-camera MiniVLA (openvla-mini's ``-wrist`` variant): two images a step, each featurised
alone by the same ViTs, patch sequences concatenated third-person first; round trips through both
checkpoint formats; SFT trains it on recorded wrist frames."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wmrl.core.config import ConfigError
from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy, MiniVLAPolicyConfig
from wmrl.embodied.policy.prismatic_checkpoint import read_run

TASK = "put both the alphabet soup and the tomato sauce in the basket"
WRIST = MiniVLAPolicyConfig(wrist_image_key="robot0_eye_in_hand_image")


@pytest.fixture(scope="module")
def wrist_policy() -> MiniVLAPolicy:
    return MiniVLAPolicy.tiny(seed=5, config=WRIST)


def _obs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "agentview_image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "robot0_eye_in_hand_image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
    }


def test_images_are_featurised_alone_and_concatenated_in_order(wrist_policy):
    model = wrist_policy.model
    assert model.config.image_sequence_len == 2
    obs = _obs(0)
    pixels = wrist_policy.pixel_values([obs])
    assert pixels["dino"].shape[:2] == (1, 2)
    one = {k: v[:, 0] for k, v in pixels.items()}
    two = {k: v[:, 1] for k, v in pixels.items()}
    with torch.no_grad():
        both = model.vision(pixels)
        expected = torch.cat([model.vision(one), model.vision(two)], dim=1)
    assert both.shape == (1, model.config.image_tokens, model.config.vision_dim)
    torch.testing.assert_close(both, expected, rtol=0, atol=0)


def test_the_wrist_image_changes_the_action_distribution(wrist_policy):
    obs = _obs(1)
    other = dict(obs, robot0_eye_in_hand_image=_obs(2)["robot0_eye_in_hand_image"])
    ids = np.stack([wrist_policy.act(obs, TASK).token_ids])
    a = wrist_policy.action_log_probs([obs], [TASK], ids)
    b = wrist_policy.action_log_probs([other], [TASK], ids)
    assert not torch.allclose(a, b)


def test_act_log_prob_equals_rl_log_prob_with_two_images(wrist_policy):
    sampler = wrist_policy.with_config(temperature=1.0, seed=3)
    obs = [_obs(3), _obs(4)]
    steps = sampler.act_batch(obs, [TASK, TASK])
    ids = np.stack([s.token_ids for s in steps])
    scored = sampler.action_log_probs(obs, [TASK, TASK], ids).sum(-1)
    np.testing.assert_allclose(scored.detach().numpy(), [s.log_prob for s in steps], rtol=1e-5, atol=1e-5)


def test_image_count_mismatches_are_refused(wrist_policy):
    with pytest.raises(KeyError, match="robot0_eye_in_hand_image"):
        wrist_policy.act({"agentview_image": _obs(0)["agentview_image"]}, TASK)
    one_image = MiniVLAPolicy.tiny(seed=0)
    with pytest.raises(ValueError, match="1 image"):
        MiniVLAPolicy(one_image.model, one_image.tokenizer, one_image.dataset_statistics, WRIST)
    with pytest.raises(ValueError, match="2 image"):
        wrist_policy.with_config(wrist_image_key=None)
    with pytest.raises(ValueError, match="reads 2 image"):
        wrist_policy.model.embed_images({k: v[:, 0] for k, v in wrist_policy.pixel_values([_obs(0)]).items()})
    with pytest.raises(ConfigError, match="wrist_image_key"):
        MiniVLAPolicyConfig(wrist_image_key="agentview_image")
    assert wrist_policy.observation_contract["wrist_camera"] == "robot0_eye_in_hand"
    assert one_image.observation_contract["wrist_camera"] is None


def test_round_trips_through_saved_folders_and_prismatic_runs(wrist_policy, tmp_path):
    obs = _obs(6)
    expected = wrist_policy.act(obs, TASK)
    wrist_policy.save(tmp_path / "saved")
    loaded = MiniVLAPolicy.from_saved(tmp_path / "saved")
    assert loaded.config.wrist_image_key == "robot0_eye_in_hand_image"
    np.testing.assert_array_equal(loaded.act(obs, TASK).token_ids, expected.token_ids)

    wrist_policy.save_prismatic(tmp_path / "run", step=3)
    vla = json.loads((tmp_path / "run" / "config.json").read_text())["vla"]
    assert (vla["image_sequence_len"], vla["use_wrist_image"]) == (2, True)
    assert read_run(tmp_path / "run").model_config.image_sequence_len == 2
    # a Prismatic wrist run reads robosuite's eye-in-hand camera unless told otherwise
    from_run = MiniVLAPolicy.from_prismatic(tmp_path / "run")
    assert from_run.config.wrist_image_key == "robot0_eye_in_hand_image"
    np.testing.assert_array_equal(from_run.act(obs, TASK).token_ids, expected.token_ids)


def test_policy_setup_builds_a_tiny_wrist_policy_and_refuses_another_camera(wrist_policy, tmp_path):
    from wmrl.core.train_config import LoraConfig
    from wmrl.embodied.training.config import PolicySpec
    from wmrl.embodied.training.policy_setup import build_policy

    lora = LoraConfig(enabled=False)
    built = build_policy(
        PolicySpec(source="tiny", wrist_camera="robot0_eye_in_hand"), lora, "agentview_image"
    )
    assert built.model.config.image_sequence_len == 2
    assert built.config.image_keys == ("agentview_image", "robot0_eye_in_hand_image")
    wrist_policy.save(tmp_path / "saved")
    # a checkpoint reads its own wrist camera when none is named, and refuses another one
    assert build_policy(
        PolicySpec(source=str(tmp_path / "saved")), lora, "agentview_image"
    ).config.image_keys[1] == ("robot0_eye_in_hand_image")
    with pytest.raises(ConfigError, match="wrist camera"):
        build_policy(
            PolicySpec(source=str(tmp_path / "saved"), wrist_camera="frontview"), lora, "agentview_image"
        )
    MiniVLAPolicy.tiny(seed=0).save(tmp_path / "one")
    with pytest.raises(ConfigError, match="wrist camera None"):
        build_policy(
            PolicySpec(source=str(tmp_path / "one"), wrist_camera="robot0_eye_in_hand"),
            lora,
            "agentview_image",
        )


def test_record_demos_renders_the_wrist_camera_a_policy_reads():
    from wmrl.embodied.demos.record import RecordConfig, recorded_cameras

    plain = RecordConfig()
    assert recorded_cameras(plain, {}) == ("agentview",)
    assert recorded_cameras(RecordConfig(wrist_camera="robot0_eye_in_hand"), {}) == (
        "agentview",
        "robot0_eye_in_hand",
    )
    contract = {"camera": "agentview", "wrist_camera": "robot0_eye_in_hand"}
    assert recorded_cameras(plain, contract) == ("agentview", "robot0_eye_in_hand")
    with pytest.raises(ValueError, match="wrist camera"):
        recorded_cameras(RecordConfig(wrist_camera="frontview"), contract)
    with pytest.raises(ValueError, match="--camera frontview"):
        recorded_cameras(RecordConfig(camera="agentview"), {"camera": "frontview"})
    with pytest.raises(ValueError, match="another camera"):
        RecordConfig(wrist_camera="agentview")


@pytest.mark.libero
@pytest.mark.transformers
@pytest.mark.slow
def test_sft_trains_a_wrist_policy_on_both_cameras_and_it_acts_in_the_simulator(tmp_path):
    from demo_recording import record

    from wmrl.core.cli import main
    from wmrl.embodied.demos.libero_hdf5 import write_libero_hdf5
    from wmrl.embodied.env import LiberoEnv, LiberoEnvConfig
    from wmrl.embodied.eval.policy_loader import load_policy

    cameras = ("agentview", "robot0_eye_in_hand")
    env = LiberoEnv(LiberoEnvConfig(task_id=0, cameras=cameras, image_height=64, image_width=64))
    try:
        demos = record(env, init_states=(0,), steps=8)
        path = write_libero_hdf5(tmp_path / "task0_demo.hdf5", demos)
        args = ["data.replay=false", "lora.enabled=false", "microbatch_size=4", "grad_accumulation=1", "epochs=1",
                "policy.wrist_camera=robot0_eye_in_hand"]  # fmt: skip
        assert main(["train", "embodied-sft", "--smoke", "--no-progress", "--out", str(tmp_path / "sft"),
                     f"data.paths=[{path}]", *args]) == 0  # fmt: skip
        policy = load_policy(tmp_path / "sft" / "checkpoints" / "checkpoint-2" / "policy")
        assert policy.model.config.image_sequence_len == 2
        assert policy.observation_contract["wrist_camera"] == "robot0_eye_in_hand"
        obs, _ = env.reset(seed=0, options={"init_state": 0})
        assert policy.act(obs, env.instruction).action.shape == (7,)
    finally:
        env.close()
    # demonstrations without the wrist camera cannot train a wrist policy
    only_agentview = [
        d.__class__(**{**d.__dict__, "frames": {"agentview": d.frames["agentview"]}}) for d in demos
    ]
    bare = write_libero_hdf5(tmp_path / "bare" / "task0_demo.hdf5", only_agentview)
    with pytest.raises(KeyError, match="robot0_eye_in_hand"):
        main(["train", "embodied-sft", "--smoke", "--no-progress", "--out", str(tmp_path / "sft2"),
              f"data.paths=[{bare}]", *args])  # fmt: skip


@pytest.mark.libero
@pytest.mark.peft
@pytest.mark.slow
def test_rl_smoke_run_renders_and_trains_the_wrist_policy(tmp_path):
    from wmrl.core.cli import main
    from wmrl.core.rundir import list_checkpoints
    from wmrl.embodied.eval.policy_loader import load_policy

    threads = torch.get_num_threads()
    out = tmp_path / "rl"
    try:
        assert main(["train", "embodied", "--smoke", "--out", str(out), "--no-progress", "steps=1",
                     "policy.wrist_camera=robot0_eye_in_hand"]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # the update re-scored the stored two-image observations exactly as they were acted on
    assert row["ppo/behaviour_logp_gap"] < 1e-3
    policy = load_policy(list_checkpoints(out)[-1] / "policy")
    assert policy.config.image_keys == ("agentview_image", "robot0_eye_in_hand_image")
