"""The metric registry: every competition metric a task can name, with its direction.

A metric takes the aligned answers and predictions of one task (rows in the same order, one row
per test id) and returns a float. Single-target tasks pass 1-D arrays of shape ``(n,)``; tasks
with several target columns (per-class probabilities, multi-output regression) pass 2-D arrays of
shape ``(n, k)`` with the columns in the task's ``target_columns`` order.

Each :class:`Metric` also says what a prediction must look like (``prediction``), so that
submission validation can reject a wrong type with a clear reason before the metric runs:

* ``"label"``: discrete class labels compared for equality (accuracy, F1, ...);
* ``"integer"``: integer-valued labels (quadratic weighted kappa);
* ``"probability"``: numbers in [0, 1] (log loss);
* ``"numeric"``: any finite real number (AUC scores, regression outputs);
* ``"ranking"``: space-separated label lists, best guess first (MAP@k).

Names follow scikit-learn where one exists; :data:`ALIASES` maps the names used by MLE-bench
configs, MLE-Dojo metric classes and DSBench scripts onto them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ALIASES",
    "METRICS",
    "Metric",
    "MetricError",
    "get_metric",
    "label_keys",
    "metric_names",
    "resolve_metric_name",
]

PREDICTION_KINDS = ("label", "integer", "probability", "numeric", "ranking")


class MetricError(ValueError):
    """A metric cannot be computed on these inputs (the message names the broken rule)."""


@dataclass(frozen=True)
class Metric:
    """One competition metric.

    Attributes:
        name: registry name.
        lower_is_better: direction (True for errors and losses).
        prediction: what a prediction must look like (one of ``PREDICTION_KINDS``).
        multi_target: whether the metric accepts several target columns (2-D inputs).
        single_target: whether it accepts one target column (1-D inputs).
        fn: ``fn(y_true, y_pred) -> float`` on aligned arrays.
        description: one line for task descriptions and ``wmrl tasks show``.
    """

    name: str
    lower_is_better: bool
    prediction: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    description: str
    multi_target: bool = False
    single_target: bool = True

    def __post_init__(self) -> None:
        if self.prediction not in PREDICTION_KINDS:
            raise ValueError(f"metric {self.name!r}: prediction must be one of {PREDICTION_KINDS}")

    def __call__(self, y_true: np.ndarray, y_pred: np.ndarray) -> float:
        y_true = np.asarray(y_true)
        y_pred = np.asarray(y_pred)
        if y_true.shape != y_pred.shape:
            raise MetricError(
                f"{self.name}: answers have shape {y_true.shape} but predictions {y_pred.shape}"
            )
        if y_true.ndim not in (1, 2) or y_true.shape[0] == 0:
            raise MetricError(
                f"{self.name}: expected a non-empty (n,) or (n, k) array; got shape {y_true.shape}"
            )
        if y_true.ndim == 2 and y_true.shape[1] == 1 and self.single_target:
            y_true, y_pred = y_true[:, 0], y_pred[:, 0]
        if y_true.ndim == 2 and not self.multi_target:
            raise MetricError(f"{self.name} takes one target column; got {y_true.shape[1]}")
        if y_true.ndim == 1 and not self.single_target:
            raise MetricError(f"{self.name} needs several target columns (one per class or output)")
        value = float(self.fn(y_true, y_pred))
        if not math.isfinite(value):
            raise MetricError(f"{self.name} is not finite on these inputs ({value})")
        return value


# --------------------------------------------------------------------------------------------
# Input helpers


def label_keys(values: np.ndarray) -> np.ndarray:
    """Canonical string keys for class labels, so that ``1``, ``1.0`` and ``"1"`` are one label and
    ``True`` / ``"True"`` / ``"true"`` another. Shape is preserved."""
    flat = np.asarray(values, dtype=object).ravel()
    out = np.empty(flat.shape, dtype=object)
    for i, v in enumerate(flat):
        if isinstance(v, (bool, np.bool_)):
            out[i] = "True" if v else "False"
        elif isinstance(v, (int, np.integer)):
            out[i] = str(int(v))
        elif isinstance(v, (float, np.floating)):
            out[i] = str(int(v)) if math.isfinite(v) and float(v).is_integer() else repr(float(v))
        else:
            text = str(v).strip()
            low = text.lower()
            if low in ("true", "false"):
                out[i] = "True" if low == "true" else "False"
            else:
                try:
                    number = float(text)
                except ValueError:
                    out[i] = text
                else:
                    out[i] = str(int(number)) if math.isfinite(number) and number.is_integer() else text
    return out.reshape(np.shape(values))


def _numeric(name: str, values: np.ndarray) -> np.ndarray:
    try:
        out = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise MetricError(f"{name}: values must be numbers") from None
    if not np.all(np.isfinite(out)):
        raise MetricError(f"{name}: values must be finite (no NaN or inf)")
    return out


def _binary_truth(name: str, y_true: np.ndarray) -> np.ndarray:
    """Map binary answers to 0/1 (positive = 1 / True / the larger of two numbers)."""
    keys = label_keys(y_true)
    classes = sorted(set(keys.tolist()))
    for pair, positive in ((("0", "1"), "1"), (("False", "True"), "True")):
        if set(classes) <= set(pair):  # 0/1 or False/True answers, even if one class is absent
            return (keys == positive).astype(int)
    if len(classes) != 2:
        raise MetricError(
            f"{name}: needs exactly two classes in the answers; found {len(classes)} ({classes[:5]})"
        )
    if set(classes) == {"False", "True"}:
        positive = "True"
    else:
        try:
            positive = max(classes, key=float)
        except ValueError:
            raise MetricError(
                f"{name}: cannot tell the positive class among non-numeric labels {classes}"
            ) from None
    return (keys == positive).astype(int)


# --------------------------------------------------------------------------------------------
# Classification on labels


def _accuracy(t, p):
    return float(np.mean(label_keys(t) == label_keys(p)))


def _error_rate(t, p):
    return 1.0 - _accuracy(t, p)


def _balanced_accuracy(t, p):
    from sklearn.metrics import balanced_accuracy_score

    return balanced_accuracy_score(label_keys(t), label_keys(p))


def _f1_binary(t, p):
    from sklearn.metrics import f1_score

    truth = _binary_truth("f1", t)
    keys_t, keys_p = label_keys(t), label_keys(p)
    positive = keys_t[truth == 1][0]
    return f1_score(keys_t == positive, keys_p == positive)


def _f1_avg(average: str):
    def fn(t, p):
        from sklearn.metrics import f1_score

        return f1_score(label_keys(t), label_keys(p), average=average)

    return fn


def _mcc(t, p):
    from sklearn.metrics import matthews_corrcoef

    return matthews_corrcoef(label_keys(t), label_keys(p))


def _qwk(t, p):
    from sklearn.metrics import cohen_kappa_score

    truth = _numeric("quadratic_weighted_kappa", t)
    pred = _numeric("quadratic_weighted_kappa", p)
    if not (np.all(truth == np.round(truth)) and np.all(pred == np.round(pred))):
        raise MetricError("quadratic_weighted_kappa: answers and predictions must be integer ratings")
    return cohen_kappa_score(truth.astype(int), pred.astype(int), weights="quadratic")


# --------------------------------------------------------------------------------------------
# Classification on scores / probabilities


def _roc_auc(t, p):
    from sklearn.metrics import roc_auc_score

    if t.ndim == 2:  # mean column-wise AUC (MLE-bench / Kaggle multi-label convention)
        return float(np.mean([_roc_auc(t[:, j], p[:, j]) for j in range(t.shape[1])]))
    return roc_auc_score(_binary_truth("roc_auc", t), _numeric("roc_auc", p))


def _gini(t, p):
    return 2.0 * _roc_auc(t, p) - 1.0


def _log_loss(t, p):
    """Binary (1-D: probability of the positive class) or multi-class (2-D: one probability column per
    class, answers one-hot). For multi-class each row is divided by its sum; probabilities are then
    clipped to [1e-15, 1 - 1e-15], as Kaggle does."""
    eps = 1e-15
    prob = _numeric("log_loss", p)
    if t.ndim == 1:
        truth = _binary_truth("log_loss", t)
        prob = np.clip(prob, eps, 1 - eps)
        return float(-np.mean(truth * np.log(prob) + (1 - truth) * np.log(1 - prob)))
    truth = _numeric("log_loss", t)
    if not np.all((truth == 0) | (truth == 1)) or not np.all(truth.sum(axis=1) == 1):
        raise MetricError("log_loss: multi-class answers must be one-hot (one 1 per row)")
    # Kaggle's order: divide each row by its sum, then clip. The lower clip first keeps an all-zero
    # row finite (it becomes uniform) without changing any other row beyond 1e-15.
    prob = np.clip(prob, eps, None)
    prob = np.clip(prob / prob.sum(axis=1, keepdims=True), eps, 1 - eps)
    return float(-np.mean(np.sum(truth * np.log(prob), axis=1)))


# --------------------------------------------------------------------------------------------
# Regression


def _pair(name, t, p):
    return _numeric(name, t), _numeric(name, p)


def _mse(t, p):
    t, p = _pair("mse", t, p)
    return float(np.mean((t - p) ** 2))


def _rmse(t, p):
    return math.sqrt(_mse(t, p))


def _rmsle(t, p):
    t, p = _pair("rmsle", t, p)
    if np.any(t <= -1) or np.any(p <= -1):
        raise MetricError("rmsle: values must be > -1 (log1p is undefined below)")
    return math.sqrt(float(np.mean((np.log1p(p) - np.log1p(t)) ** 2)))


def _mae(t, p):
    t, p = _pair("mae", t, p)
    return float(np.mean(np.abs(t - p)))


def _medae(t, p):
    t, p = _pair("median_absolute_error", t, p)
    return float(np.median(np.abs(t - p)))


def _r2(t, p):
    t, p = _pair("r2", t, p)
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    if ss_tot == 0:
        raise MetricError("r2: the answers are constant, R² is undefined")
    return 1.0 - float(np.sum((t - p) ** 2)) / ss_tot


def _mape(t, p):
    t, p = _pair("mape", t, p)
    if np.any(t == 0):
        raise MetricError("mape: an answer is 0, the percentage error is undefined")
    return float(np.mean(np.abs((t - p) / t)))


def _smape(t, p):
    """Kaggle's SMAPE in percent: 100/n · Σ 2|p − t| / (|t| + |p|), with 0/0 counted as 0."""
    t, p = _pair("smape", t, p)
    den = np.abs(t) + np.abs(p)
    ratio = np.where(den == 0, 0.0, 2.0 * np.abs(p - t) / np.where(den == 0, 1.0, den))
    return float(100.0 * np.mean(ratio))


def _columnwise(metric_fn):
    def fn(t, p):
        return float(np.mean([metric_fn(t[:, j], p[:, j]) for j in range(t.shape[1])]))

    return fn


def _pearson(t, p):
    t, p = _pair("pearson", t, p)
    if np.std(t) == 0 or np.std(p) == 0:
        raise MetricError("pearson: the correlation of a constant column is undefined")
    return float(np.corrcoef(t, p)[0, 1])


def _spearman(t, p):
    from scipy.stats import spearmanr

    t, p = _pair("spearman", t, p)
    if t.ndim == 2:
        return float(np.mean([_spearman(t[:, j], p[:, j]) for j in range(t.shape[1])]))
    if np.all(t == t[0]) or np.all(p == p[0]):
        raise MetricError("spearman: the rank correlation of a constant column is undefined")
    return float(spearmanr(t, p).statistic)


def _kendall(t, p):
    from scipy.stats import kendalltau

    t, p = _pair("kendall_tau", t, p)
    return float(kendalltau(t, p).statistic)


# --------------------------------------------------------------------------------------------
# Ranking


def _map_at(k: int):
    def fn(t, p):
        truth = label_keys(t)
        total = 0.0
        for answer, guess in zip(truth, p, strict=True):
            guesses = str(guess).split()[:k]
            for rank, g in enumerate(guesses, start=1):
                if label_keys(np.array([g]))[0] == answer:
                    total += 1.0 / rank
                    break
        return total / len(truth)

    return fn


def _entry(name, lower, prediction, fn, description, multi=False, single=True):
    return Metric(name, lower, prediction, fn, description, multi_target=multi, single_target=single)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        _entry(
            "accuracy", False, "label", _accuracy, "share of rows whose predicted label equals the answer"
        ),
        _entry("error_rate", True, "label", _error_rate, "1 − accuracy (top-1 classification error)"),
        _entry("balanced_accuracy", False, "label", _balanced_accuracy, "mean per-class recall"),
        _entry("f1", False, "label", _f1_binary, "F1 score of the positive class (binary)"),
        _entry("f1_macro", False, "label", _f1_avg("macro"), "unweighted mean of per-class F1"),
        _entry("f1_micro", False, "label", _f1_avg("micro"), "F1 over all rows pooled (micro average)"),
        _entry("f1_weighted", False, "label", _f1_avg("weighted"), "per-class F1 weighted by support"),
        _entry("mcc", False, "label", _mcc, "Matthews correlation coefficient"),
        _entry(
            "quadratic_weighted_kappa",
            False,
            "integer",
            _qwk,
            "Cohen's kappa with quadratic weights on integer ratings",
        ),
        _entry(
            "roc_auc",
            False,
            "numeric",
            _roc_auc,
            "area under the ROC curve of a score for the positive class (mean over columns when several)",
            multi=True,
        ),
        _entry(
            "normalized_gini", False, "numeric", _gini, "normalised Gini coefficient, 2·AUC − 1", multi=True
        ),
        _entry(
            "log_loss",
            True,
            "probability",
            _log_loss,
            "cross-entropy of predicted probabilities (binary: one column; multi-class: one column per class)",
            multi=True,
        ),
        _entry("mse", True, "numeric", _mse, "mean squared error"),
        _entry("rmse", True, "numeric", _rmse, "root mean squared error"),
        _entry("rmsle", True, "numeric", _rmsle, "root mean squared error of log(1 + value)"),
        _entry("mae", True, "numeric", _mae, "mean absolute error"),
        _entry("median_absolute_error", True, "numeric", _medae, "median absolute error"),
        _entry("r2", False, "numeric", _r2, "coefficient of determination R²"),
        _entry("mape", True, "numeric", _mape, "mean absolute percentage error (a fraction, not percent)"),
        _entry(
            "smape", True, "numeric", _smape, "symmetric mean absolute percentage error, in percent (Kaggle)"
        ),
        _entry(
            "mcrmse", True, "numeric", _columnwise(_rmse), "mean column-wise RMSE", multi=True, single=False
        ),
        _entry(
            "mean_columnwise_rmsle",
            True,
            "numeric",
            _columnwise(_rmsle),
            "mean column-wise RMSLE",
            multi=True,
            single=False,
        ),
        _entry("pearson", False, "numeric", _pearson, "Pearson correlation coefficient"),
        _entry(
            "spearman",
            False,
            "numeric",
            _spearman,
            "Spearman rank correlation (mean over columns when several)",
            multi=True,
        ),
        _entry("kendall_tau", False, "numeric", _kendall, "Kendall's tau-b rank correlation"),
        _entry(
            "map@3", False, "ranking", _map_at(3), "mean average precision at 3 (space-separated guesses)"
        ),
        _entry(
            "map@5", False, "ranking", _map_at(5), "mean average precision at 5 (space-separated guesses)"
        ),
    ]
}

#: Names other projects use, mapped to registry names (lower-cased, spaces/underscores → hyphens).
ALIASES: dict[str, str] = {
    # MLE-bench grader names
    "auc-roc": "roc_auc",
    "auc": "roc_auc",
    "roc-auc": "roc_auc",
    "auroc": "roc_auc",
    "column-wise-roc-auc": "roc_auc",
    "mean-column-wise-roc-auc": "roc_auc",
    "auroc-multi-label": "roc_auc",
    "multi-class-log-loss": "log_loss",
    "log-loss": "log_loss",
    "logloss": "log_loss",
    "micro-f1-score": "f1_micro",
    "macro-f1-score": "f1_macro",
    "f1-score": "f1",
    "root-mean-squared-error": "rmse",
    "mean-squared-error": "mse",
    "quadratic-weighted-kappa": "quadratic_weighted_kappa",
    "qwk": "quadratic_weighted_kappa",
    "top-1-classification-error": "error_rate",
    "multi-class-classification-accuracy": "accuracy",
    "classification-accuracy": "accuracy",
    "pearson-correlation-coefficient": "pearson",
    "mean-column-wise-rmsle": "mean_columnwise_rmsle",
    "root-mean-squared-log-error": "rmsle",
    "mean-absolute-error": "mae",
    "matthews-correlation-coefficient": "mcc",
    "map-at-5": "map@5",
    "kendall-tau": "kendall_tau",
    "column-wise-spearman": "spearman",
    "mean-spearman": "spearman",
    "r2-score": "r2",
    "balanced-accuracy": "balanced_accuracy",
    "median-absolute-error": "median_absolute_error",
    "mean-absolute-percentage-error": "mape",
    "symmetric-mean-absolute-percentage-error": "smape",
    "gini": "normalized_gini",
    "normalized-gini": "normalized_gini",
}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def resolve_metric_name(name: str) -> str:
    """Registry name for ``name`` (a registry name or a known alias).

    Raises:
        MetricError: the name is neither.
    """
    if name in METRICS:
        return name
    key = _norm(name)
    for registered in METRICS:
        if _norm(registered) == key:
            return registered
    if key in ALIASES:
        return ALIASES[key]
    raise MetricError(
        f"unknown metric {name!r}: known metrics are {', '.join(sorted(METRICS))}; "
        "pass one of them explicitly (e.g. load_task(path, metric='rmse'))"
    )


def get_metric(name: str) -> Metric:
    """The :class:`Metric` registered under ``name`` or one of its aliases."""
    return METRICS[resolve_metric_name(name)]


def metric_names() -> list[str]:
    """All registry names, sorted."""
    return sorted(METRICS)
