"""``wmrl eval autoresearch``: sample k solutions per held-out task from a policy, grade them for real.

1. The evaluated tasks (the bundled held-out split by default) are checked to be disjoint from the
   tasks the policy was trained on (read from the run's ``config.json`` when the model is a run's
   ``final/`` folder, else given with ``--train-tasks``, else the bundled training split); any
   overlap is an error, never a warning.
2. The policy is loaded from a local path or an installed package only (:func:`load_policy`: a
   Hugging Face folder, a run's LoRA adapter folder merged into its base, a ``.gguf`` file, or
   ``smollm2``).
3. Each task gets the same prompt as in training (system prompt + task overview), ``k`` samples are
   drawn, each reply's script is run in the sandbox and graded; :mod:`.report` aggregates.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wmrl.autoresearch.evaluation.report import EvalReport, RolloutGrade, aggregate, task_report
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
    model: str | os.PathLike, given: str | Sequence[str] | None = None
) -> tuple[list[str], str]:
    """The task ids the policy was trained on, and where that answer came from.

    ``given`` (a comma-separated list or a sequence) wins; else a run directory's ``config.json``
    next to (or above) the model folder; else the bundled training split.
    """
    from wmrl.autoresearch.tasks.load import load_task
    from wmrl.autoresearch.tasks.suite import TRAIN_TASKS

    if given:
        refs = [s.strip() for s in given.split(",")] if isinstance(given, str) else list(given)
        return [_task_id(r, load_task) for r in refs if r], "--train-tasks"
    path = Path(model)
    for folder in (path, path.parent, path.parent.parent):
        config = folder / "config.json"
        if path.exists() and config.is_file():
            try:
                data = json.loads(config.read_text())
            except json.JSONDecodeError:
                continue
            tasks = data.get("tasks") if isinstance(data, dict) else None
            if isinstance(tasks, dict):
                ids = tasks.get("ids") or list(TRAIN_TASKS)
                return [_task_id(r, load_task) for r in ids], str(config)
    return list(TRAIN_TASKS), "the bundled training split"


def _task_id(ref: str, load_task) -> str:
    try:
        return load_task(ref).id
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
            loaded = load_model(candidate, device=device)
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


def evaluate_policy(
    model: str | os.PathLike,
    *,
    tasks: str | Sequence[str] = "eval",
    samples: int = 4,
    train_tasks: str | Sequence[str] | None = None,
    max_new_tokens: int = 384,
    temperature: float = 0.7,
    backend: str = "bwrap",
    time_limit_s: float | None = 120.0,
    memory_limit_mb: int | None = 2048,
    overview_tokens: int = 400,
    seed: int = 0,
    batch_size: int = 4,
    device: str = "cpu",
    log=None,
    progress: bool = False,
) -> EvalReport:
    """Evaluate ``model`` on held-out tasks (see the module docstring); returns the report.

    ``progress``: a bar over the rollouts graded in the sandbox.
    """
    from wmrl.autoresearch.agent.actions import parse_action
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.llm import SamplingConfig, TransformersBackend
    from wmrl.autoresearch.sandbox import backend_problems, make_sandbox
    from wmrl.autoresearch.training.data import TrainingTask, build_prompt_rows
    from wmrl.autoresearch.training.run import AGENT_LIBRARIES

    if samples < 1:
        raise EvalError(f"samples must be >= 1; got {samples}")
    split, refs = resolve_eval_tasks(tasks)
    from wmrl.autoresearch.tasks.load import load_task

    loaded_tasks = [load_task(r, time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb) for r in refs]
    train_ids, source = training_tasks_of(model, train_tasks)
    check_disjoint([t.id for t in loaded_tasks], train_ids, source)
    sandbox = make_sandbox(backend)
    if getattr(sandbox, "problem", None):
        working = [n for n, p in backend_problems().items() if p is None]
        raise EvalError(
            f"sandbox backend {backend!r} cannot run here: {sandbox.problem}; backends that can: {working}"
        )
    policy = load_policy(model, device=device)
    engine = TransformersBackend(
        policy.model, policy.tokenizer, model_id=policy.model_id, batch_size=batch_size
    )
    grader = ExecutionGrader(sandbox=sandbox)
    # The same prompts as in training (built directly: resolve_training_tasks refuses held-out tasks).
    rows = build_prompt_rows(
        [TrainingTask(ref=r, task=t) for r, t in zip(refs, loaded_tasks, strict=True)],
        overview_tokens=overview_tokens,
        tokens=policy.tokenizer,
        libraries=AGENT_LIBRARIES,
    )
    sampling = SamplingConfig(
        n=samples, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed
    )
    import sys

    from tqdm import tqdm

    if log is not None:
        log(f"[wmrl] sampling {samples} solutions for each of {len(rows)} tasks")
    completions = engine.complete([r["prompt"] for r in rows], sampling)
    reports = []
    bar = tqdm(
        total=len(rows) * samples, desc="grading", unit="rollout", disable=not progress, file=sys.stderr
    )
    for task, replies in zip(loaded_tasks, completions, strict=True):
        grades = []
        for completion in replies:
            bar.update(1)
            action = parse_action(completion.text)
            if action.malformed:
                grades.append(RolloutGrade("malformed", None, grader.ladder.reward("syntax_error")))
                continue
            result = grader.grade(task, action.code or "")
            grades.append(
                RolloutGrade(
                    result.status, result.position if result.status == "valid" else None, result.reward
                )
            )
        report = task_report(task.id, task.category, grades)
        reports.append(report)
        bar.set_postfix_str(task.id)
        if log is not None:
            log(f"[wmrl] {task.id}: valid {report.valid_rate}, avg@{samples} {report.avg_position}")
    bar.close()
    settings: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "seed": seed,
        "sandbox": backend,
        "time_limit_s": time_limit_s,
        "overview_tokens": overview_tokens,
        "train_tasks_source": source,
    }
    return aggregate(
        reports, model=str(model), split=split, samples=samples, train_tasks=train_ids, settings=settings
    )
