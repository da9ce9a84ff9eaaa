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
    assert report["seeds"]["base_seed"] == 3
    assert report["aggregated"]["pc_success"] == 0.0
    assert report["aggregated"]["n_episodes"] == 2
    assert report["metrics"]["all"]["n_states"] == 2 and report["metrics"]["held_out"]["n_states"] == 0
    assert report["config"]["resolved_max_steps"] == 5
    assert report["software"]["robosuite"] == "1.5.2"
    videos = sorted((out / "videos").glob("*.mp4"))
    assert len(videos) == 1 and report["video_paths"] == [str(videos[0])]
    assert videos[0].name == "libero_10_task00_state00_rollout0_failure.mp4"
    frames = list(imageio.get_reader(videos[0]).iter_data())
    assert len(frames) == 6  # after settling + 5 steps
    assert frames[0].shape == (64, 64, 3)
