"""LIBERO environment pieces that need no simulator: config validation, orientation, splits, axis-angle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation

from wmrl.embodied.env.config import LiberoEnvConfig, parse_cameras
from wmrl.embodied.env.images import orient_image
from wmrl.embodied.env.libero_env import quat_to_axis_angle
from wmrl.embodied.env.splits import IN_DOMAIN_STATES, split_of, states_for_split
from wmrl.embodied.env.suites import SUITE_MAX_STEPS


def test_suite_max_steps_are_the_openvla_protocol_values():
    # research/embodied.md §1.5: OpenVLA / openvla-mini run_libero_eval.py; 520 is the paper's LIBERO-Long limit.
    assert SUITE_MAX_STEPS == {
        "libero_spatial": 220,
        "libero_object": 280,
        "libero_goal": 300,
        "libero_10": 520,
        "libero_90": 400,
    }


def test_config_defaults_are_libero_long_with_two_cameras():
    cfg = LiberoEnvConfig()
    assert cfg.suite == "libero_10"
    assert cfg.episode_max_steps == 520
    assert cfg.settle_steps == 10
    assert cfg.image_keys == ("agentview_image", "robot0_eye_in_hand_image")
    assert LiberoEnvConfig(suite="libero_goal").episode_max_steps == 300
    assert LiberoEnvConfig(suite="libero_goal", max_steps=7).episode_max_steps == 7


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"suite": "libero_100"}, "suite must be one of"),
        ({"task_id": 10}, "task_id must be an integer in"),
        ({"suite": "libero_90", "task_id": 90}, "task_id must be an integer in"),
        ({"cameras": ("agentview", "agentview")}, "must not repeat"),
        ({"image_height": 4}, "image_height"),
        ({"orientation": "flipped"}, "orientation must be one of"),
        ({"max_steps": 0}, "max_steps"),
        ({"settle_steps": -1}, "settle_steps"),
        ({"hard_reset": 1}, "hard_reset must be a bool"),
    ],
)
def test_config_rejects_bad_values(changes, message):
    with pytest.raises(ValueError, match=message):
        LiberoEnvConfig(**changes)


def test_config_round_trips_and_rejects_unknown_keys():
    cfg = LiberoEnvConfig(suite="libero_90", task_id=42, cameras="agentview", max_steps=3)
    assert cfg.cameras == ("agentview",)
    assert LiberoEnvConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown LiberoEnvConfig keys"):
        LiberoEnvConfig.from_dict({"suite": "libero_10", "camera": "agentview"})


def test_parse_cameras():
    assert parse_cameras("none") == ()
    assert parse_cameras("") == ()
    assert parse_cameras(None) == ()
    assert parse_cameras(" agentview , robot0_eye_in_hand") == ("agentview", "robot0_eye_in_hand")
    assert LiberoEnvConfig(cameras="none").image_keys == ()


def test_orientation_transforms():
    # A 3x2 "frame" whose rows are stored bottom-up, as OpenGL returns them.
    raw = np.arange(6 * 3, dtype=np.uint8).reshape(3, 2, 3)
    up = orient_image(raw, "upright")
    np.testing.assert_array_equal(up, raw[::-1])  # rows reversed, columns kept
    np.testing.assert_array_equal(up[0], raw[2])
    rot = orient_image(raw, "rotate180")
    np.testing.assert_array_equal(rot, up[:, ::-1])  # = upright, mirrored left-right
    same = orient_image(raw, "raw")
    np.testing.assert_array_equal(same, raw)
    for out in (up, rot, same):
        assert out.flags.c_contiguous
        assert not np.shares_memory(out, raw)
    with pytest.raises(ValueError, match="orientation must be one of"):
        orient_image(raw, "mirror")


def test_split_is_16_in_domain_and_34_held_out():
    assert tuple(range(16)) == IN_DOMAIN_STATES
    assert states_for_split("in_domain") == tuple(range(16))
    assert states_for_split("held_out") == tuple(range(16, 50))
    assert states_for_split("all") == tuple(range(50))
    assert split_of(15) == "in_domain"
    assert split_of(16) == "held_out"
    # The paper's Overall is the episode-weighted mean: 16/50 = 0.32 and 34/50 = 0.68.
    assert len(states_for_split("in_domain")) / 50 == 0.32
    with pytest.raises(ValueError, match="split must be one of"):
        states_for_split("train")
    with pytest.raises(ValueError, match="non-negative integer"):
        split_of(-1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0), min_size=4, max_size=4).filter(lambda q: np.linalg.norm(q) > 1e-3))
def test_quat_to_axis_angle_matches_scipy(quat):
    q = np.asarray(quat)
    expected = Rotation.from_quat(q / np.linalg.norm(q)).as_rotvec()  # scipy quats are (x, y, z, w) too
    got = quat_to_axis_angle(q)
    # Rotation vectors of angle pi are defined up to sign; compare as rotations.
    np.testing.assert_allclose(
        Rotation.from_rotvec(got).as_matrix(), Rotation.from_rotvec(expected).as_matrix(), atol=1e-6
    )
    assert np.linalg.norm(got) <= np.pi + 1e-9
