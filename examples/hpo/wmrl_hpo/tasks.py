"""The tasks, the search space, and the two ways to grade a configuration.

A task is a dataset that ships with scikit-learn; a rollout is one configuration of a gradient-boosted
tree model. Real execution trains the configuration with 3-fold cross-validation on the whole dataset
(folds shuffled by the rollout's own seed, so it carries real execution noise); the world model is the
classic cheap proxy of hyperparameter search: the same configuration trained once on a 20% subsample,
scored on a held-out slice of it. The proxy is fast and informative but biased (a small sample favours
small models and cannot see what many trees buy on the full data), which is what the correction fixes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

import numpy as np
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine, make_classification
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_score, train_test_split
from threadpoolctl import threadpool_limits

from wmrl.core import RolloutNeeds

#: The search space: every hyperparameter and its options.
SPACE: dict[str, tuple] = {
    "learning_rate": (0.01, 0.03, 0.1, 0.3, 1.0),
    "max_iter": (5, 15, 40, 100),
    "max_leaf_nodes": (4, 15, 31, 63),
    "min_samples_leaf": (1, 5, 20, 80),
    "l2_regularization": (0.0, 0.1, 1.0, 10.0),
}
TASKS = ("breast_cancer", "wine", "diabetes", "synthetic")


@dataclass(frozen=True)
class Rollout:
    """One sampled configuration for one task: ``choice[k]`` indexes ``SPACE``'s k-th options."""

    task: str
    choice: tuple[int, ...]
    seed: int

    def params(self) -> dict:
        return {name: options[i] for (name, options), i in zip(SPACE.items(), self.choice, strict=True)}

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params().items())


@cache
def dataset(task: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(X, y, is_regression)`` of a task (bundled with scikit-learn: nothing is downloaded)."""
    if task == "breast_cancer":
        return (*load_breast_cancer(return_X_y=True), False)
    if task == "wine":
        return (*load_wine(return_X_y=True), False)
    if task == "diabetes":
        return (*load_diabetes(return_X_y=True), True)
    if task == "synthetic":
        X, y = make_classification(1200, 20, n_informative=6, n_redundant=4, flip_y=0.05, random_state=7)
        return X, y, False
    raise ValueError(f"unknown task {task!r}; known: {TASKS}")


def _model(params: dict, regression: bool):
    cls = HistGradientBoostingRegressor if regression else HistGradientBoostingClassifier
    return cls(**params, early_stopping=False, random_state=0)


def cross_validated(rollout: Rollout) -> float:
    """Real execution: mean 3-fold CV score (accuracy, or R² clipped at 0), folds shuffled by the rollout's seed."""
    X, y, regression = dataset(rollout.task)
    splitter = (KFold if regression else StratifiedKFold)(3, shuffle=True, random_state=rollout.seed)
    with threadpool_limits(1):  # several executions run at once; one thread each
        score = cross_val_score(_model(rollout.params(), regression), X, y, cv=splitter).mean()
    return float(max(score, 0.0))


@cache
def proxy(task: str, choice: tuple[int, ...]) -> float:
    """The world model: one fit on a fixed 20% subsample, scored on a held-out quarter of it (cached)."""
    X, y, regression = dataset(task)
    X_small, _, y_small, _ = train_test_split(
        X, y, train_size=0.2, random_state=1, stratify=None if regression else y
    )
    X_fit, X_val, y_fit, y_val = train_test_split(X_small, y_small, test_size=0.25, random_state=2)
    params = Rollout(task, choice, 0).params()
    with threadpool_limits(1):
        score = _model(params, regression).fit(X_fit, y_fit).score(X_val, y_val)
    return float(max(score, 0.0))


class CrossValidation:
    """The anchor source: real execution, ``workers`` configurations trained at once."""

    name, role, needs = "cross_validation", "anchor", RolloutNeeds()

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers

    def score(self, items: Sequence[Rollout]) -> list[float]:
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(cross_validated, items))


class SubsampleProxy:
    """The world-model source: the subsample fit of each configuration."""

    name, role, needs = "subsample_proxy", "world_model", RolloutNeeds()

    def score(self, items: Sequence[Rollout]) -> list[float]:
        return [proxy(r.task, r.choice) for r in items]


def every_choice() -> list[tuple[int, ...]]:
    """All configurations of the space (for the best achievable score in the report)."""
    return list(itertools.product(*(range(len(o)) for o in SPACE.values())))
