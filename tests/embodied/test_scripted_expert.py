"""The scripted expert: its geometry against closed forms, its predicate tests against LIBERO's
own, and whole episodes on the real simulator that it must solve (LIBERO-Long tasks 0 and 7).

The simulator tests build scenes without cameras (about 2-4 s per episode here).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from wmrl.embodied.policy import scripted_control as sc
from wmrl.embodied.policy import scripted_grasp as sg
from wmrl.embodied.policy.scripted_control import ExpertConfig, PickPlace, ScriptedController


def _box_scene(name: str, yaw: float, half: tuple[float, float, float], centre=(0.0, 0.0, 0.5)) -> dict:
    """A scene with one box-shaped object turned by ``yaw`` about z."""
    mat = Rotation.from_euler("z", yaw).as_matrix()
    corners = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)]) * half
    world = corners @ mat.T + np.asarray(centre)
    return {
        f"scene/{name}/pos": np.asarray(centre, dtype=float),
        f"scene/{name}/mat": mat.reshape(9),
        f"scene/{name}/box": np.concatenate([world.min(0), world.max(0)]),
        f"scene/{name}/extent": np.asarray(half, dtype=float),
    }


@pytest.mark.parametrize("yaw", [0.0, 0.4, -1.1, np.pi / 2, 2.5])
def test_a_box_is_grasped_across_its_narrow_side(yaw):
    scene = _box_scene("box_1", yaw, (0.04, 0.02, 0.01))
    centre, chosen, _ = sg.choose_grasp(scene, "box_1", tip_z=0.5, ratio=1.15)
    fingers = sg.finger_axis(chosen)
    narrow = Rotation.from_euler("z", yaw).as_matrix()[:2, 1]  # local y is the narrow side
    # with nothing around, the square grasp (fingers along the narrow axis) at the centre wins
    assert abs(abs(float(fingers @ narrow)) - 1.0) < 1e-9
    assert np.allclose(centre, [0.0, 0.0], atol=1e-9)
    assert -np.pi / 2 <= chosen <= np.pi / 2


def test_a_grasp_moves_away_from_a_neighbour_the_fingers_would_hit():
    scene = _box_scene("box_1", 0.0, (0.04, 0.02, 0.01))
    # a tall neighbour beside one end of the box, where the +y finger would come down
    scene.update(_box_scene("tall_1", 0.0, (0.02, 0.02, 0.08), centre=(-0.03, 0.065, 0.58)))
    centre, _, _ = sg.choose_grasp(scene, "box_1", tip_z=0.5, ratio=1.15)
    assert centre[0] > 0.01  # shifted along the long side, away from the neighbour


def _mug_scene(radius: float = 0.045, walls: int = 12, half_height: float = 0.04) -> dict:
    """A hollow cylinder of ``walls`` thin upright plates around (0, 0), 9 cm wide: too wide for the hand."""
    scene = _box_scene("mug_1", 0.0, (radius, radius, half_height), centre=(0.0, 0.0, 0.5))
    rows = []
    for k in range(walls):
        phi = 2 * np.pi * k / walls
        normal = [np.cos(phi), np.sin(phi), 0.0]
        rows.append([radius * np.cos(phi), radius * np.sin(phi), 0.5, *normal, 0, 0, 1, 0.003, half_height])
    # a short handle plate outside the ring: never the one to hold
    rows.append([radius + 0.02, 0.0, 0.49, 1, 0, 0, 0, 0, 1, 0.003, 0.015])
    scene["scene/mug_1/plates"] = np.array(rows)
    return scene


def test_a_mug_too_wide_for_the_hand_is_held_by_one_of_its_walls():
    scene = _mug_scene()
    centre, yaw, depth = sg.choose_grasp(scene, "mug_1", tip_z=0.5, ratio=1.15)
    assert np.linalg.norm(centre) == pytest.approx(0.045, abs=1e-9)  # on the ring, not the handle
    radial = centre / np.linalg.norm(centre)
    assert abs(float(sg.finger_axis(yaw) @ radial)) == pytest.approx(1.0, abs=1e-9)  # across the wall
    assert depth == pytest.approx(0.0, abs=1e-9)  # the walls reach the mug's top
    del scene["scene/mug_1/plates"]
    with pytest.raises(ValueError, match="too wide for the hand"):
        sg.choose_grasp(scene, "mug_1", tip_z=0.5, ratio=1.15)


def test_the_rotation_action_is_zero_on_target_and_turns_toward_it():
    down = sg.hand_orientation(0.0)
    quat = Rotation.from_matrix(down).as_quat()  # x, y, z, w like robot0_eef_quat
    assert np.allclose(sg.rotation_action(quat, down), 0.0, atol=1e-9)
    turn = sg.rotation_action(quat, sg.hand_orientation(0.2))
    # a turn of 0.2 rad about world z, scaled by OSC's 0.5 rad per unit action
    assert np.allclose(turn, [0.0, 0.0, 0.4], atol=1e-9)
    assert np.allclose(sg.rotation_action(quat, sg.hand_orientation(3.0)), [0, 0, 1.0])  # clipped


def test_an_empty_region_is_filled_from_its_centre_and_a_taken_one_beside_what_stands_there():
    centre, half = np.array([0.2, 0.1]), np.array([0.075, 0.075])
    scene = _box_scene("pot_1", 0.0, (0.04, 0.04, 0.05), centre=(0.6, 0.6, 0.95))  # far away: ignored
    assert np.allclose(sg.choose_place(scene, centre, half, "pot_2", radius=0.04), centre)
    scene.update(_box_scene("pot_3", 0.0, (0.04, 0.04, 0.05), centre=(0.2, 0.1, 0.95)))  # in the middle
    point = sg.choose_place(scene, centre, half, "pot_2", radius=0.04)
    assert np.all(np.abs(point - centre) <= half - 0.01 + 1e-9)  # 1 cm inside the border
    # a corner: the farthest the region allows from the pot in the middle (6.5 cm each way)
    assert np.allclose(np.abs(point - centre), [0.065, 0.065])


def test_articulation_comes_after_the_objects_and_what_cannot_be_done_is_named():
    ctl = ScriptedController(
        [["turnon", "flat_stove_1"], ["on", "pot_1", "stove_region"], ["close", "microwave_1"]]
    )
    assert ctl.unsupported == [("close", "microwave_1")]
    assert [p[0] for p in ctl._pending] == ["on", "turnon"]


def test_an_object_with_nothing_to_hold_is_given_up_with_a_reason_and_the_next_goal_goes_on():
    scene = _box_scene("slab_1", 0.0, (0.08, 0.06, 0.01))  # 12 cm wide, no walls: no grasp
    scene.update(_box_scene("can_1", 0.0, (0.03, 0.03, 0.04), centre=(0.2, 0.0, 0.53)))
    scene["scene/region_1/pos"], scene["scene/region_1/mat"] = np.array([0.0, 0.3, 0.5]), np.eye(3).reshape(9)
    scene["scene/region_1/size"] = np.array([0.06, 0.06, 0.05])
    ctl = ScriptedController([["in", "slab_1", "region_1"], ["in", "can_1", "region_1"]])
    obs = {"robot0_eef_pos": np.array([0.0, 0.0, 0.7]), "robot0_eef_quat": Rotation.from_matrix(
        sg.hand_orientation(0.0)).as_quat(), "robot0_gripper_qpos": np.array([0.04, -0.04])}  # fmt: skip
    action = ctl.act(obs, scene)
    assert ctl.finished == [(("in", "slab_1", "region_1"), False)]
    assert "can_1" in ctl.phase and action.shape == (7,)


def test_unsupported_predicates_are_named_and_the_controller_holds_still_after_its_work():
    ctl = ScriptedController([["open", "flat_stove_1"], ["close", "microwave_1"]])
    assert ctl.unsupported == [("open", "flat_stove_1"), ("close", "microwave_1")]
    obs = {"robot0_eef_pos": np.zeros(3), "robot0_eef_quat": np.array([1.0, 0, 0, 0]),
           "robot0_gripper_qpos": np.array([0.04, -0.04])}  # fmt: skip
    assert np.array_equal(ctl.act(obs, {}), np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32))


@pytest.mark.parametrize(
    "bad",
    [{"speed": 0.0}, {"carry_speed": 1.5}, {"tolerance": -1.0}, {"close_steps": 0}, {"max_attempts": 1.5},
     {"narrow_ratio": 0.5}],
)  # fmt: skip
def test_expert_config_refuses_bad_settings(bad):
    with pytest.raises(ValueError):
        ExpertConfig(**bad)


def test_config_from_dict_refuses_unknown_keys():
    with pytest.raises(ValueError, match="unknown ExpertConfig keys"):
        sc.config_from_dict({"speeed": 1.0})
    with pytest.raises(ValueError, match="the goal has no predicates"):
        ScriptedController([])
    with pytest.raises(ValueError, match="PickPlace handles"):
        PickPlace("turnon", "a", "b", ExpertConfig())


# -- on the simulator ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def basket_env():
    pytest.importorskip("libero")
    from wmrl.embodied.env import LiberoEnv

    env = LiberoEnv(task_id=0, cameras=(), scene_state=True, hard_reset=False)
    yield env
    env.close()


@pytest.mark.libero
def test_scene_keys_and_boxes_describe_the_objects(basket_env):
    obs, _ = basket_env.reset(options={"init_state": 0})
    problem = basket_env.libero_env.env
    for name in problem.objects_dict:
        pos, box = obs[f"scene/{name}/pos"], obs[f"scene/{name}/box"]
        assert obs[f"scene/{name}/mat"].shape == (9,) and obs[f"scene/{name}/extent"].shape == (3,)
        assert np.all(box[:3] <= box[3:])
        # the body origin lies in (or, for the basket, 5 mm under) the box of its collision geoms
        assert np.all(pos >= box[:3] - 0.01) and np.all(pos <= box[3:] + 0.01)
        assert box[2] == pytest.approx(0.437, abs=0.005)  # everything rests on the table top
    assert obs["scene/basket_1_contain_region/size"].shape == (3,)
    assert "scene/robot0_base/pos" in obs
    assert {k for k in obs if k.startswith("scene/")} == {
        k for k in basket_env.observation_space.spaces if k.startswith("scene/")
    }


@pytest.mark.libero
def test_the_experts_in_test_agrees_with_libero_when_an_object_is_put_in_the_basket(basket_env):
    obs, _ = basket_env.reset(options={"init_state": 0})
    problem = basket_env.libero_env.env
    task = PickPlace("in", "alphabet_soup_1", "basket_1_contain_region", ExpertConfig())
    predicate = ["in", "alphabet_soup_1", "basket_1_contain_region"]
    assert task.holds(obs) is False and not problem._eval_predicate(predicate)
    # drop the can into the basket by moving its free joint, and let it settle
    sim = problem.sim
    joint = problem.get_object("alphabet_soup_1").joints[-1]
    qpos = sim.data.get_joint_qpos(joint).copy()
    qpos[:3] = obs["scene/basket_1_contain_region/pos"] + np.array([0.0, 0.0, 0.02])
    sim.data.set_joint_qpos(joint, qpos)
    sim.forward()
    for _ in range(30):
        obs, *_ = basket_env.step(np.array([0, 0, 0, 0, 0, 0, -1.0]))
    assert bool(problem._eval_predicate(predicate)) is True
    assert task.holds(obs) is True


@pytest.mark.libero
@pytest.mark.parametrize("task_id", [0, 7])
def test_the_expert_solves_a_basket_task_through_the_evaluation(tmp_path, task_id):
    from wmrl.embodied.eval.libero_eval import LiberoEvalConfig, run_libero_eval

    config = LiberoEvalConfig(
        policy="scripted", tasks=(task_id,), states=(0, 1), cameras=(), workers=1, hard_reset=False,
        out_dir=str(tmp_path / "eval"),
    )  # fmt: skip
    report = run_libero_eval(config, progress=False)
    entries = [json.loads(line) for line in (tmp_path / "eval" / "episodes.jsonl").read_text().splitlines()]
    episodes = [e for e in entries if e.get("kind") != "elapsed"]
    assert len(episodes) == 2 and all(e["success"] for e in episodes)
    assert report["policy"]["type"] == "scripted"
    # a solved LIBERO-Long pick-and-place takes a few hundred steps, well inside the 520 limit
    assert all(100 < e["steps"] < 450 for e in episodes)


@pytest.mark.libero
def test_the_expert_acts_in_the_vla_action_convention(basket_env):
    from wmrl.embodied.policy.scripted_expert import ScriptedExpert

    expert = ScriptedExpert()
    obs, info = basket_env.reset(options={"init_state": 3})
    grips = set()
    for _ in range(120):
        step = expert.act(obs, info["instruction"])
        assert step.action.shape == (7,) and step.action.dtype == np.float32
        assert np.all(np.abs(step.action) <= 1.0)
        grips.add(float(step.action[6]))
        obs, _, _terminated, _truncated, info = basket_env.step(step.action)
    assert grips == {-1.0, 1.0}  # it opened and closed, and never anything in between
    assert "alphabet_soup_1" in step.info["phase"]


@pytest.mark.libero
def test_the_expert_refuses_observations_without_the_scene_and_unknown_instructions():
    from wmrl.embodied.policy.scripted_expert import ScriptedExpert, task_goal

    expert = ScriptedExpert()
    with pytest.raises(ValueError, match="scene_state=True"):
        expert.act(
            {"robot0_eef_pos": np.zeros(3)}, "put both the alphabet soup and the tomato sauce in the basket"
        )
    with pytest.raises(ValueError, match="no task of libero_10"):
        task_goal("libero_10", "make coffee")
    goal = task_goal("libero_10", "turn on the stove and put the moka pot on it")
    assert ("turnon", "flat_stove_1") in goal


@pytest.mark.libero
def test_a_saved_scripted_expert_loads_and_is_refused_for_another_suite(tmp_path):
    from wmrl.embodied.eval.libero_eval import LiberoEvalConfig, load_eval_policy
    from wmrl.embodied.eval.policy_loader import load_policy
    from wmrl.embodied.policy.scripted_expert import ScriptedExpert

    folder = ScriptedExpert(suite="libero_10", carry_speed=0.5).save(tmp_path / "expert")
    loaded = load_policy(folder)
    assert isinstance(loaded, ScriptedExpert) and loaded.config.carry_speed == 0.5
    experts, description = load_eval_policy(LiberoEvalConfig(policy=str(folder), workers=2))
    assert len(experts) == 2 and experts[0] is not experts[1]  # one plan per worker
    assert description["type"] == "scripted"
    with pytest.raises(ValueError, match="scripted expert for libero_10"):
        load_eval_policy(LiberoEvalConfig(policy=str(folder), suite="libero_goal"))


@pytest.mark.libero
def test_the_knob_primitive_turns_the_stove_on_as_libero_judges_it():
    pytest.importorskip("libero")
    from wmrl.embodied.env import LiberoEnv
    from wmrl.embodied.policy.scripted_knob import TurnKnob

    env = LiberoEnv(task_id=2, cameras=(), scene_state=True, hard_reset=False)
    try:
        obs, _ = env.reset(options={"init_state": 5})
        frames = obs["scene/flat_stove_1/joint_frames"]
        assert frames.shape == (1, 6) and abs(frames[0, 5]) == pytest.approx(1.0)  # an upright hinge
        assert obs["scene/flat_stove_1/joint_boxes"].shape == (1, 6)
        problem = env.libero_env.env
        assert not problem._eval_predicate(["turnon", "flat_stove_1"])
        knob = TurnKnob("flat_stove_1")
        for _ in range(300):
            action = knob.act(obs, obs)
            if action is None:
                break
            obs, *_ = env.step(action)
        assert not knob.failed, knob.reason
        assert bool(problem._eval_predicate(["turnon", "flat_stove_1"])) is True
        assert knob.holds(obs)
    finally:
        env.close()


@pytest.mark.libero
@pytest.mark.slow
def test_recorded_expert_demonstrations_read_back_and_replay_to_success(tmp_path):
    """`wmrl embodied record-demos`: one expert episode, both formats, replayed as SFT replays it."""
    from wmrl.embodied.demos.lerobot_format import read_lerobot_dataset
    from wmrl.embodied.demos.libero_hdf5 import read_libero_hdf5
    from wmrl.embodied.demos.record import RecordConfig, record_demonstrations
    from wmrl.embodied.demos.replay import replay_demo
    from wmrl.embodied.env import LiberoEnv

    config = RecordConfig(tasks=(7,), states=(3,), image_size=32, out_dir=str(tmp_path / "demos"))
    summary = record_demonstrations(config)
    assert summary["kept"] == 1 and summary["episodes"][0]["success"] is True
    (hdf5,) = (tmp_path / "demos" / "libero_hdf5").glob("*_demo.hdf5")
    (demo,) = read_libero_hdf5(hdf5)
    steps = summary["episodes"][0]["steps"]
    assert demo.actions.shape == (steps, 7) and demo.frames["agentview"].shape == (steps, 32, 32, 3)
    assert demo.states is not None and demo.success is True and demo.task_id == 7
    (episode,) = read_lerobot_dataset(tmp_path / "demos" / "lerobot", suite="libero_10")
    assert np.allclose(episode.actions, demo.actions, atol=1e-6)
    assert episode.frames["agentview"].shape == (steps, 32, 32, 3)
    # the replay SFT does (from the demo's first MuJoCo state) reaches the goal again
    env = LiberoEnv(task_id=7, cameras=("agentview",), image_height=32, image_width=32, hard_reset=False)
    try:
        assert replay_demo(env, demo).success
    finally:
        env.close()
    with pytest.raises(FileExistsError, match="already holds a recording"):
        record_demonstrations(config)


def test_record_config_refuses_bad_settings():
    from wmrl.embodied.demos.record import RecordConfig

    for bad in ({"tasks": (10,)}, {"states": ()}, {"states": (1, 1)}, {"formats": ("hdf5",)}, {"image_size": 4},
                {"orientation": "sideways"}, {"max_steps": 0}, {"action_noise": -0.1},
                {"action_noise": 3.0}, {"noise_seed": -1}):  # fmt: skip
        with pytest.raises(ValueError):
            RecordConfig(**bad)


def test_perturbed_actions_add_seeded_noise_to_the_arm_only():
    from wmrl.embodied.demos.record import perturbed

    def act(obs):
        return np.array([0.0, 0.5, -0.5, 0.99, 0.0, 0.0, 1.0])

    assert perturbed(act, 0.0, np.random.default_rng(0)) is act
    draws = [perturbed(act, 0.3, np.random.default_rng([1, 5, 3]))(None) for _ in range(2)]
    np.testing.assert_array_equal(draws[0], draws[1])  # the same stream gives the same noise
    noisy = perturbed(act, 0.3, np.random.default_rng(7))
    samples = np.array([noisy(None) for _ in range(4000)])
    assert np.all(samples[:, 6] == 1.0)  # the gripper command is left alone
    assert np.all(np.abs(samples[:, :6]) <= 1.0)  # clipped to the action space
    # unclipped dimensions: mean is the policy's action, std the noise's
    np.testing.assert_allclose(samples[:, [0, 4, 5]].mean(0), 0.0, atol=0.02)
    np.testing.assert_allclose(samples[:, [0, 4, 5]].std(0), 0.3, rtol=0.05)


def test_a_grasp_that_failed_is_not_tried_again_the_same_way():
    scene = _box_scene("box_1", 0.3, (0.04, 0.02, 0.01))
    first = sg.choose_grasp(scene, "box_1", tip_z=0.5, ratio=1.15)
    second = sg.choose_grasp(scene, "box_1", tip_z=0.5, ratio=1.15, avoid=[(first[0], first[1])])
    assert np.linalg.norm(second[0] - first[0]) >= 0.01 or abs(second[1] - first[1]) >= 0.2
    # still across the narrow side, within the turns a box allows
    narrow = Rotation.from_euler("z", 0.3).as_matrix()[:2, 1]
    assert abs(float(sg.finger_axis(second[1]) @ narrow)) > np.cos(0.31)
