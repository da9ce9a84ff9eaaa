"""The ``model`` action: the agent writes only the model of a fixed pipeline (a short reply).

With ``tasks.action=script`` (the paper's setting) the agent writes a whole script, ~300 tokens,
after a ~1,250-token prompt. On a CPU that is what a GRPO step costs: generating 8 such replies
and back-propagating through 8 x ~1,550 tokens takes ~150 s with SmolLM2-135M on 2 cores, so the
~200 rollouts a visible change of the policy needs do not fit in minutes.

With ``tasks.action=model`` the harness owns the plumbing: it reads the data, builds the feature
matrix ``X`` (one-hot encoded columns, or tf-idf of the text) and the target ``y``, runs the
agent's block, then fits ``model`` and writes the submission. The agent's reply is a plan
sentence and a ```python block of a few lines that imports what it uses and sets ``model`` (any
estimator with ``fit`` and ``predict`` / ``predict_proba``: a scikit-learn pipeline, a tuned
forest, ...). The prompt shows the pipeline's code around the slot, so the agent sees how
``model`` is used. What is graded, by the sandbox and by the world model alike, is the whole
assembled script (:func:`assemble`), so both streams judge exactly what runs.

The reply is ~40 tokens after a ~700-token prompt: a step costs a fraction of a script step, and
what GRPO credits is the choice of model and hyper-parameters, which moves the leaderboard
position by up to ~0.9 on the bundled tasks.
"""

from __future__ import annotations

import json

from wmrl.autoresearch.tasks.model import Task
from wmrl.autoresearch.training.corpus import (
    _NEEDS_SCALING,
    Recipe,
    TaskSchema,
    _estimator,
    submission_lines,
)

__all__ = [
    "ACTIONS",
    "SLOT_BEGIN",
    "SLOT_END",
    "assemble",
    "model_block",
    "pipeline_head",
    "pipeline_tail",
    "render_model_reply",
    "slot_recipes",
    "task_brief",
]

#: What the agent writes for a task: a whole script, or the model of a fixed pipeline.
ACTIONS = ("script", "model")

#: The comment lines around the agent's block in the assembled script.
SLOT_BEGIN = "# ---- the agent's block: it sets `model` ----"
SLOT_END = "# ---- end of the agent's block ----"


_KIND_WORDS = {
    "binary_proba": "the probability that it is 1 (binary classification)",
    "binary_label": "a label (binary classification)",
    "multiclass_proba": "one probability per class (multiclass classification)",
    "multiclass_label": "a class label (multiclass classification)",
    "ordinal": "an integer label",
    "regression": "a number (regression)",
}


def task_brief(task: Task, schema: TaskSchema) -> str:
    """The task as the model action needs it (~80 tokens, in place of the script action's overview):
    what to predict, from how many rows and columns of which kinds, and how it is scored."""
    import pandas as pd

    from wmrl.autoresearch.grading.metrics import get_metric

    train = pd.read_csv(task.public_dir / schema.train_file)
    features = [c for c in train.columns if c not in (schema.target, *schema.id_columns)]
    numeric = [c for c in features if pd.api.types.is_numeric_dtype(train[c])]
    text = [c for c in features if c in schema.text]
    categorical = len(features) - len(numeric) - len(text)
    try:
        metric = f"{task.metric} ({get_metric(task.metric).description})"
    except ValueError:  # a task's own grading function (MetricError)
        metric = task.metric
    title = next(
        (line.lstrip("# ").strip() for line in task.description.splitlines() if line.startswith("# ")),
        task.id,
    )
    return (
        f"# TASK: {title}\n"
        f"Predict {schema.target}: {_KIND_WORDS[schema.kind]}.\n"
        f"Training data: {len(train)} rows; {len(features)} feature columns ({len(numeric)} numeric, "
        f"{categorical} categorical, {len(text)} free text).\n"
        f"Scored with {metric}; {'lower' if task.lower_is_better else 'higher'} is better."
    )


def pipeline_head(schema: TaskSchema) -> str:
    """The pipeline before the agent's block: imports, data, ``X`` (train + test rows) and ``y``."""
    lines = ["import os", "import numpy as np", "import pandas as pd"]
    drop = json.dumps([*schema.id_columns, schema.target])
    if schema.text:
        lines.append("from sklearn.feature_extraction.text import TfidfVectorizer")
    lines += [
        "",
        'd = os.environ["DATA_DIR"]',
        f'train = pd.read_csv(os.path.join(d, "{schema.train_file}"))',
        f'test = pd.read_csv(os.path.join(d, "{schema.test_file}"))',
    ]
    if schema.text:
        text = ' + " " + '.join(f'both["{c}"].fillna("")' for c in schema.text)
        lines += [
            "both = pd.concat([train, test])",
            f"X = TfidfVectorizer(max_features=20000).fit_transform({text})  # sparse",
        ]
    else:
        lines.append(
            f"X = pd.get_dummies(pd.concat([train, test]).drop(columns={drop}), dtype=float).fillna(0)"
        )
    lines.append(f'y = train["{schema.target}"]')
    return "\n".join(lines)


def pipeline_tail(schema: TaskSchema) -> str:
    """The pipeline after the agent's block: fit ``model`` on the training rows, write the submission."""
    return "\n".join(["model.fit(X[: len(train)], y)", *submission_lines(schema)])


def assemble(head: str, block: str, tail: str) -> str:
    """The script that runs: the pipeline's head, the agent's block, the pipeline's tail."""
    return f"{head.rstrip()}\n{SLOT_BEGIN}\n{block.strip()}\n{SLOT_END}\n{tail.strip()}"


def slot_recipes(recipes: list[Recipe]) -> list[Recipe]:
    """The recipes the fixed pipeline can state: every feature, every row, the target as it is."""
    return [r for r in recipes if not r.numeric_only and r.train_fraction >= 1 and not r.log_target]


def model_block(schema: TaskSchema, recipe: Recipe) -> str:
    """The agent's block for ``recipe``: its imports and ``model = ...`` (scaled where the family needs it)."""
    est_import, ctor, _ = _estimator(schema, recipe)
    lines = [est_import]
    if recipe.model in _NEEDS_SCALING:
        scaler = "StandardScaler(with_mean=False)" if schema.text else "StandardScaler()"
        lines += [
            "from sklearn.pipeline import make_pipeline",
            "from sklearn.preprocessing import StandardScaler",
        ]
        ctor = f"make_pipeline({scaler}, {ctor})"
    lines.append(f"model = {ctor}")
    return "\n".join(lines)


def render_model_reply(schema: TaskSchema, recipe: Recipe) -> str:
    """The agent's reply in the ``model`` action: a plan sentence, then the block in a ```python fence."""
    _, _, phrase = _estimator(schema, recipe)
    return f"Plan: {phrase}.\n\n```python\n{model_block(schema, recipe)}\n```"
