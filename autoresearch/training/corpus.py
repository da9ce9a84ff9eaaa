"""The warm-start corpus: working solutions for the TRAINING tasks, in the agent's exact reply format.

The bundled suite already trains a pool of ~60 baseline pipelines per task to build its leaderboards
(:func:`wmrl.autoresearch.tasks.pool.make_pool`). This module turns those pipelines into what the
agent itself would write: a short plan naming the method, then ONE complete script in a fenced
block that reads ``DATA_DIR``, fits the pipeline and writes ``SUBMISSION_PATH`` (:func:`render_reply`).
Everything a script needs is read from the task through functions (:meth:`TaskSchema.from_task`:
the target is the column of the training file missing from the test file, the prediction kind
comes from the metric registry), never from frozen copies of task files, so a replaced or
perturbed task gets matching scripts.

:func:`build_corpus` then *executes every script* in the sandbox and keeps what it measured: the
agent's examples are the scripts that really produced a valid submission (with their leaderboard
position), and, optionally, world-model examples pair a script (working or deliberately broken,
:func:`broken_variants`) with its real outcome in the world model's JSON format, so the warm start
also teaches the frozen judge what runs and what scores well.

Held-out tasks never enter the corpus: :func:`build_corpus` refuses the suite's evaluation tasks
and any task the caller names as held out (``exclude``).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wmrl.autoresearch.tasks.model import Task, TaskError

__all__ = [
    "CORPUS_VERSION",
    "Corpus",
    "CorpusExample",
    "Recipe",
    "TaskSchema",
    "broken_variants",
    "build_corpus",
    "corpus_key",
    "recipes_for",
    "render_plan",
    "render_reply",
    "render_script",
    "world_model_answer",
]

#: Version of the script templates and example format (part of every cache key built on the corpus).
CORPUS_VERSION = "corpus-v1"

_KINDS = ("binary_proba", "binary_label", "multiclass_proba", "multiclass_label", "ordinal", "regression")
# Families whose estimators need dense input (text features are sparse tf-idf matrices).
_DENSE_ONLY = ("gnb", "hgb")
_NEEDS_SCALING = ("logreg", "knn", "ridge", "lasso", "linear")


@dataclass(frozen=True)
class TaskSchema:
    """What a script must know about a task, read from the task itself.

    Attributes:
        task_id: the task.
        kind: one of ``binary_proba``, ``binary_label``, ``multiclass_proba``, ``multiclass_label``,
            ``ordinal``, ``regression`` (from the metric's prediction type and the category).
        target: the training column to learn (in the training file, not in the test file).
        id_columns: the submission's key columns, copied from the test file.
        submission_columns: the submission's prediction columns (per-class columns for ``multiclass_proba``).
        text: free-text columns (vectorised with tf-idf instead of one-hot encoded).
        train_file / test_file: file names inside ``DATA_DIR``.
        clip_negative: predictions must be >= 0 (log-scale metrics such as RMSLE).
    """

    task_id: str
    kind: str
    target: str
    id_columns: tuple[str, ...]
    submission_columns: tuple[str, ...]
    text: tuple[str, ...] = ()
    train_file: str = "train.csv"
    test_file: str = "test.csv"
    clip_negative: bool = False

    @property
    def regression(self) -> bool:
        return self.kind == "regression"

    @classmethod
    def from_task(cls, task: Task) -> TaskSchema:
        """Derive the schema from the task's public files and its metric.

        Raises:
            TaskError: the task's files do not give one training target (several train files, a
                target that is not a single column of the training file, an unsupported metric).
        """
        import pandas as pd

        from wmrl.autoresearch.grading.metrics import get_metric

        train_file = task.train_files[0] if task.train_files else "train.csv"
        test_file = task.test_files[0] if task.test_files else "test.csv"
        try:
            train = pd.read_csv(task.public_dir / train_file, nrows=2000)
            test = pd.read_csv(task.public_dir / test_file, nrows=5)
        except (OSError, ValueError) as err:
            raise TaskError(
                f"{task.id}: cannot read {train_file}/{test_file} for the corpus: {err}"
            ) from None
        targets = [c for c in train.columns if c not in test.columns and c not in task.id_columns]
        if len(targets) != 1:
            raise TaskError(
                f"{task.id}: the corpus needs exactly one training column absent from {test_file}; found {targets}"
            )
        target = targets[0]
        metric = get_metric(task.metric)
        columns = tuple(task.target_columns)
        classes = train[target].dropna().nunique()
        if task.category == "regression":
            kind = "regression"
        elif len(columns) > 1:
            kind = "multiclass_proba"
        elif metric.prediction == "integer":
            kind = "ordinal"
        elif metric.prediction == "label":
            kind = "binary_label" if classes <= 2 else "multiclass_label"
        elif task.category == "binary":
            kind = "binary_proba"
        else:
            raise TaskError(
                f"{task.id}: no script template for metric {task.metric} on a {task.category} task"
            )
        features = [c for c in test.columns if c not in task.id_columns]
        # Free text: words (two spaces a value on average) AND many distinct values. A category whose
        # few labels have spaces (a plane's type, "Fixed wing multi engine") is one-hot encoded: as
        # text it would be the only input of the model action's pipeline.
        min_distinct = max(20, 0.05 * len(train))
        text = tuple(
            c
            for c in features
            if train[c].dtype == object
            and train[c].dropna().astype(str).str.count(" ").mean() >= 2
            and train[c].nunique() >= min_distinct
        )
        return cls(
            task_id=task.id,
            kind=kind,
            target=target,
            id_columns=tuple(task.id_columns),
            submission_columns=columns,
            text=text,
            train_file=train_file,
            test_file=test_file,
            clip_negative=task.metric in ("rmsle", "msle"),
        )


@dataclass(frozen=True)
class Recipe:
    """One pipeline of the suite's baseline pool, as a script can state it.

    Attributes:
        model: the pool's family name (``rf``, ``hgb``, ``logreg``, ``dummy_mean``, ...).
        params: its hyper-parameters (the pool's grid point).
        numeric_only: use only the numeric columns (else one-hot categoricals too).
        train_fraction: train on this share of the rows.
        log_target: regress ``log1p(y)`` and predict ``expm1``.
        seed: the random state of the estimator and of the row sample.
    """

    model: str
    params: tuple[tuple[str, Any], ...] = ()
    numeric_only: bool = False
    train_fraction: float = 1.0
    log_target: bool = False
    seed: int = 0

    @property
    def name(self) -> str:
        parts = [self.model + "".join(f"-{k}{v}" for k, v in self.params)]
        if self.numeric_only:
            parts.append("numeric")
        if self.train_fraction < 1:
            parts.append(f"frac{self.train_fraction:g}")
        if self.log_target:
            parts.append("logy")
        return "+".join(parts)


def _problem(schema: TaskSchema):
    from wmrl.autoresearch.tasks.pool import Problem

    # The pool only needs the kind and whether numeric/text columns exist to draw its variations.
    return Problem(
        kind=schema.kind,
        target=schema.target,
        numeric=("x",),
        categorical=("c",),
        text=schema.text,
        positive_skew=schema.clip_negative,
    )


def recipes_for(schema: TaskSchema, size: int = 60) -> list[Recipe]:
    """The task's baseline pool (:func:`~wmrl.autoresearch.tasks.pool.make_pool`) as recipes.

    Pool entries a short script cannot state faithfully are left out: deliberately corrupted labels,
    random feature subsets, and (on text tasks) families that need dense input.
    """
    from wmrl.autoresearch.tasks.pool import make_pool

    out: list[Recipe] = []
    for b in make_pool(_problem(schema), schema.task_id, size=size):
        if b.label_noise > 0 or b.features in ("half", "quarter") or b.text not in ("word",):
            continue
        if schema.text and b.model in _DENSE_ONLY:
            continue
        recipe = Recipe(
            model=b.model,
            params=b.params,
            numeric_only=b.features == "numeric" and not schema.text,
            train_fraction=b.train_fraction,
            log_target=b.log_target and schema.regression,
            seed=b.seed % 100,
        )
        if recipe not in out:
            out.append(recipe)
    return out


# ------------------------------------------------------------------------------------ rendering


def _estimator(schema: TaskSchema, r: Recipe) -> tuple[str, str, str]:
    """(import line, constructor expression, plan phrase) of a recipe's estimator."""
    p = dict(r.params)
    depth = p.get("depth") or None
    reg = schema.regression
    s = r.seed
    table: dict[str, tuple[str, str, str]] = {
        "dummy_mean": ("sklearn.dummy", 'DummyRegressor(strategy="mean")', "predict the training mean"),
        "dummy_median": ("sklearn.dummy", 'DummyRegressor(strategy="median")', "predict the training median"),
        "dummy_prior": ("sklearn.dummy", 'DummyClassifier(strategy="prior")', "predict the class prior"),
        "dummy_stratified": (
            "sklearn.dummy",
            f'DummyClassifier(strategy="stratified", random_state={s})',
            "draw random labels with the class frequencies",
        ),
        "logreg": (
            "sklearn.linear_model",
            f"LogisticRegression(C={p.get('C', 1.0)}, max_iter=1000)",
            f"fit a logistic regression (C={p.get('C', 1.0)})",
        ),
        "gnb": ("sklearn.naive_bayes", "GaussianNB()", "fit Gaussian naive Bayes"),
        "ridge": ("sklearn.linear_model", f"Ridge(alpha={p.get('alpha', 1.0)})", "fit ridge regression"),
        "lasso": (
            "sklearn.linear_model",
            f"Lasso(alpha={p.get('alpha', 1.0)}, max_iter=5000)",
            "fit a lasso regression",
        ),
        "linear": ("sklearn.linear_model", "LinearRegression()", "fit a linear regression"),
        "knn": (
            "sklearn.neighbors",
            f"KNeighbors{'Regressor' if reg else 'Classifier'}(n_neighbors={p.get('k', 5)})",
            f"fit {p.get('k', 5)}-nearest neighbours",
        ),
        "tree": (
            "sklearn.tree",
            f"DecisionTree{'Regressor' if reg else 'Classifier'}(max_depth={depth}, random_state={s})",
            f"fit a decision tree (depth {depth or 'unlimited'})",
        ),
        "rf": (
            "sklearn.ensemble",
            f"RandomForest{'Regressor' if reg else 'Classifier'}(n_estimators={p.get('n', 100)}, max_depth={depth}, random_state={s})",
            f"fit a random forest ({p.get('n', 100)} trees)",
        ),
        "extra": (
            "sklearn.ensemble",
            f"ExtraTrees{'Regressor' if reg else 'Classifier'}(n_estimators={p.get('n', 100)}, max_depth={depth}, random_state={s})",
            f"fit extra trees ({p.get('n', 100)} trees)",
        ),
        "hgb": (
            "sklearn.ensemble",
            f"HistGradientBoosting{'Regressor' if reg else 'Classifier'}(learning_rate={p.get('lr', 0.1)}, "
            f"max_iter={p.get('iters', 100)}, max_leaf_nodes={p.get('leaves', 31)}, random_state={s})",
            f"fit histogram gradient boosting ({p.get('iters', 100)} rounds)",
        ),
    }
    if r.model not in table:
        raise ValueError(f"no script template for pool family {r.model!r}")
    module, ctor, phrase = table[r.model]
    return f"from {module} import {ctor.split('(')[0]}", ctor, phrase


def _features(schema: TaskSchema, r: Recipe) -> tuple[list[str], str]:
    """(extra import lines, the lines that build ``X`` over train + test rows)."""
    drop = json.dumps([*schema.id_columns, schema.target])
    if schema.text:
        if len(schema.text) == 1:
            text = f'both["{schema.text[0]}"].fillna("")'
        else:
            text = ' + " " + '.join(f'both["{c}"].fillna("")' for c in schema.text)
        return (
            ["from sklearn.feature_extraction.text import TfidfVectorizer"],
            f"both = pd.concat([train, test])\nX = TfidfVectorizer(max_features=20000).fit_transform({text})",
        )
    if r.numeric_only:
        return [], f'X = pd.concat([train, test]).drop(columns={drop}).select_dtypes("number").fillna(0)'
    return [], f"X = pd.get_dummies(pd.concat([train, test]).drop(columns={drop}), dtype=float).fillna(0)"


def render_script(schema: TaskSchema, recipe: Recipe) -> str:
    """The complete script of ``recipe`` on the task (reads ``DATA_DIR``, writes ``SUBMISSION_PATH``)."""
    est_import, ctor, _ = _estimator(schema, recipe)
    feature_imports, features = _features(schema, recipe)
    scaled = recipe.model in _NEEDS_SCALING
    uses_np = recipe.log_target or schema.clip_negative
    lines = ["import os"]
    if uses_np:
        lines.append("import numpy as np")
    lines.append("import pandas as pd")
    lines += feature_imports
    lines.append(est_import)
    if scaled:
        lines.append("from sklearn.pipeline import make_pipeline")
        lines.append("from sklearn.preprocessing import StandardScaler")
    lines += [
        "",
        'd = os.environ["DATA_DIR"]',
        f'train = pd.read_csv(os.path.join(d, "{schema.train_file}"))',
        f'test = pd.read_csv(os.path.join(d, "{schema.test_file}"))',
    ]
    if recipe.train_fraction < 1:
        lines.append(f"train = train.sample(frac={recipe.train_fraction:g}, random_state={recipe.seed})")
    lines.append(features)
    if scaled:
        scaler = "StandardScaler(with_mean=False)" if schema.text else "StandardScaler()"
        ctor = f"make_pipeline({scaler}, {ctor})"
    lines.append(f"model = {ctor}")
    y = f'train["{schema.target}"]'
    lines.append(f"model.fit(X[: len(train)], {'np.log1p(' + y + ')' if recipe.log_target else y})")
    lines += submission_lines(schema, log_target=recipe.log_target)
    return "\n".join(lines)


def submission_lines(schema: TaskSchema, log_target: bool = False) -> list[str]:
    """The lines after ``model`` is fitted: predict the test rows of ``X`` (``expm1`` back from a log
    target), build the submission with the id columns, write it to ``SUBMISSION_PATH``."""
    lines = []
    ids = json.dumps(list(schema.id_columns))
    if schema.kind == "multiclass_proba":
        lines.append("sub = pd.DataFrame(model.predict_proba(X[len(train) :]), columns=model.classes_)")
        for i, column in enumerate(schema.id_columns):
            lines.append(f'sub.insert({i}, "{column}", test["{column}"].to_numpy())')
    else:
        if schema.kind == "binary_proba":
            pred = "model.predict_proba(X[len(train) :])[:, 1]"
        elif log_target:
            pred = "np.expm1(model.predict(X[len(train) :]))"
        else:
            pred = "model.predict(X[len(train) :])"
        if schema.clip_negative:
            pred = f"np.clip({pred}, 0, None)"
        lines.append(f"sub = test[{ids}].copy()")
        lines.append(f'sub["{schema.submission_columns[0]}"] = {pred}')
    lines.append('sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)')
    return lines


def render_plan(schema: TaskSchema, recipe: Recipe) -> str:
    """The plan sentence before the script: the method first (what GRPO credits), then the output."""
    _, _, phrase = _estimator(schema, recipe)
    inputs = (
        "tf-idf features of the text"
        if schema.text
        else "the numeric columns"
        if recipe.numeric_only
        else "one-hot encoded features"
    )
    rows = (
        "all training rows"
        if recipe.train_fraction >= 1
        else f"a {recipe.train_fraction:g} sample of the rows"
    )
    target = f"log1p({schema.target})" if recipe.log_target else schema.target
    what = {
        "binary_proba": f"the probability that {schema.target} is 1",
        "multiclass_proba": "one probability per class",
    }.get(schema.kind, schema.submission_columns[0])
    return (
        f"Plan: {phrase} on {inputs}, using {rows} to learn {target}. "
        f"Then predict {what} for every test row and write the submission with the id column."
    )


def render_reply(schema: TaskSchema, recipe: Recipe) -> str:
    """The agent's reply: the plan, then the script in one fenced ``python`` block."""
    return f"{render_plan(schema, recipe)}\n\n```python\n{render_script(schema, recipe)}\n```"


def broken_variants(schema: TaskSchema, recipe: Recipe, script: str | None = None) -> list[tuple[str, str]]:
    """``(name, script)`` for deliberate mistakes an agent makes (for world-model examples; their
    outcome is measured by running them, never assumed): a misspelt target column, no submission
    written, and a submission without the id column. ``script``: the recipe's script as the action
    writes it (default: :func:`render_script`)."""
    script = render_script(schema, recipe) if script is None else script
    out = [
        ("target_typo", script.replace(f'train["{schema.target}"]', f'train["{schema.target}_value"]', 1)),
        (
            "no_write",
            script.replace('sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)', "print(sub.head())"),
        ),
        (
            "no_id",
            script.replace(
                'sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)',
                "sub.drop(columns="
                + json.dumps(list(schema.id_columns))
                + ').to_csv(os.environ["SUBMISSION_PATH"], index=False)',
            ),
        ),
    ]
    return [(name, s) for name, s in out if s != script]


# ------------------------------------------------------------------------------------ the corpus


@dataclass(frozen=True)
class CorpusExample:
    """One supervised example, with the real outcome that justified it.

    Attributes:
        role: ``agent`` (the reply to the task's prompt) or ``world_model`` (the judge's JSON for a script).
        task_id / task_ref: the training task (its id, and how it was loaded).
        recipe: the pipeline's name (``+variant`` for a deliberately broken script).
        completion: the text to learn (the agent's reply, or the world model's JSON answer).
        code: the script that was executed.
        status: the real execution's status (``valid``, ``runtime_error``, ...).
        position: the real leaderboard position of a valid submission, else ``None``.
        reward: the ladder reward of the real execution (``None``: harness failure, never used).
    """

    role: str
    task_id: str
    task_ref: str
    recipe: str
    completion: str
    code: str
    status: str
    position: float | None
    reward: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Corpus:
    """The examples and what building them measured."""

    examples: list[CorpusExample]
    executions: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    tasks: list[str] = field(default_factory=list)

    def of_role(self, role: str) -> list[CorpusExample]:
        return [e for e in self.examples if e.role == role]

    def summary(self) -> dict[str, Any]:
        agent = self.of_role("agent")
        positions = [e.position for e in agent if e.position is not None]
        return {
            "version": CORPUS_VERSION,
            "tasks": self.tasks,
            "executions": self.executions,
            "statuses": self.statuses,
            "agent_examples": len(agent),
            "world_model_examples": len(self.of_role("world_model")),
            "agent_mean_position": sum(positions) / len(positions) if positions else None,
            "seconds": self.seconds,
        }

    @staticmethod
    def read_examples(path: str | Path) -> list[CorpusExample]:
        """The examples of a JSONL file :meth:`write` (or an anchor-pair recorder) wrote."""
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return [CorpusExample(**json.loads(line)) for line in lines if line.strip()]

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in self.examples), encoding="utf-8")
        return path


def _spread(recipes: Sequence[Recipe], k: int, rng: random.Random) -> list[Recipe]:
    """``k`` recipes covering as many families as possible (round-robin over shuffled families)."""
    by_family: dict[str, list[Recipe]] = {}
    for r in recipes:
        by_family.setdefault(r.model, []).append(r)
    families = sorted(by_family)
    rng.shuffle(families)
    for family in families:
        rng.shuffle(by_family[family])
    out: list[Recipe] = []
    while len(out) < min(k, len(recipes)):
        for family in families:
            if by_family[family] and len(out) < k:
                out.append(by_family[family].pop())
    return out


def world_model_answer(status: str, position: float | None, error: str | None = None) -> str:
    """The world model's JSON reply for a real outcome (its prompt's key order; position on its 0.1 grid)."""
    if status == "valid":
        return json.dumps(
            {
                "status": "valid",
                "error_type": None,
                "error_line": None,
                "position": round(float(position or 0.0), 1),
                "output": "",
            }
        )
    status = "timeout" if status == "killed" else status
    return json.dumps(
        {"status": status, "error_type": error, "error_line": None, "position": None, "output": ""}
    )


def error_type(stderr: str) -> str | None:
    """The exception class named by the last traceback line of ``stderr`` (``KeyError``), or None."""
    for line in reversed(stderr.strip().splitlines()):
        head = line.split(":", 1)[0].strip()
        if head.endswith(("Error", "Exception")) and " " not in head:
            return head.rsplit(".", 1)[-1]
    return None


def _rendered(schema: TaskSchema, recipe: Recipe, action: str) -> tuple[str, str]:
    """(the script that runs, the agent's reply) of ``recipe`` in ``action`` (``script`` or ``model``)."""
    if action == "model":
        from wmrl.autoresearch.training import model_slot

        block = model_slot.model_block(schema, recipe)
        script = model_slot.assemble(
            model_slot.pipeline_head(schema), block, model_slot.pipeline_tail(schema)
        )
        return script, model_slot.render_model_reply(schema, recipe)
    return render_script(schema, recipe), render_reply(schema, recipe)


def build_corpus(  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    tasks: Sequence[tuple[str, Task]],
    *,
    agent_per_task: int = 4,
    world_model_per_task: int = 0,
    pool_size: int = 60,
    seed: int = 0,
    grade: Callable[[Task, str], Any] | None = None,
    workers: int = 2,
    exclude: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
    action: str = "script",
) -> Corpus:
    """Build the corpus for ``tasks`` (``(reference, task)`` pairs; training tasks only).

    Args:
        tasks: the training tasks.
        agent_per_task: candidate agent scripts per task (recipes spread over the pool's families);
            only those whose real execution is ``valid`` become examples.
        world_model_per_task: world-model examples per task (about half working scripts, half broken
            variants), each labelled with its real outcome. 0: none.
        pool_size: size of the baseline pool the recipes are drawn from.
        seed: which recipes are drawn.
        grade: ``(task, code) -> GradeResult`` (default: an :class:`~wmrl.autoresearch.grading.ExecutionGrader`
            on the default sandbox). Every script is executed: nothing enters the corpus on assumption.
        workers: executions run concurrently.
        exclude: task ids that must never enter the corpus (the held-out tasks of the evaluation).
        log: progress lines.
        action: ``script`` (replies are whole scripts) or ``model`` (replies are the model block of
            the fixed pipeline, :mod:`.model_slot`; what is executed is the assembled script).

    Raises:
        TaskError: a task is held out (a bundled evaluation task, or in ``exclude``).
    """
    import time

    from wmrl.autoresearch.tasks.suite import EVAL_TASKS

    started = time.perf_counter()
    held_out = set(EVAL_TASKS) | set(exclude)
    leaked = sorted({t.id for _, t in tasks} & held_out)
    if leaked:
        raise TaskError(
            f"the warm-start corpus takes training tasks only; {leaked} are held out for evaluation"
        )
    if grade is None:
        from wmrl.autoresearch.grading import ExecutionGrader

        grade = ExecutionGrader().grade
    from wmrl.autoresearch.training import model_slot

    if action not in model_slot.ACTIONS:
        raise ValueError(f"action must be one of {model_slot.ACTIONS}; got {action!r}")
    jobs: list[tuple[str, str, Task, str, str, str | None]] = []  # role, ref, task, recipe, code, reply
    rng = random.Random(seed)
    for ref, task in tasks:
        schema = TaskSchema.from_task(task)
        recipes = recipes_for(schema, size=pool_size)
        if action == "model":
            recipes = model_slot.slot_recipes(recipes)
        chosen = _spread(recipes, agent_per_task, rng)
        for r in chosen:
            jobs.append(("agent", ref, task, r.name, *_rendered(schema, r, action)))
        if world_model_per_task:
            working = _spread(recipes, (world_model_per_task + 1) // 2, random.Random(f"{seed}:{task.id}:wm"))
            broken = [
                (f"{r.name}+{name}", code)
                for r in working
                for name, code in broken_variants(schema, r, _rendered(schema, r, action)[0])
            ]
            random.Random(f"{seed}:{task.id}:broken").shuffle(broken)
            for r in working:
                jobs.append(("world_model", ref, task, r.name, _rendered(schema, r, action)[0], None))
            for name, code in broken[: world_model_per_task - len(working)]:
                jobs.append(("world_model", ref, task, name, code, None))
    results: dict[tuple[str, str], Any] = {}
    unique = {(j[2].id, j[4]): j for j in jobs}  # one execution per distinct (task, script)
    if log is not None:
        log(f"[wmrl] corpus: executing {len(unique)} scripts on {len(tasks)} training tasks")

    def run(key):
        task, code = unique[key][2], unique[key][4]
        return key, grade(task, code)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for done, (key, result) in enumerate(pool.map(run, list(unique)), 1):
            results[key] = result
            if log is not None and (done % 10 == 0 or done == len(unique)):
                log(f"[wmrl] corpus: {done}/{len(unique)} executed")
    examples: list[CorpusExample] = []
    statuses: dict[str, int] = {}
    for result in results.values():
        statuses[result.status] = statuses.get(result.status, 0) + 1
    for role, ref, task, recipe, code, reply in jobs:
        result = results[(task.id, code)]
        if result.reward is None:  # a harness failure proves nothing about the script
            continue
        position = result.position if result.status == "valid" else None
        if role == "agent":
            if result.status != "valid":
                continue
            completion = reply or ""
        else:
            completion = world_model_answer(result.status, position, error_type(result.stderr_tail or ""))
        examples.append(
            CorpusExample(
                role, task.id, ref, recipe, completion, code, result.status, position, result.reward
            )
        )
    return Corpus(
        examples=examples,
        executions=len(unique),
        statuses=statuses,
        seconds=time.perf_counter() - started,
        tasks=[t.id for _, t in tasks],
    )


def corpus_key(tasks: Sequence[Task], settings: dict[str, Any]) -> str:
    """A short hash of what a corpus depends on: the template version, the agent's and the world model's
    prompt versions, the tasks' definitions and files (names, sizes), and the settings. Used to key cached warm starts."""
    from wmrl.autoresearch.agent.prompts import MODEL_PROMPT_VERSION
    from wmrl.autoresearch.agent.prompts import PROMPT_VERSION as AGENT_PROMPT_VERSION
    from wmrl.autoresearch.worldmodel.prompts import PROMPT_VERSION as WM_PROMPT_VERSION

    # The examples are the agent's and the world model's exact prompts: a new prompt text is a new corpus.
    agent_version = AGENT_PROMPT_VERSION
    if (settings.get("corpus") or {}).get("action") == "model":
        agent_version = MODEL_PROMPT_VERSION
    h = hashlib.sha256(f"{CORPUS_VERSION}|{agent_version}|{WM_PROMPT_VERSION}".encode())
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for task in sorted(tasks, key=lambda t: t.id):
        h.update(f"{task.id}|{task.metric}|{task.target_columns}|{task.id_columns}".encode())
        for f in sorted(Path(task.public_dir).iterdir()):
            if f.is_file():
                h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:12]
