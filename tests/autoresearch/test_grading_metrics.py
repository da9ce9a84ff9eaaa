"""The metric registry against scikit-learn / scipy and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn import metrics as skm

from wmrl.autoresearch.grading.metrics import (
    ALIASES,
    METRICS,
    MetricError,
    get_metric,
    label_keys,
    metric_names,
    resolve_metric_name,
)

RNG = np.random.default_rng(0)
Y_BIN = RNG.integers(0, 2, 200)
P_BIN = np.clip(Y_BIN * 0.6 + RNG.random(200) * 0.5, 0.01, 0.99)
Y_MC = RNG.integers(0, 4, 300)
PRED_MC = np.where(RNG.random(300) < 0.7, Y_MC, RNG.integers(0, 4, 300))
Y_REG = RNG.gamma(2.0, 3.0, 250)
P_REG = Y_REG * RNG.lognormal(0, 0.3, 250)


def m(name, t, p):
    return get_metric(name)(np.asarray(t, dtype=object), np.asarray(p, dtype=object))


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("accuracy", lambda: skm.accuracy_score(Y_MC, PRED_MC)),
        ("error_rate", lambda: 1 - skm.accuracy_score(Y_MC, PRED_MC)),
        ("balanced_accuracy", lambda: skm.balanced_accuracy_score(Y_MC, PRED_MC)),
        ("f1_macro", lambda: skm.f1_score(Y_MC, PRED_MC, average="macro")),
        ("f1_micro", lambda: skm.f1_score(Y_MC, PRED_MC, average="micro")),
        ("f1_weighted", lambda: skm.f1_score(Y_MC, PRED_MC, average="weighted")),
        ("mcc", lambda: skm.matthews_corrcoef(Y_MC, PRED_MC)),
        ("quadratic_weighted_kappa", lambda: skm.cohen_kappa_score(Y_MC, PRED_MC, weights="quadratic")),
    ],
)
def test_label_metrics_match_sklearn(name, reference):
    assert m(name, Y_MC, PRED_MC) == pytest.approx(reference(), abs=1e-12)


def test_labels_compare_as_values_not_spellings():
    # 1, 1.0 and "1" are one class; True, "true" and "True" another.
    assert m("accuracy", [1, 2, 3], ["1", "2.0", 3.0]) == 1.0
    assert m("accuracy", [True, False], ["true", "False"]) == 1.0
    assert list(label_keys(np.array(["007", 7.5, "cat "], dtype=object))) == ["7", "7.5", "cat"]


def test_binary_metrics_match_sklearn():
    labels = (P_BIN > 0.5).astype(int)
    assert m("f1", Y_BIN, labels) == pytest.approx(skm.f1_score(Y_BIN, labels))
    assert m("roc_auc", Y_BIN, P_BIN) == pytest.approx(skm.roc_auc_score(Y_BIN, P_BIN))
    assert m("log_loss", Y_BIN, P_BIN) == pytest.approx(skm.log_loss(Y_BIN, P_BIN))
    assert m("normalized_gini", Y_BIN, P_BIN) == pytest.approx(2 * skm.roc_auc_score(Y_BIN, P_BIN) - 1)


def test_binary_positive_class_from_labels():
    truth = np.array(["True", "False", "True", "False"], dtype=object)
    assert m("roc_auc", truth, [0.9, 0.1, 0.8, 0.3]) == 1.0
    assert m("f1", ["True", "False"], ["True", "True"]) == pytest.approx(2 / 3)
    with pytest.raises(MetricError, match="positive class"):
        m("roc_auc", ["cat", "dog"], [0.1, 0.9])
    with pytest.raises(MetricError, match="exactly two classes"):
        m("roc_auc", [0, 1, 2], [0.1, 0.5, 0.9])


def test_multiclass_log_loss_matches_sklearn_with_row_normalisation():
    k = 4
    onehot = np.eye(k)[Y_MC]
    proba = RNG.random((300, k)) + onehot
    expected = skm.log_loss(Y_MC, proba / proba.sum(axis=1, keepdims=True), labels=range(k))
    assert get_metric("log_loss")(onehot, proba) == pytest.approx(expected)
    with pytest.raises(MetricError, match="one-hot"):
        get_metric("log_loss")(onehot * 2, proba)


def test_log_loss_clips_certain_mistakes():
    # A confident wrong answer costs -log(1e-15), not infinity.
    assert m("log_loss", [1], [0.0]) == pytest.approx(-math.log(1e-15))


def test_columnwise_auc_is_the_mean_of_columns():
    t = RNG.integers(0, 2, (100, 3))
    p = RNG.random((100, 3))
    expected = np.mean([skm.roc_auc_score(t[:, j], p[:, j]) for j in range(3)])
    assert get_metric("roc_auc")(t, p) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("mse", lambda t, p: skm.mean_squared_error(t, p)),
        ("rmse", lambda t, p: math.sqrt(skm.mean_squared_error(t, p))),
        ("rmsle", lambda t, p: math.sqrt(skm.mean_squared_log_error(t, p))),
        ("mae", skm.mean_absolute_error),
        ("median_absolute_error", skm.median_absolute_error),
        ("r2", skm.r2_score),
        ("mape", skm.mean_absolute_percentage_error),
        ("pearson", lambda t, p: float(np.corrcoef(t, p)[0, 1])),
    ],
)
def test_regression_metrics_match_sklearn(name, reference):
    assert m(name, Y_REG, P_REG) == pytest.approx(reference(Y_REG, P_REG), rel=1e-10)


def test_rank_correlations_match_scipy():
    from scipy.stats import kendalltau, spearmanr

    assert m("spearman", Y_REG, P_REG) == pytest.approx(spearmanr(Y_REG, P_REG).statistic)
    assert m("kendall_tau", Y_REG, P_REG) == pytest.approx(kendalltau(Y_REG, P_REG).statistic)


def test_smape_closed_form():
    # |2-1| * 2 / (1 + 2) = 2/3 ; 0/0 counts 0 ; |0-4|*2/4 = 2  -> mean (2/3 + 0 + 2) / 3 * 100
    assert m("smape", [1, 0, 0], [2, 0, 4]) == pytest.approx(100 * (2 / 3 + 0 + 2) / 3)


def test_multi_output_regression_metrics():
    t = RNG.random((50, 3)) * 10
    p = t + RNG.normal(0, 1, (50, 3))
    p = np.abs(p)
    expected = np.mean([math.sqrt(skm.mean_squared_error(t[:, j], p[:, j])) for j in range(3)])
    assert get_metric("mcrmse")(t, p) == pytest.approx(expected)
    expected_log = np.mean([math.sqrt(skm.mean_squared_log_error(t[:, j], p[:, j])) for j in range(3)])
    assert get_metric("mean_columnwise_rmsle")(t, p) == pytest.approx(expected_log)
    with pytest.raises(MetricError, match="several target columns"):
        get_metric("mcrmse")(t[:, 0], p[:, 0])


def test_map_at_k_closed_form():
    # hit at rank 1 -> 1, rank 2 -> 1/2, rank 3 -> 1/3, miss -> 0
    truth = ["a", "b", "c", "d"]
    guesses = ["a b c", "a b c", "a b c", "a b c"]
    assert m("map@3", truth, guesses) == pytest.approx((1 + 1 / 2 + 1 / 3 + 0) / 4)
    assert m("map@5", ["e"], ["a b c d e f"]) == pytest.approx(1 / 5)


def test_errors_name_the_rule():
    with pytest.raises(MetricError, match="integer ratings"):
        m("quadratic_weighted_kappa", [1, 2], [1.5, 2])
    with pytest.raises(MetricError, match="> -1"):
        m("rmsle", [1, 2], [-2, 2])
    with pytest.raises(MetricError, match="R² is undefined"):
        m("r2", [3, 3, 3], [1, 2, 3])
    with pytest.raises(MetricError, match="percentage error is undefined"):
        m("mape", [0, 1], [1, 1])
    with pytest.raises(MetricError, match="shape"):
        get_metric("rmse")(np.zeros(3), np.zeros(4))


def test_directions():
    lower = {n for n, metric in METRICS.items() if metric.lower_is_better}
    assert lower == {
        "error_rate",
        "log_loss",
        "mse",
        "rmse",
        "rmsle",
        "mae",
        "median_absolute_error",
        "mape",
        "smape",
        "mcrmse",
        "mean_columnwise_rmsle",
    }


def test_aliases_resolve_to_registered_metrics():
    assert all(target in METRICS for target in ALIASES.values())
    assert resolve_metric_name("auc-roc") == "roc_auc"
    assert resolve_metric_name("Multi-Class-Log-Loss") == "log_loss"
    assert resolve_metric_name("F1_MACRO") == "f1_macro"
    assert resolve_metric_name("root_mean_squared_error") == "rmse"
    with pytest.raises(MetricError, match="unknown metric 'dice'"):
        get_metric("dice")
    assert metric_names() == sorted(METRICS)
