"""``wmrl eval libero``: success of a policy over LIBERO tasks x initial states x k rollouts."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from wmrl.embodied.env.config import DEFAULT_CAMERAS, LiberoEnvConfig, parse_cameras
from wmrl.embodied.env.images import check_orientation
from wmrl.embodied.env.splits import NUM_INIT_STATES, SPLITS, parse_indices, states_for_split
from wmrl.embodied.env.suites import DEFAULT_SUITE, SUITE_NUM_TASKS, check_suite
from wmrl.embodied.rollout.records import EpisodeRecord, EpisodeSpec, episode_seed

__all__ = [
    "LiberoEvalConfig",
    "choose_video_episodes",
    "format_summary",
    "load_eval_policy",
    "make_specs",
    "run_libero_eval",
]


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
        policy: ``"random"``, ``"scripted"`` (the privileged scripted expert) or a saved-policy
            folder (see ``wmrl.embodied.eval.policy_loader``).
        videos: how many episodes to film (spread over tasks first, then states).
        workers: simulator processes (0 = in this process).
        max_steps: policy-step limit; ``None`` = the suite's standard (520 for libero_10).
        settle_steps: no-op steps after placing the initial state.
        seed: base seed; every episode's seed derives from it and the episode's coordinates.
        seeds: several base seeds (a list or ``"0,1,2"``): the whole evaluation runs once per seed and
            the report gives each seed's metrics and their mean with a 95% interval across seeds
            (OpenVLA reports the mean of 3). ``None`` = ``[seed]``.
        cameras: cameras rendered (and seen by the policy), a list or a comma-separated string;
            ``[]`` or ``"none"`` for none.
        image_size: square render side in pixels; ``None`` = the size the policy was trained on
            (recorded in its checkpoint), else 256.
        orientation: image orientation given to the policy and written to videos; ``None`` = the one
            the policy was trained on (recorded in its checkpoint), else ``upright``.
        allow_observation_mismatch: evaluate even when ``image_size``/``orientation`` differ from what
            the policy's checkpoint records (refused otherwise: such numbers measure the mismatch).
        temperature: the policy's sampling temperature; 0 = greedy (upstream's evaluation). It is
            never inherited from training.
        action_tokens_only: decode only among the 256 action tokens; ``False`` = greedy over the full
            vocabulary as upstream's ``predict_action`` (a non-action argmax decodes to an end bin and
            is counted in the report as ``non_action_tokens``).
        unnorm_key: dataset statistics that un-normalise actions; ``None`` = the suite's (with
            upstream's ``<suite>_no_noops`` fallback). Statistics of another suite are an error.
        device, dtype: where the policy runs (``auto``: CUDA + bfloat16 when available, else CPU + float32).
        hard_reset: rebuild the MuJoCo model at every reset (LIBERO's evaluation protocol).
        out_dir: where ``eval_info.json``, ``episodes.jsonl`` and ``videos/`` go; ``None`` writes
            nothing (``wmrl eval`` sets it from ``--out``).
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
    seeds: str | tuple[int, ...] | None = None
    cameras: str | tuple[str, ...] = DEFAULT_CAMERAS
    image_size: int | None = None
    orientation: str | None = None
    allow_observation_mismatch: bool = False
    temperature: float = 0.0
    action_tokens_only: bool = False
    unnorm_key: str | None = None
    device: str = "auto"
    dtype: str = "auto"
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
        if self.seeds is not None:
            seeds = parse_indices(self.seeds) if isinstance(self.seeds, str) else tuple(self.seeds)
            if not seeds or len(set(seeds)) != len(seeds):
                raise ValueError(f"seeds must be distinct and not empty; got {self.seeds!r}")
            for v in seeds:
                _check_int("seeds", v, 0)
            object.__setattr__(self, "seeds", seeds)
        object.__setattr__(self, "cameras", parse_cameras(self.cameras))
        if self.orientation is not None:
            check_orientation(self.orientation)
        if self.image_size is not None:
            _check_int("image_size", self.image_size, 8)
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0 (0 = greedy); got {self.temperature!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16; got {self.dtype!r}")
        if not self.policy:
            raise ValueError("policy must be 'random', 'scripted' or a saved-policy folder")
        if self.videos and not self.cameras:
            raise ValueError("videos need at least one camera (cameras is empty)")
        self.env_config()  # validates max_steps, settle_steps, image_size, cameras

    # __post_init__ parses a string of tasks, states, seeds or cameras into a tuple
    @property
    def task_ids(self) -> tuple[int, ...]:
        return (
            cast(tuple[int, ...], self.tasks)
            if self.tasks is not None
            else tuple(range(SUITE_NUM_TASKS[self.suite]))
        )

    @property
    def state_ids(self) -> tuple[int, ...]:
        return cast(tuple[int, ...], self.states) if self.states is not None else states_for_split(self.split)

    @property
    def seed_list(self) -> tuple[int, ...]:
        return cast(tuple[int, ...], self.seeds) if self.seeds is not None else (self.seed,)

    def observation(self, contract: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Orientation and render size of the frames, from this config or the policy's checkpoint.

        Args:
            contract: what the policy records about its training images (``observation_contract``:
                ``camera``, ``orientation``, ``render_size``), or ``None`` for a policy that records none.

        Raises:
            ValueError: a setting differs from the policy's record (unless ``allow_observation_mismatch``),
                or the policy's camera is not rendered.
        """
        contract = dict(contract or {})
        out: dict[str, Any] = {}
        for key, field_name, default in (
            ("orientation", "orientation", "upright"),
            ("render_size", "image_size", 256),
        ):
            given, recorded = getattr(self, field_name), contract.get(key)
            if given is None:
                out[key] = recorded if recorded is not None else default
                out[f"{key}_from"] = "policy checkpoint" if recorded is not None else "default"
                continue
            if recorded is not None and given != recorded and not self.allow_observation_mismatch:
                raise ValueError(
                    f"{field_name}={given!r} but the policy was trained on {key} {recorded!r} (its checkpoint "
                    f"records it); leave {field_name} unset to use the policy's, or set "
                    "allow_observation_mismatch=true to measure the mismatch"
                )
            out[key] = given
            out[f"{key}_from"] = "config" + (
                " (differs from the policy's)" if recorded not in (None, given) else ""
            )
        camera = contract.get("camera")
        for read in (camera, contract.get("wrist_camera")):
            if read is not None and read not in self.cameras:
                raise ValueError(
                    f"the policy reads camera {read!r}, which is not in cameras {list(self.cameras)}"
                )
        out["policy_camera"] = camera
        out["jpeg_quality"] = contract.get("jpeg_quality")
        # a privileged policy (the scripted expert) reads the simulator's scene
        out["scene_state"] = bool(contract.get("scene_state", False))
        return out

    def env_config(self, observation: Mapping[str, Any] | None = None) -> LiberoEnvConfig:
        """The environment every worker builds (frames as :meth:`observation` resolved them)."""
        obs = observation or self.observation()
        return LiberoEnvConfig(
            suite=self.suite,
            task_id=self.task_ids[0],
            cameras=cast(tuple[str, ...], self.cameras),  # parsed in __post_init__
            image_height=obs["render_size"],
            image_width=obs["render_size"],
            orientation=obs["orientation"],
            max_steps=self.max_steps,
            settle_steps=self.settle_steps,
            hard_reset=self.hard_reset,
            scene_state=bool(obs.get("scene_state", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (``config.json`` of an evaluation; loads back with ``--config``)."""
        out = dataclasses.asdict(self)
        for key in ("tasks", "states", "cameras", "seeds"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out

    def resolved(self) -> dict[str, Any]:
        return {
            "tasks": list(self.task_ids),
            "states": list(self.state_ids),
            "seeds": list(self.seed_list),
            "max_steps": self.env_config().episode_max_steps,
        }


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


def make_specs(config: LiberoEvalConfig) -> list[tuple[int, EpisodeSpec]]:
    """``(base seed, episode)`` pairs: seed-major, then task, initial state, rollout; videos chosen in the first seed."""
    plan: list[tuple[int, EpisodeSpec]] = []
    for n, base in enumerate(config.seed_list):
        specs = [
            EpisodeSpec(task, state, episode_seed(base, task, state, r), r)
            for task in config.task_ids
            for state in config.state_ids
            for r in range(config.rollouts_per_state)
        ]
        filmed = set(choose_video_episodes(specs, config.videos)) if n == 0 else set()
        plan.extend((base, dataclasses.replace(s, record_frames=i in filmed)) for i, s in enumerate(specs))
    return plan


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


EPISODES_FILE = "episodes.jsonl"
REPORT_FILE = "eval_info.json"
CONFIG_FILE = "config.json"
# Keys a resumed evaluation may change: they do not change what an episode is.
_RESUMABLE = frozenset({"workers", "out_dir", "device", "dtype"})


def _policy_settings(config: LiberoEvalConfig) -> dict[str, Any]:
    """The acting settings an evaluation gives a MiniVLA policy (never the training temperature)."""
    return {
        "temperature": float(config.temperature),
        "constrain_to_actions": bool(config.action_tokens_only),
        "unnorm_key": config.unnorm_key or config.suite,
        "device": config.device,
        "dtype": config.dtype,
    }


def load_eval_policy(config: LiberoEvalConfig) -> tuple[Any, dict[str, Any]]:
    """The policy of ``config.policy`` with the evaluation's acting settings, and its description."""
    from wmrl.embodied.eval.policy_loader import load_policy, policy_description
    from wmrl.embodied.policy.random_policy import RandomPolicy

    description = policy_description(config.policy)
    if config.policy == "random":
        # One instance per worker: each episode's actions then depend on its seed alone.
        return [RandomPolicy(seed=config.seed) for _ in range(max(1, config.workers))], description
    if description["type"] == "scripted":
        # One per worker: the expert keeps its episode's plan between steps.
        saved = description.get("policy_json", {}).get("kwargs", {})
        if saved.get("suite", config.suite) != config.suite:
            raise ValueError(
                f"{config.policy} is a scripted expert for {saved['suite']}; this evaluation runs {config.suite}"
            )
        experts = [load_policy(config.policy, suite=config.suite) for _ in range(max(1, config.workers))]
        return experts, description
    if description["type"] == "minivla":
        settings = _policy_settings(config)
        description["settings"] = settings
        return load_policy(config.policy, **settings), description
    return load_policy(config.policy), description


def _read_done(out_dir: Path, config: LiberoEvalConfig) -> tuple[list[dict[str, Any]], float]:
    """Episodes an interrupted evaluation in ``out_dir`` finished, after checking it is the same evaluation."""
    saved_path = out_dir / CONFIG_FILE
    if not saved_path.is_file():
        return [], 0.0
    saved = json.loads(saved_path.read_text())
    now = config.to_dict()
    differs = sorted(k for k in set(saved) | set(now) if k not in _RESUMABLE and saved.get(k) != now.get(k))
    if differs:
        raise ValueError(
            f"{out_dir} holds an evaluation with different settings ({differs}); a resumed evaluation may "
            f"change only {sorted(_RESUMABLE - {'out_dir'})}"
        )
    entries, elapsed = [], 0.0
    path = out_dir / EPISODES_FILE
    if path.is_file():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut by the interruption: that episode is run again
            if row.get("kind") == "elapsed":
                elapsed += float(row["eval_s"])
            else:
                entries.append(row)
    return entries, elapsed


def run_libero_eval(
    config: LiberoEvalConfig,
    policy: Any = None,
    *,
    progress: bool = True,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run the evaluation and return the report (also written to ``out_dir`` when set).

    Each finished episode is appended to ``out_dir/episodes.jsonl`` at once, so an interrupted
    evaluation continues with ``resume=True`` where it stopped (the episodes already there are not
    run again). A simulator that fails in an episode ends that episode as a failure with its reason
    (``error``) and the evaluation goes on with a fresh simulator.

    Args:
        config: the evaluation.
        policy: a policy object (or one per worker); ``None`` loads ``config.policy``.
        progress: show a tqdm bar on stderr.
        on_episode: called with each finished episode.
        resume: continue the evaluation in ``config.out_dir``.
    """
    from wmrl.core.runlog import write_json_atomic
    from wmrl.embodied.env.suites import get_task, load_init_states
    from wmrl.embodied.eval.report import build_report, episode_entry, episode_key
    from wmrl.embodied.eval.video import episode_frames, write_video
    from wmrl.embodied.rollout.runner import RolloutConfig, RolloutRunner

    tasks = {t: get_task(config.suite, t) for t in config.task_ids}
    for task in tasks.values():
        n_states = load_init_states(task).shape[0]
        too_big = [s for s in config.state_ids if s >= n_states]
        if too_big:
            raise ValueError(
                f"task {task.task_id} has {n_states} initial states; states {too_big} do not exist"
            )
    out_dir = Path(config.out_dir) if config.out_dir else None
    if resume and out_dir is None:
        raise ValueError("resuming an evaluation needs out_dir")
    # resume without out_dir was refused above
    done, elapsed = _read_done(out_dir, config) if resume and out_dir is not None else ([], 0.0)
    if not resume and out_dir is not None and (out_dir / EPISODES_FILE).exists():
        raise FileExistsError(
            f"{out_dir} already holds an evaluation; continue it with --resume or choose another --out"
        )
    if policy is None:
        policy, description = load_eval_policy(config)
    else:
        description = {"spec": "object", "repr": repr(policy)}
    first = policy[0] if isinstance(policy, (list, tuple)) else policy
    contract = getattr(first, "observation_contract", None)
    observation = config.observation(contract if isinstance(contract, Mapping) else None)
    env_config = config.env_config(observation)

    plan = make_specs(config)
    done_by_key = {episode_key(e): e for e in done}
    todo = [(b, s) for b, s in plan if (b, s.task_id, s.init_state, s.rollout) not in done_by_key]
    base_of = {id(s): b for b, s in todo}
    log = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / CONFIG_FILE, config.to_dict())
        log = open(out_dir / EPISODES_FILE, "a")  # noqa: SIM115 (closed below)
    new_entries: list[dict[str, Any]] = []
    successes = sum(int(e["success"]) for e in done)
    bar = _progress_bar(len(plan), progress)
    bar.update(len(done))

    def on_record(record: EpisodeRecord) -> None:
        nonlocal successes
        successes += int(record.success)
        bar.update(1)
        bar.set_postfix(success=f"{100.0 * successes / max(1, bar.n):.1f}%", task=record.spec.task_id)
        video = None
        if out_dir is not None and record.frames:
            name = (
                f"{config.suite}_task{record.spec.task_id:02d}_state{record.spec.init_state:02d}"
                f"_rollout{record.spec.rollout}_{'success' if record.success else 'failure'}.mp4"
            )
            video = str(write_video(out_dir / "videos" / name, episode_frames(record.frames), fps=20))
        record.frames = {}  # the video is written; do not hold every frame until the end
        entry = episode_entry(record, base_of[id(record.spec)], video)
        new_entries.append(entry)
        if log is not None:
            log.write(json.dumps(entry) + "\n")
            log.flush()
        if on_episode is not None:
            on_episode(record)

    start = time.perf_counter()
    try:
        if todo:
            with RolloutRunner(
                env_config, RolloutConfig(workers=config.workers, on_error="record")
            ) as runner:
                runner.run(policy, [s for _, s in todo], progress=on_record)
    finally:
        bar.close()
        if log is not None:
            log.write(json.dumps({"kind": "elapsed", "eval_s": time.perf_counter() - start}) + "\n")
            log.close()
    eval_s = elapsed + time.perf_counter() - start

    by_key = {**done_by_key, **{episode_key(e): e for e in new_entries}}
    entries = [by_key[(b, s.task_id, s.init_state, s.rollout)] for b, s in plan]
    report = build_report(
        suite=config.suite,
        entries=entries,
        tasks=tasks,
        eval_s=eval_s,
        policy=description,
        config={**config.to_dict(), "resolved": config.resolved()},
        seeds=config.seed_list,
        observation=observation,
    )
    if out_dir is not None:
        (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _pct(value: float | None) -> str:
    return "   -  " if value is None else f"{100.0 * value:5.1f}%"


def format_summary(report: Mapping[str, Any]) -> str:
    """A human-readable table of a report: per task and per split, Avg / Best@k / All@k."""
    k = report["metrics"]["all"]["k"]
    n_seeds = report["metrics"]["all"]["n_seeds"]
    lines = [
        f"LIBERO evaluation: {report['suite']}, policy {report['policy'].get('spec')}, k={k}, "
        f"{n_seeds} seed(s), {report['aggregated']['n_episodes']} episodes in "
        f"{report['aggregated']['eval_s']:.1f} s",
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
    ci = report["metrics"]["all"].get("avg_ci95")
    if ci is not None:
        lines.append(f"overall Avg 95% interval across seeds: [{_pct(ci[0])}, {_pct(ci[1])}]")
    failures = report.get("simulator_failures") or []
    if failures:
        lines.append(
            f"simulator failures (counted as failures): {len(failures)}; first: {failures[0]['error']}"
        )
    if report.get("video_paths"):
        lines.append(f"videos: {len(report['video_paths'])} in {Path(report['video_paths'][0]).parent}")
    return "\n".join(lines)
