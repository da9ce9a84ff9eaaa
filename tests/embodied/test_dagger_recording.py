"""DAgger recording (``wmrl embodied record-demos --label-with scripted``): one policy drives, the
expert labels every visited state; the labels, not the executed actions, are what SFT clones.

The pure tests check the step rule (who executes, what is recorded, when the recording ends); the
simulator tests check it end to end on LIBERO against properties that must hold exactly: with the
expert executing every step the recording *is* an expert recording, and with a driver that holds
still the arm does not move while the labels are the expert's approach.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from wmrl.embodied.demos.replay import LabelledAction
from wmrl.embodied.policy.base import ActionStep


def _expert(action, gave_up=False):
    return lambda obs: ActionStep(action=np.asarray(action, dtype=np.float32), info={"gave_up": gave_up})


def test_the_label_is_always_the_experts_and_the_mix_decides_who_executes():
    from wmrl.embodied.demos.record import labelled

    driver = np.array([0.1, 0, 0, 0, 0, 0, -1], dtype=np.float32)
    expert = np.array([0, 0.5, 0, 0, 0, 0, 1], dtype=np.float32)
    for mix, executes in ((0.0, driver), (1.0, expert)):
        step = labelled(lambda obs: driver, _expert(expert), mix, np.random.default_rng(0))
        for _ in range(20):
            out = step(None)
            assert isinstance(out, LabelledAction)
            np.testing.assert_array_equal(out.label, expert)
            np.testing.assert_array_equal(out.executed, executes)
    # a mix of 0.3 executes the expert's action on about 30% of the steps, reproducibly per stream
    runs = []
    for _ in range(2):
        step = labelled(lambda obs: driver, _expert(expert), 0.3, np.random.default_rng([4, 5, 0, 1]))
        runs.append(np.array([np.array_equal(step(None).executed, expert) for _ in range(4000)]))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert abs(runs[0].mean() - 0.3) < 0.03


def test_an_expert_that_gave_up_labels_nothing():
    from wmrl.embodied.demos.record import labelled

    step = labelled(lambda obs: np.zeros(7), _expert(np.ones(7), gave_up=True), 1.0, np.random.default_rng(0))
    out = step(None)
    assert out.label is None
    np.testing.assert_array_equal(out.executed, np.zeros(7))  # the driver's: the expert has nothing


def test_the_scripted_controller_says_when_it_gave_up():
    from scipy.spatial.transform import Rotation

    from wmrl.embodied.policy import scripted_grasp as sg
    from wmrl.embodied.policy.scripted_control import ScriptedController

    slab = {"scene/slab_1/pos": np.array([0.0, 0.0, 0.5]), "scene/slab_1/mat": np.eye(3).reshape(9),
            "scene/slab_1/box": np.array([-0.08, -0.06, 0.49, 0.08, 0.06, 0.51]),
            "scene/slab_1/extent": np.array([0.08, 0.06, 0.01]), "scene/region_1/pos": np.array([0.0, 0.3, 0.5]),
            "scene/region_1/mat": np.eye(3).reshape(9), "scene/region_1/size": np.array([0.06, 0.06, 0.05])}  # fmt: skip
    obs = {"robot0_eef_pos": np.array([0.0, 0.0, 0.7]), "robot0_eef_quat": Rotation.from_matrix(
        sg.hand_orientation(0.0)).as_quat(), "robot0_gripper_qpos": np.array([0.04, -0.04])}  # fmt: skip
    ctl = ScriptedController([["in", "slab_1", "region_1"]])
    assert not ctl.gave_up
    ctl.act(obs, slab)  # 12 cm wide, no walls: no grasp, given up at once
    assert ctl.gave_up and ctl.phase == "idle"


def test_record_config_refuses_a_mix_without_a_labeller_and_out_of_range():
    from wmrl.embodied.demos.record import RecordConfig

    for bad in ({"label_mix": 0.5}, {"label_policy": "scripted", "label_mix": 1.5},
                {"label_policy": "scripted", "label_mix": -0.1}, {"label_policy": ""}):  # fmt: skip
        with pytest.raises(ValueError, match="label"):
            RecordConfig(**bad)
    assert RecordConfig(label_policy="scripted", label_mix=1.0).label_mix == 1.0


def _book_demos(steps: int, side: int, **extra) -> list:
    """Two demonstrations of ``steps`` blank frames: the first labelled by ``scripted``, the second not."""
    from wmrl.embodied.demos.types import Demo

    return [
        Demo(
            instruction="put the book in the caddy",
            actions=np.zeros((steps, 7)),
            frames={"agentview": np.zeros((steps, side, side, 3), np.uint8)},
            orientation="upright",
            init_state=s,
            labelled_by=by,
            **extra,
        )
        for s, by in ((0, "scripted"), (1, None))
    ]


def test_a_labelled_demo_keeps_its_labeller_in_hdf5_and_refuses_a_replay(tmp_path):
    pytest.importorskip("h5py")
    from wmrl.embodied.demos.libero_hdf5 import read_libero_hdf5, write_libero_hdf5
    from wmrl.embodied.demos.replay import replay_demo

    demos = _book_demos(3, 8, states=np.zeros((3, 5)))
    path = write_libero_hdf5(tmp_path / "t_demo.hdf5", demos)
    assert [d.labelled_by for d in read_libero_hdf5(path)] == ["scripted", None]
    with pytest.raises(ValueError, match="labels, not what was executed"):
        replay_demo(object(), demos[0])  # refused before the environment is touched


def test_the_lerobot_format_keeps_the_labeller(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    from wmrl.embodied.demos.lerobot_format import read_lerobot_dataset, write_lerobot_dataset

    demos = _book_demos(4, 16)
    write_lerobot_dataset(tmp_path / "ds", demos)
    assert [d.labelled_by for d in read_lerobot_dataset(tmp_path / "ds")] == ["scripted", None]


# -- on the simulator ---------------------------------------------------------------------------


class _HoldStill:
    """A driver that never moves the arm and keeps the gripper open."""

    observation_contract: ClassVar[dict] = {}

    def reset(self):
        pass

    def act(self, obs, instruction):
        return ActionStep(action=np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32))


@pytest.fixture(scope="module")
def book_env():
    pytest.importorskip("libero")
    from wmrl.embodied.env import LiberoEnv

    env = LiberoEnv(task_id=5, cameras=("agentview",), image_height=16, image_width=16, scene_state=True,
                    hard_reset=False, max_steps=40)  # fmt: skip
    yield env
    env.close()


def _episode(env, driver, mix):
    from wmrl.embodied.demos.record import labelled
    from wmrl.embodied.demos.replay import record_demo
    from wmrl.embodied.policy.scripted_expert import ScriptedExpert

    expert = ScriptedExpert()
    step = labelled(lambda obs: driver.act(obs, env.instruction).action,
                    lambda obs: expert.act(obs, env.instruction), mix, np.random.default_rng(0))  # fmt: skip
    return record_demo(env, lambda obs, _t: step(obs), init_state=2, labelled_by="scripted")


@pytest.mark.libero
def test_an_expert_executing_every_step_records_exactly_an_expert_recording(book_env):
    from wmrl.embodied.demos.replay import record_demo
    from wmrl.embodied.policy.scripted_expert import ScriptedExpert

    expert = ScriptedExpert()
    plain = record_demo(book_env, lambda obs, _t: expert.act(obs, book_env.instruction).action, init_state=2)
    dagger = _episode(book_env, _HoldStill(), mix=1.0)
    assert dagger.labelled_by == "scripted" and plain.labelled_by is None
    np.testing.assert_array_equal(dagger.actions, plain.actions)
    np.testing.assert_array_equal(dagger.states, plain.states)
    with pytest.raises(ValueError, match="LabelledAction exactly when"):
        record_demo(book_env, lambda obs, _t: np.zeros(7), init_state=2, labelled_by="scripted")


@pytest.mark.libero
def test_a_driver_that_holds_still_keeps_the_arm_still_while_the_expert_labels_its_approach(book_env):
    dagger = _episode(book_env, _HoldStill(), mix=0.0)
    assert dagger.length == 40
    # the labels are the expert's approach: the arm commanded to move, the gripper open
    assert np.abs(dagger.actions[:, :3]).max() > 0.2 and np.all(dagger.actions[:, 6] == -1)
    # what ran is the driver's: the arm did not travel (joint positions stay within a few mrad)
    qpos = dagger.states[:, 1:8]
    assert np.abs(qpos - qpos[0]).max() < 0.05
