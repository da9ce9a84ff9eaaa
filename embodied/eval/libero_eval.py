"""``wmrl eval libero``: success of a policy over LIBERO tasks x initial states x k rollouts."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.embodied.env.config import DEFAULT_CAMERAS, LiberoEnvConfig, parse_cameras
from wmrl.embodied.env.images import check_orientation
from wmrl.embodied.env.splits import NUM_INIT_STATES, SPLITS, parse_indices, states_for_split
from wmrl.embodied.env.suites import DEFAULT_SUITE, SUITE_NUM_TASKS, check_suite
from wmrl.embodied.rollout.records import EpisodeRecord, EpisodeSpec, episode_seed

__all__ = ["LiberoEvalConfig", "choose_video_episodes", "format_summary", "make_specs", "run_libero_eval"]


@dataclass(frozen=True)
class LiberoEvalConfig:
    """What to evaluate and how.

    Attributes:
        suite: LIBERO suite (``libero_10`` = LIBERO-Long).
        tasks: task indices, a list or a string like ``"0,2,5-7"``; ``null`` = every task of the suite.
        states: initial-state indices (the same forms); ``null`` = the states of ``split``.
        split: ``"all"`` (50 states), ``"in_domain"`` (0-15) or ``"held_out"`` (16-49); used when
            ``states`` is ``None``.
        rollouts_per_state: k, rollouts from each (task, initial state); Best@k and All@k use it.
        policy: ``"random"`` or a saved-policy folder (see ``wmrl.embodied.eval.policy_loader``).
        videos: how many episodes to film (spread over tasks first, then states).
        workers: simulator processes (0 = in this process).
        max_steps: policy-step limit; ``None`` = the suite's standard (520 for libero_10).
        settle_steps: no-op steps after placing the initial state.
        seed: base seed; every episode's seed derives from it and the episode's coordinates.
        cameras: cameras rendered (and seen by the policy), a list or a comma-separated string;
            ``[]`` or ``"none"`` for none.
        image_size: square image side in pixels.
        orientation: image orientation given to the policy and written to videos.
        hard_reset: rebuild the MuJoCo model at every reset (LIBERO's evaluation protocol).
        out_dir: where ``eval_info.json`` and ``videos/`` go; ``None`` writes nothing (``wmrl eval``
            sets it from ``--out``).
    """

    suite: str = DEFAULT_SUITE
    tasks: str | tuple[int, ...] | None = None
    states: str | tuple[int, ...] | None = None
    split: str = "all"
    rollouts_per_state: int = 1
    policy: str = "random"
    videos: int = 0
    workers: int = 1
    max_steps: int | None = None
    settle_steps: int = 10
    seed: int = 0
    cameras: str | tuple[str, ...] = DEFAULT_CAMERAS
    image_size: int = 256
    orientation: str = "upright"
    hard_reset: bool = True
    out_dir: str | None = None

    def __post_init__(self) -> None:
        check_suite(self.suite)
        n_tasks = SUITE_NUM_TASKS[self.suite]
        if self.tasks is not None:
            tasks = parse_indices(self.tasks) if isinstance(self.tasks, str) else tuple(self.tasks)
            _check_indices("tasks", tasks, n_tasks)
            object.__setattr__(self, "tasks", tasks)
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {self.split!r}")
        if self.states is not None:
            if self.split != "all":
                raise ValueError("give initial states or a split, not both")
            states = parse_indices(self.states) if isinstance(self.states, str) else tuple(self.states)
            _check_indices("states", states, NUM_INIT_STATES)
            object.__setattr__(self, "states", states)
        _check_int("rollouts_per_state", self.rollouts_per_state, 1)
        _check_int("videos", self.videos, 0)
        _check_int("workers", self.workers, 0)
        _check_int("seed", self.seed, 0)
        object.__setattr__(self, "cameras", parse_cameras(self.cameras))
        check_orientation(self.orientation)
        if not self.policy:
            raise ValueError("policy must be 'random' or a saved-policy folder")
        if self.videos and not self.cameras:
            raise ValueError("videos need at least one camera (cameras is empty)")
        self.env_config()  # validates max_steps, settle_steps, image_size, cameras

    @property
    def task_ids(self) -> tuple[int, ...]:
        return self.tasks if self.tasks is not None else tuple(range(SUITE_NUM_TASKS[self.suite]))

    @property
    def state_ids(self) -> tuple[int, ...]:
        return self.states if self.states is not None else states_for_split(self.split)

    def env_config(self) -> LiberoEnvConfig:
        """The environment every worker builds."""
        return LiberoEnvConfig(
            suite=self.suite,
            task_id=self.task_ids[0],
            cameras=self.cameras,
            image_height=self.image_size,
            image_width=self.image_size,
            orientation=self.orientation,
            max_steps=self.max_steps,
            settle_steps=self.settle_steps,
            hard_reset=self.hard_reset,
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("tasks", "states", "cameras"):
            if out[key] is not None:
                out[key] = list(out[key])
        out["resolved_tasks"] = list(self.task_ids)
        out["resolved_states"] = list(self.state_ids)
        out["resolved_max_steps"] = self.env_config().episode_max_steps
        return out


def _check_int(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")


def _check_indices(name: str, values: tuple, size: int) -> None:
    if not values:
        raise ValueError(f"{name} must not be empty")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < size:
            raise ValueError(f"{name} must be integers in [0, {size - 1}]; got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must not repeat; got {list(values)}")


def make_specs(config: LiberoEvalConfig) -> list[EpisodeSpec]:
    """Episodes task-major (task, then initial state, then rollout), with derived seeds and chosen videos."""
    specs = [
        EpisodeSpec(task, state, episode_seed(config.seed, task, state, r), r)
        for task in config.task_ids
        for state in config.state_ids
        for r in range(config.rollouts_per_state)
    ]
    filmed = set(choose_video_episodes(specs, config.videos))
    return [dataclasses.replace(s, record_frames=i in filmed) for i, s in enumerate(specs)]


def choose_video_episodes(specs: Sequence[EpisodeSpec], n: int) -> list[int]:
    """Indices of ``n`` episodes to film: the first rollout of the first state of every task, then the next state..."""
    order = sorted(range(len(specs)), key=lambda i: (specs[i].rollout, specs[i].init_state, specs[i].task_id))
    return sorted(order[:n])


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc="LIBERO episodes",
        unit="ep",
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
    )


def run_libero_eval(
    config: LiberoEvalConfig,
    policy: Any = None,
    *,
    progress: bool = True,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
) -> dict[str, Any]:
    """Run the evaluation and return the report (also written to ``out_dir`` when set).

    Args:
        config: the evaluation.
        policy: a policy object (or one per worker); ``None`` loads ``config.policy``.
        progress: show a tqdm bar on stderr.
        on_episode: called with each finished episode.
    """
    from wmrl.embodied.env.suites import get_task, load_init_states
    from wmrl.embodied.eval.policy_loader import load_policy, policy_description
    from wmrl.embodied.eval.report import build_report
    from wmrl.embodied.eval.video import episode_frames, write_video
    from wmrl.embodied.policy.random_policy import RandomPolicy
    from wmrl.embodied.rollout.runner import RolloutConfig, RolloutRunner

    tasks = {t: get_task(config.suite, t) for t in config.task_ids}
    for task in tasks.values():
        n_states = load_init_states(task).shape[0]
        too_big = [s for s in config.state_ids if s >= n_states]
        if too_big:
            raise ValueError(
                f"task {task.task_id} has {n_states} initial states; states {too_big} do not exist"
            )
    n_slots = max(1, config.workers)
    if policy is None:
        description = policy_description(config.policy)
        if config.policy == "random":
            # One instance per worker: each episode's actions then depend on its seed alone.
            policy = [RandomPolicy(seed=config.seed) for _ in range(n_slots)]
        else:
            policy = load_policy(config.policy)
    else:
        description = {"spec": "object", "repr": repr(policy)}

    specs = make_specs(config)
    out_dir = Path(config.out_dir) if config.out_dir else None
    video_paths: dict[int, str] = {}
    successes = 0
    done = 0
    bar = _progress_bar(len(specs), progress)
    index_of = {id(s): i for i, s in enumerate(specs)}

    def on_record(record: EpisodeRecord) -> None:
        nonlocal successes, done
        done += 1
        successes += int(record.success)
        bar.set_postfix(success=f"{100.0 * successes / done:.1f}%", task=record.spec.task_id)
        bar.update(1)
        i = index_of[id(record.spec)]
        if out_dir is not None and record.frames:
            name = (
                f"{config.suite}_task{record.spec.task_id:02d}_state{record.spec.init_state:02d}"
                f"_rollout{record.spec.rollout}_{'success' if record.success else 'failure'}.mp4"
            )
            path = write_video(out_dir / "videos" / name, episode_frames(record.frames), fps=20)
            video_paths[i] = str(path)
        record.frames = {}  # the video is written; do not hold every frame until the end
        if on_episode is not None:
            on_episode(record)

    start = time.perf_counter()
    try:
        with RolloutRunner(config.env_config(), RolloutConfig(workers=config.workers)) as runner:
            records = runner.run(policy, specs, progress=on_record)
    finally:
        bar.close()
    eval_s = time.perf_counter() - start

    report = build_report(
        suite=config.suite,
        records=records,
        tasks=tasks,
        eval_s=eval_s,
        video_paths=video_paths,
        policy=description,
        config=config.to_dict(),
        base_seed=config.seed,
    )
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "eval_info.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _pct(value: float | None) -> str:
    return "   -  " if value is None else f"{100.0 * value:5.1f}%"


def format_summary(report: Mapping[str, Any]) -> str:
    """A human-readable table of a report: per task and per split, Avg / Best@k / All@k."""
    k = report["metrics"]["all"]["k"]
    lines = [
        f"LIBERO evaluation: {report['suite']}, policy {report['policy'].get('spec')}, k={k}, "
        f"{report['aggregated']['n_episodes']} episodes in {report['aggregated']['eval_s']:.1f} s",
        f"{'':28s} {'Avg':>7s} {f'Best@{k}':>8s} {f'All@{k}':>7s} {'states':>7s}",
    ]
    for entry in report["per_task"]:
        m = entry["success_metrics"]["all"]
        label = f"task {entry['task_id']:2d}"
        lines.append(
            f"{label:28s} {_pct(m['avg']):>7s} {_pct(m['best_at_k']):>8s} {_pct(m['all_at_k']):>7s} {m['n_states']:7d}"
        )
    for split, label in (
        ("in_domain", "in-domain (states 0-15)"),
        ("held_out", "held-out (states 16-49)"),
        ("all", "overall"),
    ):
        m = report["metrics"][split]
        lines.append(
            f"{label:28s} {_pct(m['avg']):>7s} {_pct(m['best_at_k']):>8s} {_pct(m['all_at_k']):>7s} {m['n_states']:7d}"
        )
    if report.get("video_paths"):
        lines.append(f"videos: {len(report['video_paths'])} in {Path(report['video_paths'][0]).parent}")
    return "\n".join(lines)
