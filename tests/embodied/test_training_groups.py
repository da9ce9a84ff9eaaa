"""Group construction (G rollouts of one (task, in-domain initial state)) and the typed training config."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from wmrl.core.config import ConfigError
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.modes import apply_changes
from wmrl.embodied.env.splits import IN_DOMAIN_STATES, states_for_split
from wmrl.embodied.training import choose_groups, episode_specs, load_train_config
from wmrl.embodied.training.groups import GroupSpec, group_records


def test_groups_are_distinct_in_domain_pairs_with_tasks_in_rotation():
    tasks = tuple(range(10))
    for step in range(20):
        groups = choose_groups(step, tasks, IN_DOMAIN_STATES, n_groups=10, seed=0)
        assert len({(g.task_id, g.init_state) for g in groups}) == 10
        assert all(g.init_state in IN_DOMAIN_STATES for g in groups)
        assert sorted(g.task_id for g in groups) == list(tasks)  # one group per task at 10 groups per step
    # more groups than tasks: tasks repeat with distinct states; fewer: tasks rotate across steps
    many = choose_groups(0, (0, 1), IN_DOMAIN_STATES, n_groups=6, seed=1)
    assert Counter(g.task_id for g in many) == {0: 3, 1: 3}
    assert len({g.key for g in many}) == 6
    seen = Counter(
        g.task_id for step in range(10) for g in choose_groups(step, tasks, IN_DOMAIN_STATES, 3, 0)
    )
    assert set(seen.values()) == {3}  # 30 groups over 10 tasks: every task exactly 3 times
    # a pure function of (seed, step): a resumed run chooses the same groups
    assert choose_groups(7, tasks, IN_DOMAIN_STATES, 4, 3) == choose_groups(7, tasks, IN_DOMAIN_STATES, 4, 3)
    assert choose_groups(7, tasks, IN_DOMAIN_STATES, 4, 3) != choose_groups(7, tasks, IN_DOMAIN_STATES, 4, 4)
    # over many steps every in-domain state of a task gets used, and no held-out one ever
    states = {g.init_state for step in range(200) for g in choose_groups(step, (0,), IN_DOMAIN_STATES, 1, 0)}
    assert states == set(IN_DOMAIN_STATES)


def test_held_out_states_are_refused():
    with pytest.raises(ValueError, match="held out"):
        choose_groups(0, (0,), states_for_split("held_out"), 1, 0)
    with pytest.raises(ValueError, match="distinct initial states"):
        choose_groups(0, (0,), (0, 1), n_groups=3, seed=0)
    with pytest.raises(ConfigError, match="held-out initial states"):
        load_train_config(None, ["env.states=[3,20]"])


def test_rollouts_of_a_group_share_task_and_initial_state_and_differ_in_seed():
    groups = [GroupSpec(2, 5), GroupSpec(7, 0), GroupSpec(2, 11)]
    specs = episode_specs(groups, group_size=4, step=3, seed=0, record_frames=True)
    assert len(specs) == 12
    for j, g in enumerate(groups):
        members = specs[4 * j : 4 * (j + 1)]
        assert {(s.task_id, s.init_state) for s in members} == {(g.task_id, g.init_state)}
        assert [s.rollout for s in members] == [0, 1, 2, 3]
        assert all(s.record_frames for s in members)
    assert len({s.seed for s in specs}) == 12
    # the same group at another step samples with other seeds
    later = episode_specs(groups[:1], 4, step=4, seed=0, record_frames=False)
    assert not {s.seed for s in later} & {s.seed for s in specs[:4]}
    assert episode_specs(groups, 4, 3, 0, True) == specs

    class Rec:
        def __init__(self, spec):
            self.spec = spec

    grouped = group_records([Rec(s) for s in specs], groups, 4)
    assert [len(m) for m in grouped] == [4, 4, 4]
    shuffled = [Rec(s) for s in specs[4:8] + specs[:4] + specs[8:]]
    with pytest.raises(ValueError, match="found in group"):
        group_records(shuffled, groups, 4)


def test_modes_only_pick_the_corrector_preset():
    base = load_train_config(None, ["corrector.debias.min_pairs=7"])
    for mode, preset in (("real", "real"), ("world_model", "world_model"), ("wmrl", "wmrl")):
        cfg = load_train_config(None, ["corrector.debias.min_pairs=7", f"mode={mode}"])
        # the mode's preset over the domain's default corrector (the core's) with the override
        assert cfg.corrector == CorrectorConfig.preset(
            preset, apply_changes(CorrectorConfig(), {"debias.min_pairs": 7})
        )
        # nothing but the corrector depends on the mode
        assert {k: v for k, v in cfg.to_dict().items() if k not in ("mode", "corrector")} == {
            k: v for k, v in base.to_dict().items() if k not in ("mode", "corrector")
        }
    assert load_train_config(None, ["mode=real"]).corrector.scheduler.fraction == 1.0
    assert load_train_config(None, ["mode=world_model"]).corrector.scheduler.fraction == 0.0
    with pytest.deprecated_call():  # the old name of real-signal GRPO
        assert load_train_config(None, ["mode=sparse"]).mode == "real"
    assert not load_train_config(None, ["mode=real"]).uses_world_model
    assert load_train_config(None, ["mode=real", "world_model_in_real=true"]).uses_world_model
    with pytest.raises(ConfigError, match="contradicts"):
        load_train_config(None, ["mode=real", "corrector.scheduler.fraction=0.25"])


def test_config_is_validated_and_round_trips(tmp_path):
    smoke = load_train_config("smoke")
    assert smoke.group_size == 2 and smoke.groups_per_step == 1 and smoke.env.tasks == (0,)
    assert (
        smoke.env.max_episode_steps <= 20
        and smoke.env.image_size == 64
        and smoke.world_model.backend == "tiny"
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(smoke.to_dict()))
    assert load_train_config(path) == smoke
    over = load_train_config(path, ["mode=real", "learning_rate=3e-5", "env.tasks=[0,3]"])
    assert (over.mode, over.learning_rate, over.env.tasks) == ("real", 3e-5, (0, 3))
    for overrides, message in (
        (["ppo.epochs=0"], "ppo.epochs"),
        (["group_size=1"], "group_size"),
        (["mode=dense"], "mode"),
        (["ppo.nonsense=1"], "unknown config key"),
        (["ppo.microbatch_size=128"], "microbatch_size"),
        (["policy.temperature=0"], "temperature"),
        (["env.tasks=[12]"], "not a task of libero_10"),
        (["groups_per_step=40", "env.tasks=[0,1]"], "distinct initial states per task"),
        (["world_model.backend=local"], "model_path"),
        (["world_model.camera=robot0_eye_in_hand"], "world_model.camera"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_train_config("smoke", overrides)
    with pytest.raises(ConfigError, match="neither a preset"):
        load_train_config("no-such-preset")
    # a real-signal run need not name a world model that matches the camera: it does not load one
    assert not load_train_config(
        "smoke", ["mode=real", "world_model.camera=robot0_eye_in_hand"]
    ).uses_world_model


def test_the_embodied_trainer_refuses_asynchronous_anchors_before_building_anything(tmp_path):
    """Its anchor reads an already simulated episode's success flag: there is nothing to wait for."""
    from dataclasses import replace

    from wmrl.core.modes import apply_changes
    from wmrl.embodied.training import load_train_config
    from wmrl.embodied.training.trainer import EmbodiedTrainer

    config = load_train_config("smoke")
    config = replace(config, corrector=apply_changes(config.corrector, {"asynchrony.max_anchor_lag": 1}))
    with pytest.raises(ValueError, match="the embodied trainer: its anchor reads the success flag"):
        EmbodiedTrainer(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
