"""``wmrl eval autoresearch``: the paper's protocol on held-out tasks, graded for real.

1. The evaluated tasks (the bundled held-out split by default) are checked to be disjoint from the
   tasks the policy was trained on: its whole lineage (``final/wmrl_policy.json`` records the
   training tasks of the run and of the warm start it came from), else the run's ``config.json``,
   else ``--train-tasks``, else the bundled training split. Any overlap is an error, never a warning
   (``in_sample=true`` evaluates training tasks on purpose, and the report says so).
2. The policy is loaded from a local path or an installed package only (:func:`load_policy`: a
   Hugging Face folder, a run's LoRA adapter folder merged into its base, a ``.gguf`` file,
   ``smollm2`` or ``smollm2-warm``), on the CPU or a GPU (``device``).
3. Each task gets the same prompt as in training; per seed, ``k`` trajectories of K turns are drawn:
   each reply's script is executed in the sandbox by the same reward source as training's anchors,
   and the result becomes the next observation through the same agent episode (same feedback
   text). :mod:`.report` aggregates: valid rate, avg@k, medals, per-category means, the mean over
   categories, each ± SEM over seeds.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

from wmrl.autoresearch.evaluation.report import EvalReport, RolloutGrade, aggregate, task_report
from wmrl.autoresearch.training.policy_action import trained_action_of
from wmrl.core.errors import UserError

__all__ = [
    "EvalError",
    "check_disjoint",
    "evaluate_policy",
    "load_policy",
    "resolve_eval_tasks",
    "training_tasks_of",
]


class EvalError(UserError, ValueError):
    """The evaluation cannot be run as asked (overlapping tasks, bad arguments)."""


def resolve_eval_tasks(spec: str | Sequence[str]) -> tuple[str, list[str]]:
    """``(name, task references)`` for ``"eval"`` (the bundled held-out split) or a comma-separated list."""
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS, TRAIN_TASKS

    if isinstance(spec, str):
        if spec == "eval":
            return "eval", list(EVAL_TASKS)
        if spec == "train":
            return "train", list(TRAIN_TASKS)
        refs = [s.strip() for s in spec.split(",") if s.strip()]
    else:
        refs = [str(s) for s in spec]
    if not refs:
        raise EvalError("no tasks to evaluate: --tasks takes 'eval' or a comma-separated list of tasks")
    return "custom", refs


def training_tasks_of(
    model: str | os.PathLike,
    given: str | Sequence[str] | None = None,
    *,
    mledojo_root: str | os.PathLike | None = None,
    data_dir: str | os.PathLike | None = None,
) -> tuple[list[str], str]:
    """The task ids the policy was trained on, and where that answer came from.

    ``given`` (a comma-separated list or a sequence) wins. Else the policy folder's
    ``wmrl_policy.json`` (its ``train_tasks``: every stage of its lineage, a warm start included),
    joined with the run's ``config.json`` next to (or above) the model folder (``tasks.ids`` of a
    GRPO run, ``corpus.ids`` of a warm start; empty ids = the bundled training split). Else the
    bundled training split.

    A reference is compared by the id of the task it loads. ``mledojo_root`` / ``data_dir`` (the
    evaluation's) help load ``given`` references; a run's ``config.json`` references load with that
    run's own ``tasks.mledojo_root`` / ``tasks.data_dir`` (else the evaluation's), since a task that
    needs its data folder to load would otherwise be compared by its path, not its id.
    """
    from wmrl.autoresearch.tasks.load import load_task
    from wmrl.autoresearch.tasks.suite import TRAIN_TASKS

    roots = {"mledojo_root": mledojo_root, "data_dir": data_dir}
    if given:
        refs = [s.strip() for s in given.split(",")] if isinstance(given, str) else list(given)
        return [_task_id(r, load_task, roots) for r in refs if r], "--train-tasks"
    path = Path(model)
    found: list[str] = []
    sources: list[str] = []
    policy_file = path / "wmrl_policy.json"
    if policy_file.is_file():
        try:
            recorded = json.loads(policy_file.read_text()).get("train_tasks")
        except (json.JSONDecodeError, AttributeError):
            recorded = None
        if isinstance(recorded, list):
            found += [str(t) for t in recorded]
            sources.append(str(policy_file))
    for folder in (path, path.parent, path.parent.parent):
        config = folder / "config.json"
        if path.exists() and config.is_file():
            try:
                data = json.loads(config.read_text())
            except json.JSONDecodeError:
                continue
            if not isinstance(data, dict):
                continue
            section = data.get("tasks") if isinstance(data.get("tasks"), dict) else data.get("corpus")
            if isinstance(section, dict):
                ids = section.get("ids") or list(TRAIN_TASKS)
                own = {k: section.get(k) or v for k, v in roots.items()}
                found += [_task_id(r, load_task, own) for r in ids]
                sources.append(str(config))
                break
    if found:
        return list(dict.fromkeys(found)), " + ".join(sources)
    return list(TRAIN_TASKS), "the bundled training split"


def _task_id(ref: str, load_task, roots: dict[str, Any] | None = None) -> str:
    given = {k: v for k, v in (roots or {}).items() if v is not None}
    try:
        return load_task(ref, **given).id
    except Exception:  # a training task that no longer loads is still compared by its reference
        return str(ref)


def check_disjoint(eval_ids: Sequence[str], train_ids: Sequence[str], source: str) -> None:
    """Raise :class:`EvalError` if any evaluated task was trained on."""
    overlap = sorted(set(eval_ids) & set(train_ids))
    if overlap:
        raise EvalError(
            f"the evaluated tasks overlap the policy's training tasks ({source}): {overlap}. Held-out "
            "evaluation must use unseen tasks: evaluate on --tasks eval, or name the true training tasks with --train-tasks"
        )


def load_policy(spec: str | os.PathLike, device: str = "cpu"):
    """Load a policy from a local path or an installed package (never a download).

    A folder with ``adapter_config.json`` (a run's ``final/`` with LoRA) is merged into its base
    model: the base path recorded by PEFT, or, when that folder is gone, the base model *spec* the
    run recorded in ``wmrl_policy.json``. Anything else goes to
    :func:`wmrl.autoresearch.llm.models.load_model`.

    Raises:
        ModelNotFoundError: nothing loadable; the message says how to provide a model.
    """
    from wmrl.autoresearch.llm.models import LoadedModel, ModelNotFoundError, load_model
    from wmrl.autoresearch.training.warm import resolve_spec

    spec = resolve_spec(spec)
    path = Path(spec).expanduser()
    adapter = path / "adapter_config.json"
    if not (path.is_dir() and adapter.is_file()):
        return load_model(spec, device=device)
    base = json.loads(adapter.read_text()).get("base_model_name_or_path")
    recorded = path / "wmrl_policy.json"
    candidates = [base] if base else []
    if recorded.is_file():
        candidates.append(json.loads(recorded.read_text()).get("base"))
    loaded = None
    errors = []
    for candidate in [c for c in candidates if c]:
        try:
            loaded = load_model(resolve_spec(candidate), device=device)
            break
        except ModelNotFoundError as err:
            errors.append(str(err))
    if loaded is None:
        raise ModelNotFoundError(
            f"{path} is a LoRA adapter whose base model cannot be found ({'; '.join(errors) or 'no base recorded'})"
        )
    from peft import PeftModel

    model = PeftModel.from_pretrained(loaded.model, str(path)).merge_and_unload()
    model.eval()
    tokenizer = loaded.tokenizer
    if (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        from wmrl.autoresearch.llm.models import _prepare_tokenizer

        tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))
    return LoadedModel(model=model, tokenizer=tokenizer, model_id=str(path.resolve()), path=path)


_MEDAL_RANK = {m: i for i, m in enumerate(("gold", "silver", "bronze", "above_median", "none"))}


def _trajectory_grade(turns: list[tuple[str, float | None, float | None, str | None]], reward: float | None):
    """A trajectory's grade from its turns ``(status, position, reward, medal)``: its best turn (the
    training aggregation's reward; valid if any turn was, the best position and medal over turns)."""

    if reward is None:  # an unknown turn makes the trajectory unknown (the training rule)
        return RolloutGrade("harness_error", None, None, None, len(turns))
    valid = [t for t in turns if t[0] == "valid"]
    if valid:
        # a valid turn has its grade's position (GradeResult of a valid submission)
        best = max(valid, key=lambda t: cast(float, t[1]))
        medals = [t[3] for t in valid if t[3] is not None]
        medal = min(medals, key=_MEDAL_RANK.__getitem__) if len(medals) == len(valid) else None
        return RolloutGrade("valid", best[1], reward, medal, len(turns))
    known = [t for t in turns if t[2] is not None]
    status = max(known, key=lambda t: cast(float, t[2]))[0] if known else turns[-1][0]  # known: a reward
    return RolloutGrade(status, None, reward, None, len(turns))


def _feedback_text(feedback: Any) -> dict[str, Any] | str | None:
    """A turn's feedback as JSON: the execution feedback's fields (:class:`ExecutionFeedback`)."""
    if feedback is None or isinstance(feedback, str):
        return feedback
    # a feedback object is an instance (is_dataclass also accepts a class)
    return dataclasses.asdict(cast(Any, feedback)) if dataclasses.is_dataclass(feedback) else str(feedback)


def evaluate_policy(  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    model: str | os.PathLike,
    *,
    tasks: str | Sequence[str] = "eval",
    samples: int = 4,
    seeds: Sequence[int] = (0,),
    turns: int = 1,
    train_tasks: str | Sequence[str] | None = None,
    in_sample: bool = False,
    max_new_tokens: int = 384,
    temperature: float = 0.7,
    backend: str = "bwrap",
    time_limit_s: float | None = 120.0,
    memory_limit_mb: int | None = 2048,
    workers: int = 2,
    gpus: Sequence[int] = (),
    gpus_per_slot: int = 1,
    overview_tokens: int = 400,
    action: str | None = None,
    feedback_max_tokens: int = 300,
    mledojo_root: str | os.PathLike | None = None,
    data_dir: str | os.PathLike | None = None,
    batch_size: int = 4,
    device: str = "cpu",
    log=None,
    progress: bool = False,
    record: Callable[[dict[str, Any]], None] | None = None,
) -> EvalReport:
    """Evaluate ``model`` (see the module docstring); returns the report.

    Every seed draws ``samples`` trajectories per task. A trajectory is ``turns`` attempts: each reply
    is parsed and executed in the sandbox by the same reward source that grades training's anchors,
    and its feedback becomes the next user message through the same agent episode as in training
    (:func:`~wmrl.autoresearch.training.episodes.episode_factory`); the trajectory's grade is its
    best turn. ``in_sample`` allows training tasks (the report says so); otherwise any overlap with
    the policy's training tasks is an error. ``mledojo_root``: an MLE-Dojo checkout whose
    leaderboards DSBench tasks are ranked on; ``data_dir``: MLE-bench's data folder.
    ``progress``: a bar over the graded turns.
    ``action``: what the policy writes (``script`` or ``model``; ``None``: as it was trained,
    :func:`~wmrl.autoresearch.training.policy_action.trained_action_of`). ``record``: called with every graded turn as it is
    graded (``seed``, ``task_id``, ``sample``, ``turn``, the ``reply``, its ``status``, ``reward``,
    ``position``, ``medal``, and the ``feedback`` the next turn shows), so what was generated and
    what it scored is kept even if the evaluation stops.
    """
    import sys

    from tqdm import tqdm

    from wmrl.autoresearch.agent.episode import EpisodeConfig
    from wmrl.autoresearch.grading import ExecutionRewardSource
    from wmrl.autoresearch.llm import SamplingConfig, TransformersBackend
    from wmrl.autoresearch.tasks.load import load_task
    from wmrl.autoresearch.training.builders import AGENT_LIBRARIES, build_grader
    from wmrl.autoresearch.training.config import SandboxSection
    from wmrl.autoresearch.training.data import TrainingTask, build_prompt_rows
    from wmrl.autoresearch.training.episodes import episode_factory
    from wmrl.autoresearch.training.streams import solution_items
    from wmrl.core.rollouts import Exact

    if samples < 1:
        raise EvalError(f"samples must be >= 1; got {samples}")
    if turns < 1:
        raise EvalError(f"turns must be >= 1; got {turns}")
    if action is None:  # as the policy was trained: a script policy asked for a model block writes scripts
        action, action_source = trained_action_of(model)
        if log is not None and action != "script":
            log(f"[wmrl] action {action} ({action_source})")
    if action == "model" and turns != 1:
        raise EvalError("the model action is single-turn: evaluate it with turns=1")
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise EvalError(f"seeds must be distinct and at least one; got {seeds}")
    split, refs = resolve_eval_tasks(tasks)
    loaded_tasks = [
        load_task(
            r,
            time_limit_s=time_limit_s,
            memory_limit_mb=memory_limit_mb,
            mledojo_root=mledojo_root,
            data_dir=data_dir,
        )
        for r in refs
    ]
    ids = [t.id for t in loaded_tasks]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:  # one task twice would count as two tasks (and its seeds as more draws)
        raise EvalError(f"tasks {repeated} are named more than once in --tasks (by id or by folder)")
    train_ids, source = training_tasks_of(model, train_tasks, mledojo_root=mledojo_root, data_dir=data_dir)
    if not in_sample:
        check_disjoint(ids, train_ids, source)
    section = SandboxSection(
        # a backend name; make_sandbox (build_grader) refuses an unknown one
        backend=cast(Literal["bwrap", "docker", "subprocess", "auto"], backend),
        time_limit_s=time_limit_s,
        memory_limit_mb=memory_limit_mb,
        workers=workers,
        gpus=tuple(gpus),
        gpus_per_slot=gpus_per_slot,
    )
    grader = build_grader(section)  # the sandbox of training's anchors (GPU slots included)
    policy = load_policy(model, device=device)
    engine = TransformersBackend(
        policy.model, policy.tokenizer, model_id=policy.model_id, batch_size=batch_size
    )
    by_ref = dict(zip(refs, loaded_tasks, strict=True))
    # The anchor stream of training: the same grader, the same feedback (Grade.feedback).
    anchor = ExecutionRewardSource(
        grader,
        max_workers=workers,
        task_loader=lambda ref: by_ref[ref],
    )
    rows = build_prompt_rows(
        [TrainingTask(ref=r, task=t) for r, t in zip(refs, loaded_tasks, strict=True)],
        turns=turns,
        overview_tokens=overview_tokens,
        tokens=policy.tokenizer,
        libraries=AGENT_LIBRARIES,
        gpus=section.gpu_count,
        action=action,
    )
    make_episode = episode_factory(
        EpisodeConfig(turns=turns, feedback_max_tokens=feedback_max_tokens), policy.tokenizer
    )
    item_of = solution_items()
    if log is not None:
        log(f"[wmrl] {len(seeds)} seed(s) x {samples} trajectories x {len(rows)} tasks, {turns} turn(s) each")
    bar = tqdm(
        total=len(seeds) * len(rows) * samples * turns,
        desc="eval",
        unit="turn",
        disable=not progress,
        file=sys.stderr,
    )
    reports = []
    for seed in seeds:
        # trajectories: (task index, episode, per-turn (status, position, reward, medal))
        trajectories: list[tuple[int, Any, list[tuple[str, float | None, float | None, str | None]]]] = [
            (i, make_episode(row["prompt"], row), []) for i, row in enumerate(rows) for _ in range(samples)
        ]
        for turn in range(turns):
            live_at = [k for k, t in enumerate(trajectories) if not t[1].episode.done]
            live = [trajectories[k] for k in live_at]
            if not live:
                break
            sampling = SamplingConfig(
                n=1,
                temperature=temperature,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                seed=seed * 1000 + turn,
            )
            replies = engine.complete([list(t[1].episode.messages) for t in live], sampling)
            items = []
            for (i, episode, _), reply in zip(live, replies, strict=True):
                episode.add_reply(reply[0].text)
                items.append(item_of(reply[0].text, rows[i]))
            run = [k for k, item in enumerate(items) if not isinstance(item, Exact)]
            graded = dict(zip(run, anchor.grade([items[k] for k in run]), strict=True))
            for k, ((i, episode, turns_of), item) in enumerate(zip(live, items, strict=True)):
                status: str | None
                info: Mapping[str, Any]
                if isinstance(item, Exact):
                    reward, feedback, status, info = item.value, item.feedback, item.status, {}
                else:
                    grade = graded[k]
                    reward, feedback, status, info = grade.value, grade.feedback, grade.status, grade.info
                position = info.get("position") if status == "valid" else None
                medal = info.get("medal") if status == "valid" else None
                turns_of.append((status or "unknown", position, reward, medal))
                episode.add_outcome(reward, feedback, status)
                if record is not None:
                    record(
                        {
                            "seed": seed,
                            "task_id": loaded_tasks[i].id,
                            "sample": live_at[k] % samples,  # trajectories are task-major
                            "turn": turn,
                            "reply": replies[k][0].text,
                            "status": status or "unknown",
                            "reward": reward,
                            "position": position,
                            "medal": medal,
                            "feedback": _feedback_text(feedback),
                        }
                    )
                bar.update(1)
        by_task: dict[int, list] = {}
        for i, episode, turns_of in trajectories:
            by_task.setdefault(i, []).append(_trajectory_grade(turns_of, episode.reward()))
        for i, grades in sorted(by_task.items()):
            task = loaded_tasks[i]
            report = task_report(
                task.id, task.category, grades, seed=seed, has_medals=bool(task.leaderboards)
            )
            reports.append(report)
            if log is not None:
                log(
                    f"[wmrl] seed {seed} {task.id}: valid {report.valid_rate}, avg@{samples} {report.avg_position}"
                )
    bar.close()
    settings: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "sandbox": backend,
        "time_limit_s": time_limit_s,
        "overview_tokens": overview_tokens,
        "action": action,
        "feedback_max_tokens": feedback_max_tokens,
        "device": device,
        "train_tasks_source": source,
        "mledojo_root": str(mledojo_root) if mledojo_root else None,
        "data_dir": str(data_dir) if data_dir else None,
        "memory_limit_mb": memory_limit_mb,
        "workers": workers,
        "gpus": list(gpus),
        "gpus_per_slot": gpus_per_slot,
    }
    return aggregate(
        reports,
        model=str(model),
        split=split,
        samples=samples,
        train_tasks=train_ids,
        settings=settings,
        turns=turns,
        in_sample=in_sample,
    )
