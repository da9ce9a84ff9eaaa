"""A pool of baseline pipelines, run to make the bundled tasks' leaderboards.

Kaggle leaderboards are the scores of many teams of uneven skill. Without Kaggle, the suite makes
its reference population by actually training a varied pool of scikit-learn pipelines on each
task's public training data and scoring their test predictions: constant predictors, linear
models, naive Bayes, k-nearest neighbours, single trees, random forests, extra trees and
histogram gradient boosting, each with several hyper-parameters, on all features or a random
subset, on the full training set or a fraction of it, some with deliberately corrupted labels.
The resulting spread (from "predict the mean" to a tuned boosted model) plays the role of the
human field.

Everything is seeded; with one BLAS/OpenMP thread a rebuild is bit-for-bit reproducible on the
same platform.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Baseline", "Problem", "fit_predict", "make_pool"]

CLASSIFIERS = ("dummy_prior", "dummy_stratified", "logreg", "gnb", "knn", "tree", "rf", "extra", "hgb")
REGRESSORS = ("dummy_mean", "dummy_median", "ridge", "lasso", "linear", "knn", "tree", "rf", "extra", "hgb")


@dataclass(frozen=True)
class Problem:
    """What a pipeline must predict and from which columns.

    Attributes:
        kind: ``"binary_proba"`` (probability of class 1), ``"binary_label"``, ``"multiclass_proba"``
            (one probability column per class), ``"multiclass_label"``, ``"ordinal"`` (integer
            labels) or ``"regression"``.
        target: the training column to learn.
        numeric / categorical / text: feature columns by type.
        classes: class labels in output order (multiclass_proba: the submission's columns).
        positive_skew: regression target is non-negative and skewed (log-target variants make sense).
    """

    kind: str
    target: str
    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    text: tuple[str, ...] = ()
    classes: tuple[Any, ...] = ()
    positive_skew: bool = False

    @property
    def is_regression(self) -> bool:
        return self.kind == "regression"


@dataclass(frozen=True)
class Baseline:
    """One pipeline configuration (hashable, printable; the name says what it is)."""

    model: str
    params: tuple[tuple[str, Any], ...] = ()
    features: str = "all"  # "all" | "numeric" | "half" | "quarter"
    text: str = "word"  # "word" | "char" | "length" | "drop" (text tasks only)
    train_fraction: float = 1.0
    label_noise: float = 0.0
    log_target: bool = False
    seed: int = 0
    tags: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        parts = [self.model + "".join(f"-{k}{v}" for k, v in self.params)]
        if self.features != "all":
            parts.append(f"feat-{self.features}")
        if self.text != "word":
            parts.append(f"text-{self.text}")
        if self.train_fraction < 1:
            parts.append(f"frac{self.train_fraction:g}")
        if self.label_noise > 0:
            parts.append(f"noise{self.label_noise:g}")
        if self.log_target:
            parts.append("logy")
        if self.seed:
            parts.append(f"s{self.seed}")
        return "+".join(parts)


_GRID: dict[str, list[dict[str, Any]]] = {
    "logreg": [{"C": 0.01}, {"C": 0.1}, {"C": 1.0}, {"C": 10.0}],
    "knn": [{"k": 1}, {"k": 5}, {"k": 15}, {"k": 50}],
    "tree": [{"depth": 2}, {"depth": 4}, {"depth": 8}, {"depth": 0}],
    "rf": [{"n": 30, "depth": 4}, {"n": 100, "depth": 0}, {"n": 60, "depth": 10}],
    "extra": [{"n": 50, "depth": 0}, {"n": 100, "depth": 8}],
    "hgb": [
        {"lr": 0.1, "iters": 100, "leaves": 31},
        {"lr": 0.05, "iters": 300, "leaves": 15},
        {"lr": 0.3, "iters": 50, "leaves": 63},
        {"lr": 0.03, "iters": 60, "leaves": 7},
    ],
    "ridge": [{"alpha": 0.1}, {"alpha": 10.0}, {"alpha": 1000.0}],
    "lasso": [{"alpha": 0.01}, {"alpha": 1.0}],
}


def make_pool(problem: Problem, task_id: str, size: int = 60, exclude: Sequence[str] = ()) -> list[Baseline]:
    """``size`` distinct baselines for ``problem`` (deterministic in ``task_id``).

    The first part is a fixed core: every model family with each grid point on all features and
    all rows. The rest are random variations (feature subsets, training fractions, label noise,
    log targets, text representations) drawn with a seed derived from ``task_id``. ``exclude``
    names model families left out (the heavy tier leaves out k-NN, whose prediction on ~100,000
    test rows takes minutes a pipeline).
    """
    unknown = sorted(set(exclude) - set(CLASSIFIERS) - set(REGRESSORS))
    if unknown:
        raise ValueError(f"unknown model families to exclude: {unknown}")
    families = tuple(f for f in (REGRESSORS if problem.is_regression else CLASSIFIERS) if f not in exclude)
    core: list[Baseline] = []
    for family in families:
        grid = _GRID.get(family, [{}])
        for params in grid:
            core.append(Baseline(family, tuple(params.items())))
            if problem.is_regression and problem.positive_skew and family in ("ridge", "hgb", "rf", "knn"):
                core.append(Baseline(family, tuple(params.items()), log_target=True))
    rng = random.Random(zlib.crc32(task_id.encode()))
    pool = list(dict.fromkeys(core))
    fractions = (1.0, 1.0, 0.5, 0.2, 0.05)
    features = ("all", "all", "numeric", "half", "quarter")
    noises = (0.0, 0.0, 0.0, 0.1, 0.3)
    texts = ("word", "word", "char", "length") + (("drop",) if problem.numeric or problem.categorical else ())
    attempts = 0
    while len(pool) < size and attempts < 10_000:
        attempts += 1
        family = rng.choice([f for f in families if not f.startswith("dummy")])
        params = rng.choice(_GRID.get(family, [{}]))
        candidate = Baseline(
            family,
            tuple(params.items()),
            features=rng.choice(features) if (problem.numeric or problem.categorical) else "all",
            text=rng.choice(texts) if problem.text else "word",
            train_fraction=rng.choice(fractions),
            label_noise=rng.choice(noises),
            # Skewed targets scored on a log scale: most competitors would model log(1 + y).
            log_target=problem.is_regression and problem.positive_skew and rng.random() < 0.7,
            seed=rng.randrange(1, 1000),
        )
        if candidate.features == "numeric" and not problem.numeric:
            continue
        if candidate not in pool:
            pool.append(candidate)
    if len(pool) < size:
        raise RuntimeError(f"could not draw {size} distinct baselines for {task_id} (got {len(pool)})")
    return pool


def _columns(problem: Problem, baseline: Baseline) -> tuple[list[str], list[str], list[str]]:
    numeric, categorical, text = list(problem.numeric), list(problem.categorical), list(problem.text)
    if baseline.features == "numeric":
        categorical = []
    elif baseline.features in ("half", "quarter"):
        rng = random.Random(baseline.seed)
        keep = 0.5 if baseline.features == "half" else 0.25
        pool = numeric + categorical
        chosen = set(rng.sample(pool, max(1, round(keep * len(pool))))) if pool else set()
        numeric = [c for c in numeric if c in chosen]
        categorical = [c for c in categorical if c in chosen]
    if baseline.text == "drop" and (numeric or categorical):
        text = []
    return numeric, categorical, text


def _preprocessor(problem: Problem, baseline: Baseline, sparse_ok: bool):
    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

    numeric, categorical, text = _columns(problem, baseline)
    # (name, transformer, columns): a TfidfVectorizer takes one column name (a 1-d input), the others a list
    parts: list[tuple[str, Any, str | list[str]]] = []
    if numeric:
        parts.append(("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), numeric))
    if categorical:
        encoder = OneHotEncoder(
            handle_unknown="infrequent_if_exist", min_frequency=5, sparse_output=sparse_ok
        )
        parts.append(("cat", make_pipeline(SimpleImputer(strategy="most_frequent"), encoder), categorical))
    for column in text:  # "drop" only drops text when other columns remain; else it is "word"
        if baseline.text == "length":
            lengths = FunctionTransformer(_text_lengths, validate=False)
            parts.append((f"len_{column}", make_pipeline(lengths, StandardScaler()), [column]))
        else:
            if baseline.text == "char":
                vec = TfidfVectorizer(
                    analyzer="char_wb", ngram_range=(2, 4), max_features=20000, min_df=2, sublinear_tf=True
                )
            else:
                vec = TfidfVectorizer(ngram_range=(1, 2), max_features=20000, min_df=2, sublinear_tf=True)
            parts.append((f"txt_{column}", vec, column))
    if not parts:
        raise ValueError("a baseline ended up with no feature columns")
    return ColumnTransformer(parts, sparse_threshold=0.3 if sparse_ok else 0.0)


def _text_lengths(frame):
    values = frame.iloc[:, 0].fillna("").astype(str)
    return np.column_stack([values.str.len().to_numpy(float), values.str.split().str.len().to_numpy(float)])


def _estimator(problem: Problem, baseline: Baseline, n_train: int):
    from sklearn import dummy, ensemble, linear_model, naive_bayes, neighbors, tree

    p = dict(baseline.params)
    if "k" in p:  # k-NN cannot ask for more neighbours than there are training rows
        p["k"] = max(1, min(p["k"], n_train - 1))
    seed = baseline.seed
    depth = p.get("depth") or None
    if problem.is_regression:
        return {
            "dummy_mean": lambda: dummy.DummyRegressor(strategy="mean"),
            "dummy_median": lambda: dummy.DummyRegressor(strategy="median"),
            "ridge": lambda: linear_model.Ridge(alpha=p.get("alpha", 1.0)),
            "lasso": lambda: linear_model.Lasso(alpha=p.get("alpha", 1.0), max_iter=5000),
            "linear": lambda: linear_model.LinearRegression(),
            "knn": lambda: neighbors.KNeighborsRegressor(n_neighbors=p.get("k", 5)),
            "tree": lambda: tree.DecisionTreeRegressor(max_depth=depth, random_state=seed),
            "rf": lambda: ensemble.RandomForestRegressor(
                n_estimators=p.get("n", 100), max_depth=depth, random_state=seed
            ),
            "extra": lambda: ensemble.ExtraTreesRegressor(
                n_estimators=p.get("n", 100), max_depth=depth, random_state=seed
            ),
            "hgb": lambda: ensemble.HistGradientBoostingRegressor(
                learning_rate=p.get("lr", 0.1),
                max_iter=p.get("iters", 100),
                max_leaf_nodes=p.get("leaves", 31),
                random_state=seed,
            ),
        }[baseline.model]()
    return {
        "dummy_prior": lambda: dummy.DummyClassifier(strategy="prior"),
        "dummy_stratified": lambda: dummy.DummyClassifier(strategy="stratified", random_state=seed),
        "logreg": lambda: linear_model.LogisticRegression(C=p.get("C", 1.0), max_iter=2000),
        "gnb": lambda: naive_bayes.GaussianNB(),
        "knn": lambda: neighbors.KNeighborsClassifier(n_neighbors=p.get("k", 5)),
        "tree": lambda: tree.DecisionTreeClassifier(max_depth=depth, random_state=seed),
        "rf": lambda: ensemble.RandomForestClassifier(
            n_estimators=p.get("n", 100), max_depth=depth, random_state=seed
        ),
        "extra": lambda: ensemble.ExtraTreesClassifier(
            n_estimators=p.get("n", 100), max_depth=depth, random_state=seed
        ),
        "hgb": lambda: ensemble.HistGradientBoostingClassifier(
            learning_rate=p.get("lr", 0.1),
            max_iter=p.get("iters", 100),
            max_leaf_nodes=p.get("leaves", 31),
            random_state=seed,
        ),
    }[baseline.model]()


_DENSE_ONLY = ("gnb", "hgb")


def fit_predict(problem: Problem, baseline: Baseline, train, test, dense: bool = False) -> np.ndarray:
    """Train ``baseline`` on ``train`` (a DataFrame with the target) and predict ``test``.

    ``dense`` encodes the features densely for every family (the heavy tier: a forest on ~230,000
    one-hot rows fits ~10x faster dense than sparse).

    Returns:
        ``(n_test,)`` probabilities / labels / values, or ``(n_test, n_classes)`` probabilities for
        ``multiclass_proba`` (columns in ``problem.classes`` order).
    """
    from sklearn.decomposition import TruncatedSVD
    from sklearn.pipeline import make_pipeline

    rng = np.random.default_rng(baseline.seed)
    if baseline.train_fraction < 1:
        n = max(10, round(baseline.train_fraction * len(train)))
        train = train.iloc[np.sort(rng.choice(len(train), size=min(n, len(train)), replace=False))]
    y = train[problem.target].to_numpy()
    if baseline.label_noise > 0:
        y = y.copy()
        flip = rng.random(len(y)) < baseline.label_noise
        if problem.is_regression:
            y = y.astype(float) + flip * rng.normal(0.0, 2.0 * float(np.std(y)), len(y))
        else:
            labels = np.array(sorted(set(y.tolist()), key=str), dtype=object)
            y = y.astype(object)
            y[flip] = rng.choice(labels, size=int(flip.sum()))
    if problem.is_regression and baseline.log_target:
        y = np.log1p(np.clip(y.astype(float), 0, None))
    if not problem.is_regression and len(set(y.tolist())) < 2:
        y = y.astype(object)
        y[0] = next(c for c in problem.classes if c != y[0]) if problem.classes else y[0]

    dense = dense or baseline.model in _DENSE_ONLY
    _, _, text_columns = _columns(problem, baseline)
    vectorised_text = bool(text_columns) and baseline.text != "length"
    steps = [_preprocessor(problem, baseline, sparse_ok=not dense or vectorised_text)]
    if dense and vectorised_text:  # tf-idf is too wide to densify: project it first
        steps.append(TruncatedSVD(n_components=64, random_state=baseline.seed))
    model = make_pipeline(*steps, _estimator(problem, baseline, len(train)))
    model.fit(
        train, y if problem.is_regression else y.astype(str) if problem.kind != "ordinal" else y.astype(int)
    )
    if problem.is_regression:
        pred = model.predict(test).astype(float)
        return np.expm1(pred) if baseline.log_target else pred
    if problem.kind == "binary_proba":
        classes = [str(c) for c in model.classes_]
        proba = model.predict_proba(test)
        return proba[:, classes.index("1")] if "1" in classes else np.zeros(len(test))
    if problem.kind == "multiclass_proba":
        proba = model.predict_proba(test)
        out = np.zeros((len(test), len(problem.classes)))
        fitted = [str(c) for c in model.classes_]
        for j, label in enumerate(problem.classes):
            if str(label) in fitted:
                out[:, j] = proba[:, fitted.index(str(label))]
        return out
    return np.asarray(model.predict(test))


def describe_pool(pool: Sequence[Baseline]) -> dict[str, int]:
    """Counts of pipelines per model family (for docs)."""
    counts: dict[str, int] = {}
    for b in pool:
        counts[b.model] = counts.get(b.model, 0) + 1
    return counts
