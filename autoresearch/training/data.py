"""The training tasks and the prompt dataset GRPO samples from.

One row per (task, copy): the agent's system prompt and first observation (the task overview),
a ``prompt_id`` (the anchor scheduler's group key, with the step), ``task_id`` (the scheduler's
stratum) and ``task_ref`` (what :func:`~wmrl.autoresearch.tasks.load_task` loads: a bundled id or
a folder). With the ``model`` action (:mod:`.model_slot`) a row also carries the fixed pipeline
around the agent's block (``slot_head``, ``slot_tail``), which the item function assembles the
reply into. Held-out evaluation tasks of the bundled suite are refused here, so a policy is never
trained on what ``wmrl eval autoresearch`` reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wmrl.autoresearch.agent.environment import SandboxEnvironment
from wmrl.autoresearch.agent.overview import OverviewConfig
from wmrl.autoresearch.agent.overview import from_task as overview_from_task
from wmrl.autoresearch.agent.prompts import (
    first_user_message,
    model_system_prompt,
    model_user_message,
    system_prompt,
)
from wmrl.autoresearch.tasks.load import load_task
from wmrl.autoresearch.tasks.model import Task, TaskError
from wmrl.autoresearch.tasks.suite import EVAL_TASKS, TRAIN_TASKS

__all__ = ["TrainingTask", "build_prompt_rows", "recorded_train_tasks", "resolve_training_tasks"]


@dataclass(frozen=True)
class TrainingTask:
    """A task to train on: ``ref`` (loadable reference) and the loaded ``task`` with the run's limits."""

    ref: str
    task: Task


def recorded_train_tasks(policy: str | Any) -> list[str]:
    """The training tasks a policy folder records in its ``wmrl_policy.json`` (its whole lineage);
    ``[]`` for a model no WMRL stage wrote (a base model)."""
    import json
    from pathlib import Path

    path = Path(str(policy)) / "wmrl_policy.json"
    if not path.is_file():
        return []
    try:
        tasks = json.loads(path.read_text()).get("train_tasks")
    except (ValueError, AttributeError):
        return []
    return [str(t) for t in tasks] if isinstance(tasks, list) else []


def resolve_training_tasks(
    ids: Sequence[str] = (),
    limit: int | None = None,
    time_limit_s: float | None = None,
    memory_limit_mb: int | None = None,
    mledojo_root: str | None = None,
    data_dir: str | None = None,
) -> list[TrainingTask]:
    """Load the training tasks: ``ids`` (bundled ids or folders) or the suite's training split.

    ``mledojo_root`` (an MLE-Dojo checkout: leaderboards for DSBench tasks) and ``data_dir``
    (MLE-bench's data folder) are passed to :func:`~wmrl.autoresearch.tasks.load_task`.

    Raises:
        TaskError: a task cannot be loaded, or it is one of the suite's held-out evaluation tasks.
    """
    refs = list(ids) if ids else list(TRAIN_TASKS)
    out = []
    for ref in refs:
        task = load_task(
            ref,
            time_limit_s=time_limit_s,
            memory_limit_mb=memory_limit_mb,
            mledojo_root=mledojo_root,
            data_dir=data_dir,
        )
        if task.id in EVAL_TASKS:
            raise TaskError(
                f"task {ref!r} is a held-out evaluation task of the bundled suite ({task.id}); training on it "
                "would contaminate `wmrl eval autoresearch`. Train on the training split (`wmrl tasks list --split train`)"
            )
        out.append(TrainingTask(ref=str(ref), task=task))
    if not out:
        raise TaskError("no training tasks: give tasks.ids or build the bundled suite")
    return out[:limit] if limit else out


def build_prompt_rows(
    tasks: Sequence[TrainingTask],
    *,
    turns: int = 1,
    overview_tokens: int = 400,
    prompts_per_task: int = 1,
    tokens: Any = None,
    libraries: tuple[str, ...] | None = None,
    gpus: int = 0,
    action: str = "script",
) -> list[dict[str, Any]]:
    """The dataset rows (``prompt``, ``prompt_id``, ``task_id``, ``task_ref``), one per task copy.

    Args:
        tasks: the training tasks.
        turns: K, stated in the system prompt.
        overview_tokens: the overview's budget (in ``tokens`` units: the agent's tokenizer when given;
            the model action shows a fixed brief of the task instead).
        prompts_per_task: copies of each task (distinct prompt ids, so each is its own GRPO group).
        tokens: token counter or Hugging Face tokenizer for exact budgets.
        libraries: libraries listed to the agent (default: detected in this interpreter, which is
            the one the sandbox runs solutions with).
        gpus: GPUs each execution of the agent's script sees (``sandbox.gpus_per_slot``; 0: none).
        action: ``script`` (the agent writes the whole script) or ``model`` (the model of a fixed
            pipeline, single-turn; see :mod:`.model_slot`).
    """
    from wmrl.autoresearch.training.model_slot import ACTIONS

    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}; got {action!r}")
    if action == "model" and turns != 1:
        raise ValueError(
            "the model action is single-turn (turns=1): its pipeline is fixed, there is nothing to revise"
        )
    rows = []
    # The system prompt lists the libraries: the overview's budget goes to the data.
    budget = OverviewConfig(max_tokens=overview_tokens, libraries=False)
    for entry in tasks:
        env = SandboxEnvironment.from_task(entry.task, libraries=libraries, gpus=gpus)
        slot: dict[str, str] = {}
        if action == "model":  # a brief of the task, not the overview: the pipeline reads the data
            from wmrl.autoresearch.training.corpus import TaskSchema
            from wmrl.autoresearch.training.model_slot import pipeline_head, pipeline_tail, task_brief

            schema = TaskSchema.from_task(entry.task)
            slot = {"slot_head": pipeline_head(schema), "slot_tail": pipeline_tail(schema)}
            brief = task_brief(entry.task, schema)
            prompt = [
                {"role": "system", "content": model_system_prompt(env)},
                {"role": "user", "content": model_user_message(brief, slot["slot_head"], slot["slot_tail"])},
            ]
        else:
            overview = overview_from_task(entry.task, environment=env, config=budget, tokens=tokens)
            prompt = [
                {"role": "system", "content": system_prompt(env, turns=turns)},
                {"role": "user", "content": first_user_message(overview)},
            ]
        for k in range(prompts_per_task):
            prompt_id = entry.task.id if prompts_per_task == 1 else f"{entry.task.id}#{k}"
            rows.append(
                {
                    "prompt": prompt,
                    "prompt_id": prompt_id,
                    "task_id": entry.task.id,
                    "task_ref": entry.ref,
                    **slot,
                }
            )
    return rows
