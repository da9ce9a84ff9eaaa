"""End to end: ``wmrl eval libero --policy random`` on the real simulator writes a report and a video."""

from __future__ import annotations

import json

import pytest

from wmrl.core.cli import main
from wmrl.embodied.rollout import episode_seed

pytestmark = [pytest.mark.libero, pytest.mark.slow]


def test_eval_libero_random_policy_writes_report_and_video(tmp_path, capsys):
    import imageio.v2 as imageio

    out = tmp_path / "eval"
    rc = main(
        [
            "eval", "libero", "--policy", "random", "--tasks", "0", "--states", "0,1", "--rollouts-per-state", "1",
            "--max-steps", "5", "--videos", "1", "--cameras", "agentview", "--image-size", "64",
            "--workers", "1", "--seed", "3", "--out", str(out), "--json", "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads((out / "eval_info.json").read_text())
    assert printed == report
    assert report["suite"] == "libero_10"
    assert [(e["task_id"], e["init_state"], e["rollout"]) for e in report["per_episode"]] == [
        (0, 0, 0),
        (0, 1, 0),
    ]
    for e in report["per_episode"]:
        assert e["steps"] == 5 and e["truncated"] is True and e["success"] is False
        assert e["split"] == "in_domain"
    assert [e["seed"] for e in report["per_episode"]] == [episode_seed(3, 0, s, 0) for s in (0, 1)]
    assert report["seeds"]["base_seeds"] == [3]
    assert report["aggregated"]["pc_success"] == 0.0
    assert report["aggregated"]["n_episodes"] == 2
    assert report["metrics"]["all"]["n_states"] == 2 and report["metrics"]["held_out"]["n_states"] == 0
    assert report["config"]["resolved"]["max_steps"] == 5
    assert report["software"]["robosuite"] == "1.5.2"
    videos = sorted((out / "videos").glob("*.mp4"))
    assert len(videos) == 1 and report["video_paths"] == [str(videos[0])]
    assert videos[0].name == "libero_10_task00_state00_rollout0_failure.mp4"
    frames = list(imageio.get_reader(videos[0]).iter_data())
    assert len(frames) == 6  # after settling + 5 steps
    assert frames[0].shape == (64, 64, 3)


class _KillsItsSimulator:
    """A random policy that kills the simulator process of one episode (a real crash: SIGKILL)."""

    def __init__(self, victim_state: int) -> None:
        from wmrl.embodied.policy import RandomPolicy

        self.inner = RandomPolicy(seed=0)
        self.victim_state = victim_state
        self.killed = False
        self._state = 0

    def reset(self, seed=None) -> None:
        self.inner.reset(seed=seed)

    def act(self, observation, instruction):
        import multiprocessing as mp
        import os
        import signal

        if not self.killed and self._state == self.victim_state:
            for child in mp.active_children():
                if child.name.startswith("wmrl-libero"):
                    os.kill(child.pid, signal.SIGKILL)
                    child.join(5)
            self.killed = True
        return self.inner.act(observation, instruction)


def test_eval_counts_a_crashed_simulator_as_a_failure_goes_on_and_resumes(tmp_path):
    from wmrl.embodied.eval.libero_eval import LiberoEvalConfig, run_libero_eval

    out = tmp_path / "eval"
    cfg = LiberoEvalConfig(
        tasks=(0,), states=(0, 1, 2), max_steps=3, cameras="agentview", image_size=32, workers=1,
        out_dir=str(out),
    )  # fmt: skip
    policy = _KillsItsSimulator(victim_state=1)
    seen = []

    def interrupt_after_two(record):
        seen.append(record.spec.init_state)
        policy._state = record.spec.init_state + 1  # the next episode's state (one worker, in order)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_libero_eval(cfg, policy, progress=False, on_episode=interrupt_after_two)
    assert policy.killed and seen == [0, 1]
    lines = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    episodes = [x for x in lines if x.get("kind") != "elapsed"]
    assert [e["init_state"] for e in episodes] == [0, 1]
    assert episodes[0]["error"] is None and episodes[0]["steps"] == 3
    crashed = episodes[1]
    assert crashed["success"] is False and "died" in crashed["error"]
    assert not (out / "eval_info.json").exists()

    resumed = []
    report = run_libero_eval(
        cfg, _KillsItsSimulator(victim_state=-1), progress=False, resume=True,
        on_episode=lambda r: resumed.append(r.spec.init_state),
    )  # fmt: skip
    assert resumed == [2]  # only the episode the interruption left
    assert [e["init_state"] for e in report["per_episode"]] == [0, 1, 2]
    assert report["per_episode"][2]["error"] is None and report["per_episode"][2]["steps"] == 3
    assert [f["init_state"] for f in report["simulator_failures"]] == [1]
    assert report["aggregated"]["n_episodes"] == 3
    # a different evaluation in the same folder is refused
    with pytest.raises(ValueError, match="different settings"):
        run_libero_eval(LiberoEvalConfig(**{**cfg.to_dict(), "max_steps": 4}), progress=False, resume=True)
