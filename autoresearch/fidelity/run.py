"""``wmrl wm-fidelity``: the world model and the real sandbox grade the same solutions; compare.

Solutions come from the bundled corpus (:mod:`.corpus`: scripts with known outcomes on three
bundled training tasks) or are sampled from an agent on training tasks. Both graders run
concurrently (two threads); each one's wall time is reported, which is also the measured cost of
grading one rollout each way on this machine. The report (``fidelity.json``) holds per-solution
rows, status accuracy and its confusion table, the score metrics on all solutions, and the
calibration check: an isotonic map fitted on a random half, metrics of raw and calibrated scores on
the other half. ``calibration.png`` plots it.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, cast

from wmrl.autoresearch.fidelity.metrics import (
    score_metrics,
    split_calibration,
    status_accuracy,
    status_confusion,
)
from wmrl.core.errors import UserError
from wmrl.core.log import progress as progress_line

__all__ = ["FidelityError", "FidelityItem", "run_fidelity"]


class FidelityError(UserError, ValueError):
    """The fidelity run cannot be done as asked."""


class FidelityItem(dict):
    """One solution to grade: ``task_ref``, ``task_id``, ``label``, ``code`` (None: the reply had no
    script), ``group`` and, for the corpus, ``expected_status``."""


def _agent_items(
    agent, task_refs: list[str], per_task: int, seed: int, max_new_tokens: int, overview_tokens: int, log
) -> list[FidelityItem]:
    from wmrl.autoresearch.agent.actions import parse_action
    from wmrl.autoresearch.llm import SamplingConfig, TransformersBackend
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.training.builders import AGENT_LIBRARIES
    from wmrl.autoresearch.training.data import TrainingTask, build_prompt_rows

    tasks = [TrainingTask(ref, load_task(ref)) for ref in task_refs]
    rows = build_prompt_rows(
        tasks, overview_tokens=overview_tokens, tokens=agent.tokenizer, libraries=AGENT_LIBRARIES
    )
    engine = TransformersBackend(agent.model, agent.tokenizer, model_id=agent.model_id)
    t0 = time.perf_counter()
    replies = engine.complete(
        [r["prompt"] for r in rows],
        SamplingConfig(n=per_task, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed),
    )
    log(
        f"[wmrl] sampled {per_task} solutions for each of {len(rows)} tasks in {time.perf_counter() - t0:.0f} s"
    )
    items = []
    for entry, row, completions in zip(tasks, rows, replies, strict=True):
        for k, completion in enumerate(completions):
            action = parse_action(completion.text)
            items.append(
                FidelityItem(
                    task_ref=entry.ref,
                    task_id=entry.task.id,
                    label=f"{entry.task.id}#{k}",
                    code=None if action.malformed else action.code,
                    group=row["prompt_id"],
                )
            )
    return items


def _grade_real(
    items: list[FidelityItem],
    backend: str,
    time_limit_s: float | None,
    memory_limit_mb: int | None,
    progress: bool = False,
):
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.sandbox import SandboxPool, make_sandbox
    from wmrl.autoresearch.tasks import load_task

    sandbox = make_sandbox(backend)
    if getattr(sandbox, "problem", None):
        from wmrl.autoresearch.sandbox import backend_problems

        working = [n for n, p in backend_problems().items() if p is None]
        raise FidelityError(
            f"sandbox backend {backend!r} cannot run here: {sandbox.problem}; backends that can: {working}"
        )
    grader = ExecutionGrader(
        sandbox=SandboxPool(sandbox, slots=2), time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb
    )
    tasks = {}

    def one(item: FidelityItem) -> tuple[str, float | None]:
        if item["code"] is None:
            return "malformed", grader.ladder.reward("syntax_error")
        if item["task_ref"] not in tasks:
            tasks[item["task_ref"]] = load_task(item["task_ref"])
        result = grader.grade(tasks[item["task_ref"]], item["code"])
        return result.status, result.reward

    with ThreadPoolExecutor(max_workers=2) as pool, _bar(len(items), "sandbox", progress, 0) as bar:
        out = []
        for result in pool.map(one, items):
            out.append(result)
            bar.update(1)
        return out


def _bar(total: int, desc: str, progress: bool, position: int):
    import sys

    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="script",
        disable=not progress,
        position=position,
        file=sys.stderr,
        leave=False,
    )


def _grade_world_model(
    items: list[FidelityItem], wm, progress: bool = False, chunk: int = 4
) -> list[tuple[str | None, float | None, str | None]]:
    from wmrl.autoresearch.tasks import Solution

    outcomes = []
    with _bar(len(items), "world model", progress, 1) as bar:
        # in chunks, so the bar moves; the world model batches within each chunk
        for start in range(0, len(items), chunk):
            part = items[start : start + chunk]
            outcomes.extend(wm.predict([Solution(i["task_ref"], i["code"] or "") for i in part]))
            bar.update(len(part))
    return [(o.grade.status, o.grade.value, o.grade.info.get("source")) for o in outcomes]


def run_fidelity(
    *,
    model: str = "smollm2",
    solutions: str = "corpus",
    agent: str | None = None,
    tasks: str | None = None,
    per_task: int = 4,
    scoring: str = "status_probs",
    samples: int = 4,
    backend: str = "bwrap",
    seed: int = 0,
    out_dir: str | os.PathLike = "runs/wm-fidelity",
    device: str = "cpu",
    corpus_dir: str | os.PathLike | None = None,
    max_new_tokens: int = 384,
    overview_tokens: int = 400,
    worked_example: bool | None = None,
    log=progress_line,
    progress: bool = False,
) -> dict[str, Any]:
    """Grade the same solutions with the world model and the sandbox; write and return the report.

    ``progress``: a bar per stream (sandbox executions, world-model predictions).
    """
    # The ignore on load_corpus: mypy takes .corpus for the corpus/ data folder (a namespace package
    # beside corpus.py), as the type check's shadow root has no wmrl/__init__.py; Python imports corpus.py.
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.overview import OverviewConfig, from_task
    from wmrl.autoresearch.evaluation.run import load_policy
    from wmrl.autoresearch.fidelity.corpus import load_corpus
    from wmrl.autoresearch.fidelity.report import plot_calibration
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.training.builders import AGENT_LIBRARIES
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    if solutions not in ("corpus", "agent"):
        raise FidelityError(f"solutions must be 'corpus' or 'agent'; got {solutions!r}")
    if per_task < 1:
        raise FidelityError(f"per_task must be >= 1; got {per_task}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from wmrl.autoresearch.training.warm import resolve_spec

    loaded = load_model(resolve_spec(model), device=device)
    if solutions == "corpus":
        corpus = load_corpus(corpus_dir)
        items = [
            FidelityItem(
                task_ref=e.task,
                task_id=e.task,
                label=e.file,
                code=e.code,
                group=e.task,
                expected_status=e.expected_status,
            )
            for e in corpus.entries
        ]
        time_limit, memory = corpus.time_limit_s, corpus.memory_limit_mb
        source = f"corpus ({corpus.root})"
    else:
        from wmrl.autoresearch.tasks.suite import TRAIN_TASKS

        refs = [t.strip() for t in tasks.split(",")] if tasks else list(TRAIN_TASKS[:3])
        policy = loaded if agent in (None, model) else load_policy(agent, device=device)
        items = _agent_items(policy, refs, per_task, seed, max_new_tokens, overview_tokens, log)
        time_limit, memory = 60.0, 2048
        source = f"agent {agent or model}"
    budget = OverviewConfig(max_tokens=overview_tokens)
    overviews: dict[str, str] = {}

    def overview(ref: str) -> str:
        if ref not in overviews:
            task = load_task(ref)
            env = SandboxEnvironment.from_task(
                task.with_limits(time_limit, memory), libraries=AGENT_LIBRARIES
            )
            overviews[ref] = from_task(task, environment=env, config=budget, tokens=loaded.tokenizer)
        return overviews[ref]

    wm = WorldModel(
        TransformersBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id),
        WorldModelConfig(
            scoring=cast(Literal["status_probs", "samples"], scoring),  # WorldModelConfig checks the name
            samples=samples,
            seed=seed,
            overview_tokens=overview_tokens,
            worked_example=(scoring == "samples") if worked_example is None else worked_example,
        ),
        overview_fn=overview,
        tokens=loaded.tokenizer,
    )
    log(
        f"[wmrl] grading {len(items)} solutions with the world model ({loaded.model_id}, {scoring}) and the {backend} sandbox"
    )
    seconds: dict[str, float] = {}

    def timed(name, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            seconds[name] = time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=2) as pool:
        real_future = pool.submit(timed, "sandbox", _grade_real, items, backend, time_limit, memory, progress)
        wm_future = pool.submit(timed, "world_model", _grade_world_model, items, wm, progress)
        real, predicted = real_future.result(), wm_future.result()

    rows = []
    for item, (r_status, r_reward), (w_status, w_score, w_source) in zip(items, real, predicted, strict=True):
        row = {k: v for k, v in item.items() if k != "code"}
        row.update(
            real_status=r_status,
            real_reward=r_reward,
            wm_status=w_status,
            wm_score=w_score,
            wm_source=w_source,
        )
        rows.append(row)
    real_rewards = [r["real_reward"] for r in rows]
    scores = [r["wm_score"] for r in rows]
    groups = [r["group"] for r in rows]
    modelled = [r for r in rows if r["wm_source"] != "gate"]
    report: dict[str, Any] = {
        "source": source,
        "solutions": len(rows),
        "world_model": {
            "model": loaded.model_id,
            "scoring": scoring,
            "samples": samples if scoring == "samples" else None,
        },
        "sandbox": backend,
        "time_limit_s": time_limit,
        "status_accuracy": status_accuracy([r["real_status"] for r in rows], [r["wm_status"] for r in rows]),
        # the deterministic gate settles empty and non-compiling scripts exactly; this is the model's own share
        "status_accuracy_model_only": status_accuracy(
            [r["real_status"] for r in modelled], [r["wm_status"] for r in modelled]
        ),
        "status_confusion": status_confusion(
            [r["real_status"] for r in rows], [r["wm_status"] for r in rows]
        ),
        "score": score_metrics(real_rewards, scores, groups),
        "calibration": split_calibration(real_rewards, scores, groups, seed=seed),
        "calibration_note": (
            "isotonic map (score -> real reward) fitted on a random half of the solutions (seed "
            f"{seed}); raw and calibrated metrics are measured on the other half only"
        ),
        "seconds": dict(seconds),
        "seconds_per_solution": {k: v / len(rows) for k, v in seconds.items()} if rows else {},
        "world_model_gated": len(rows) - len(modelled),
        "world_model_stats": vars(wm.stats).copy(),
        "rows": rows,
    }
    if solutions == "corpus":
        report["corpus_expected_status_matches"] = sum(
            r["real_status"] == r.get("expected_status") for r in rows
        )
    (out / "fidelity.json").write_text(json.dumps(report, indent=2))
    plot_calibration(report, out / "calibration.png")
    return report
