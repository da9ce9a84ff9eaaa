"""The evaluation plumbing that needs no simulator: episode plans, the report, policy loading, videos, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from wmrl.embodied.env.splits import parse_indices
from wmrl.embodied.env.suites import TaskInfo
from wmrl.embodied.eval.libero_eval import LiberoEvalConfig, choose_video_episodes, format_summary, make_specs
from wmrl.embodied.eval.report import build_report, episode_entry
from wmrl.embodied.eval.video import episode_frames, write_video
from wmrl.embodied.policy import RandomPolicy
from wmrl.embodied.rollout import EpisodeRecord, EpisodeSpec, episode_seed


def _record(task, state, rollout, success, steps=3):
    rewards = np.zeros(steps, dtype=np.float32)
    if success:
        rewards[-1] = 1.0
    return EpisodeRecord(
        spec=EpisodeSpec(task, state, episode_seed(0, task, state, rollout), rollout),
        instruction=f"task {task}",
        success=success,
        steps=steps,
        terminated=success,
        truncated=not success,
        actions=np.zeros((steps, 7), np.float32),
        rewards=rewards,
        token_ids=None,
        log_probs=None,
    )


def _tasks(*ids):
    return {
        i: TaskInfo("libero_10", i, f"TASK_{i}", f"do thing {i}", Path(f"/x/{i}.bddl"), Path(f"/x/{i}.init"))
        for i in ids
    }


def test_make_specs_task_major_with_derived_seeds_and_spread_videos():
    cfg = LiberoEvalConfig(tasks=(2, 5), states=(0, 17), rollouts_per_state=2, videos=3, seed=7)
    plan = make_specs(cfg)
    assert {b for b, _ in plan} == {7}
    specs = [s for _, s in plan]
    assert [(s.task_id, s.init_state, s.rollout) for s in specs] == [
        (2, 0, 0), (2, 0, 1), (2, 17, 0), (2, 17, 1), (5, 0, 0), (5, 0, 1), (5, 17, 0), (5, 17, 1),
    ]  # fmt: skip
    assert all(s.seed == episode_seed(7, s.task_id, s.init_state, s.rollout) for s in specs)
    assert len({s.seed for s in specs}) == 8
    filmed = [(s.task_id, s.init_state, s.rollout) for s in specs if s.record_frames]
    # First rollout of the first state of every task, then the next state.
    assert filmed == [(2, 0, 0), (2, 17, 0), (5, 0, 0)]
    assert choose_video_episodes(specs, 0) == []


def test_eval_config_resolves_splits_and_validates():
    assert LiberoEvalConfig(split="held_out").state_ids == tuple(range(16, 50))
    assert LiberoEvalConfig().task_ids == tuple(range(10))
    assert LiberoEvalConfig().env_config().episode_max_steps == 520
    with pytest.raises(ValueError, match="not both"):
        LiberoEvalConfig(states=(0,), split="in_domain")
    with pytest.raises(ValueError, match="states must be integers in"):
        LiberoEvalConfig(states=(50,))
    with pytest.raises(ValueError, match="tasks must not repeat"):
        LiberoEvalConfig(tasks=(1, 1))
    with pytest.raises(ValueError, match="videos need at least one camera"):
        LiberoEvalConfig(videos=1, cameras="none")
    with pytest.raises(ValueError, match="rollouts_per_state"):
        LiberoEvalConfig(rollouts_per_state=0)


# The keys lerobot-eval writes (lerobot main, src/lerobot/scripts/lerobot_eval.py: eval_policy and
# eval_policy_all, with predicted_video_paths; v0.4.4 writes the same without that key).
LEROBOT_PER_EPISODE = {"episode_ix", "sum_reward", "max_reward", "success", "seed"}
LEROBOT_AGGREGATED = {"avg_sum_reward", "avg_max_reward", "pc_success", "eval_s", "eval_ep_s"}
LEROBOT_TASK_METRICS = {"sum_rewards", "max_rewards", "successes", "video_paths", "predicted_video_paths"}
LEROBOT_GROUP = {
    "avg_sum_reward",
    "avg_max_reward",
    "pc_success",
    "n_episodes",
    "video_paths",
    "predicted_video_paths",
}
LEROBOT_OVERALL = LEROBOT_AGGREGATED | {"n_episodes", "video_paths", "predicted_video_paths"}


def _entries(records, base_seed=0, videos=None):
    videos = videos or {}
    return [episode_entry(r, base_seed, videos.get(i)) for i, r in enumerate(records)]


def test_report_has_lerobot_fields_and_wmrl_metrics():
    records = [
        _record(0, 0, 0, True),
        _record(0, 0, 1, False),
        _record(0, 20, 0, False),
        _record(0, 20, 1, False),
        _record(1, 3, 0, True),
        _record(1, 3, 1, True),
    ]
    report = build_report(
        suite="libero_10",
        entries=_entries(records, videos={0: "/v/a.mp4"}),
        tasks=_tasks(0, 1),
        eval_s=12.0,
        policy={"spec": "random"},
        config={"k": 2},
        seeds=[0],
    )
    json.dumps(report)  # JSON-ready
    # every key lerobot-eval writes, single-env and multi-task layouts
    assert set(report["per_episode"][0]) >= LEROBOT_PER_EPISODE
    assert set(report["aggregated"]) >= LEROBOT_AGGREGATED
    for task in report["per_task"]:
        assert {"task_group", "task_id", "metrics"} <= set(task) and set(
            task["metrics"]
        ) >= LEROBOT_TASK_METRICS
    assert set(report["per_group"]["libero_10"]) >= LEROBOT_GROUP
    assert set(report["overall"]) >= LEROBOT_OVERALL
    assert [e["episode_ix"] for e in report["per_episode"]] == list(range(6))
    agg = report["aggregated"]
    assert agg["pc_success"] == pytest.approx(100 * 3 / 6)
    assert agg["avg_sum_reward"] == pytest.approx(0.5) and agg["avg_max_reward"] == pytest.approx(0.5)
    assert agg["eval_s"] == 12.0 and agg["eval_ep_s"] == pytest.approx(2.0)
    assert report["video_paths"] == ["/v/a.mp4"]
    assert report["per_episode"][0]["video_path"] == "/v/a.mp4"
    assert [t["task_id"] for t in report["per_task"]] == [0, 1]
    assert report["per_task"][0]["metrics"]["successes"] == [True, False, False, False]
    assert report["per_task"][0]["metrics"]["video_paths"] == ["/v/a.mp4"]
    assert report["per_group"]["libero_10"]["n_episodes"] == 6
    assert report["overall"]["pc_success"] == agg["pc_success"]
    assert report["overall"]["predicted_video_paths"] == []
    # WMRL metrics (fractions) by split
    m = report["metrics"]
    assert m["all"]["k"] == 2 and m["all"]["n_seeds"] == 1
    assert m["all"]["best_at_k"] == pytest.approx(2 / 3) and m["all"]["all_at_k"] == pytest.approx(1 / 3)
    assert m["in_domain"]["avg"] == pytest.approx(3 / 4) and m["held_out"]["avg"] == 0.0
    assert m["all"]["avg_ci95"] is None  # one seed: the spread across seeds is unknown, not zero
    lo, hi = m["all"]["avg_wilson95"]
    assert lo < 0.5 < hi
    assert report["per_task"][1]["success_metrics"]["held_out"]["avg"] is None
    assert report["per_episode"][2]["split"] == "held_out"
    assert report["split_definition"]["in_domain_states"] == list(range(16))
    assert report["seeds"]["base_seeds"] == [0] and report["software"]["python"]
    assert report["simulator_failures"] == []
    text = format_summary(report)
    assert "Best@2" in text and "in-domain" in text and "66.7%" in text


def test_report_over_seeds_gives_mean_and_interval_per_task_and_overall():
    # seed 0: task 0 succeeds on 1 of 2 states; seed 1: on 2 of 2; seed 2: on 0 of 2
    plan = {0: (True, False), 1: (True, True), 2: (False, False)}
    entries = []
    for seed, outcomes in plan.items():
        recs = [_record(0, s, 0, ok) for s, ok in zip((0, 20), outcomes, strict=True)]
        entries += _entries(recs, base_seed=seed)
    report = build_report(
        suite="libero_10", entries=entries, tasks=_tasks(0), eval_s=1.0, policy={}, config={}, seeds=[0, 1, 2]
    )
    m = report["metrics"]["all"]
    assert m["n_seeds"] == 3 and m["n_episodes"] == 6
    assert m["avg"] == pytest.approx(0.5)
    # t interval of (0.5, 1, 0): mean 0.5, sd 0.5, half-width 4.303 * 0.5 / sqrt(3)
    half = 4.303 * 0.5 / np.sqrt(3)
    assert m["avg_ci95"] == pytest.approx([0.5 - half, 0.5 + half])
    assert [report["metrics"]["per_seed"][str(s)]["all"]["avg"] for s in (0, 1, 2)] == [0.5, 1.0, 0.0]
    task = report["per_task"][0]["success_metrics"]
    assert task["all"]["avg_ci95"] == pytest.approx(m["avg_ci95"])
    assert task["in_domain"]["avg"] == pytest.approx(2 / 3)
    assert "95% interval across seeds" in format_summary(report)


def test_simulator_failures_are_listed_and_count_as_failures():
    bad = _record(0, 1, 0, False)
    bad.error = "RuntimeError: MuJoCo exploded"
    report = build_report(
        suite="libero_10",
        entries=_entries([_record(0, 0, 0, True), bad]),
        tasks=_tasks(0),
        eval_s=1.0,
        policy={},
        config={},
        seeds=[0],
    )
    assert report["aggregated"]["pc_success"] == 50.0
    assert report["simulator_failures"] == [
        {"episode_ix": 1, "task_id": 0, "init_state": 1, "rollout": 0, "base_seed": 0, "error": bad.error}
    ]
    assert "simulator failures" in format_summary(report)


def test_observation_comes_from_the_policy_and_a_mismatch_is_refused():
    contract = {"camera": "agentview", "orientation": "rotate180", "render_size": 224}
    obs = LiberoEvalConfig().observation(contract)
    assert (obs["orientation"], obs["render_size"]) == ("rotate180", 224)
    assert obs["orientation_from"] == "policy checkpoint"
    env = LiberoEvalConfig().env_config(obs)
    assert (env.orientation, env.image_height) == ("rotate180", 224)
    assert LiberoEvalConfig().observation(None)["render_size"] == 256  # a policy that records nothing
    with pytest.raises(ValueError, match="trained on orientation 'rotate180'"):
        LiberoEvalConfig(orientation="upright").observation(contract)
    with pytest.raises(ValueError, match="trained on render_size 224"):
        LiberoEvalConfig(image_size=256).observation(contract)
    forced = LiberoEvalConfig(image_size=256, allow_observation_mismatch=True).observation(contract)
    assert forced["render_size"] == 256 and "differs" in forced["render_size_from"]
    with pytest.raises(ValueError, match="reads camera 'agentview'"):
        LiberoEvalConfig(cameras="robot0_eye_in_hand").observation(contract)


def test_policy_loader(tmp_path, monkeypatch):
    from wmrl.embodied.eval import policy_loader

    monkeypatch.setattr(policy_loader, "POLICY_TYPES", dict(policy_loader.POLICY_TYPES))
    load_policy, register_policy_type = policy_loader.load_policy, policy_loader.register_policy_type
    p = load_policy("random", seed=3)
    assert isinstance(p, RandomPolicy) and p.seed == 3
    folder = RandomPolicy(seed=5, n_bins=16).save(tmp_path / "rand")
    loaded = load_policy(folder)
    assert isinstance(loaded, RandomPolicy) and (loaded.seed, loaded.n_bins) == (5, 16)
    # A factory named in policy.json, without registration.
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "policy.json").write_text(
        json.dumps(
            {
                "type": "mine",
                "factory": "wmrl.embodied.policy.random_policy:load_random_policy",
                "kwargs": {"seed": 9},
            }
        )
    )
    assert load_policy(custom).seed == 9
    # A registered type.
    (custom / "policy.json").write_text(json.dumps({"type": "registered_test_type"}))
    register_policy_type("registered_test_type", lambda folder, **kw: RandomPolicy(seed=11))
    assert load_policy(custom).seed == 11
    (custom / "policy.json").write_text(json.dumps({"type": "nope"}))
    with pytest.raises(ValueError, match="unknown policy type 'nope'"):
        load_policy(custom)
    (custom / "policy.json").write_text(json.dumps({"type": "random", "weights": "x"}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_policy(custom)
    with pytest.raises(FileNotFoundError, match=r"policy\.json is missing"):
        load_policy(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_policy(tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown RandomPolicy arguments"):
        load_policy("random", temperature=1.0)


def test_random_policy_tokens_and_reseeding():
    p = RandomPolicy(seed=0, n_bins=4)
    p.reset(seed=1)
    a = [p.act({}, "x") for _ in range(3)]
    p.reset(seed=1)
    b = [p.act({}, "x") for _ in range(3)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.action, y.action)
        assert x.token_ids.shape == (7,) and x.log_prob == pytest.approx(-7 * np.log(4))
        assert set(np.round(x.action[:6], 6)) <= {-0.75, -0.25, 0.25, 0.75}
        assert x.action[6] in (-1.0, 1.0) and x.action[6] == (1.0 if x.token_ids[6] >= 2 else -1.0)
    with pytest.raises(ValueError, match="n_bins"):
        RandomPolicy(n_bins=1)


def test_video_round_trip(tmp_path):
    import imageio.v2 as imageio

    rng = np.random.default_rng(0)
    frames = {
        "agentview": rng.integers(0, 255, size=(5, 32, 32, 3), dtype=np.uint8),
        "robot0_eye_in_hand": rng.integers(0, 255, size=(5, 32, 32, 3), dtype=np.uint8),
    }
    tiled = episode_frames(frames)
    assert tiled.shape == (5, 32, 64, 3)
    np.testing.assert_array_equal(tiled[:, :, 32:], frames["robot0_eye_in_hand"])
    path = write_video(tmp_path / "v" / "ep.mp4", tiled, fps=20)
    reader = imageio.get_reader(path)
    back = list(reader.iter_data())
    assert len(back) == 5 and back[0].shape == (32, 64, 3)
    assert reader.get_meta_data()["fps"] == 20
    with pytest.raises(ValueError, match="no frames recorded"):
        episode_frames(frames, ["wrist"])
    with pytest.raises(ValueError, match="uint8"):
        write_video(tmp_path / "bad.mp4", tiled.astype(np.float32))


def test_parse_indices():
    assert parse_indices("0,2,5-7") == (0, 2, 5, 6, 7)
    assert parse_indices("3") == (3,)
    for bad in ("a", "5-3", ","):
        with pytest.raises(ValueError):
            parse_indices(bad)


def test_cli_is_registered_and_rejects_bad_arguments(capsys):
    from wmrl.core.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "libero", "--help"])
    assert "--rollouts-per-state" in capsys.readouterr().out
    # Both states and a split: a clear error, before any simulator starts.
    assert main(["eval", "libero", "--states", "0", "--split", "held_out", "--no-progress"]) == 2
    assert "not both" in capsys.readouterr().err
