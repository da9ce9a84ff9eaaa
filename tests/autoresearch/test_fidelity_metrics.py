"""Fidelity metrics against values computed by hand (and scipy / scikit-learn where they apply)."""

from __future__ import annotations

import numpy as np
import pytest

from wmrl.autoresearch.fidelity.metrics import (
    pairwise_accuracy,
    reward_mae,
    score_metrics,
    split_calibration,
    status_accuracy,
    status_confusion,
    within_group_rank_correlation,
)


def test_status_accuracy_skips_unknowns_and_reads_killed_as_timeout():
    real = ["valid", "runtime_error", "killed", "harness_error", "no_submission", None]
    pred = ["valid", "valid", "timeout", "valid", "no_submission", "valid"]
    # compared: valid/valid ok, runtime/valid wrong, killed~timeout ok, no_sub ok -> 3 of 4
    assert status_accuracy(real, pred) == 0.75
    assert status_confusion(real, pred) == {
        "valid": {"valid": 1},
        "runtime_error": {"valid": 1},
        "timeout": {"timeout": 1},
        "no_submission": {"no_submission": 1},
    }
    assert status_accuracy(["harness_error"], ["valid"]) is None
    with pytest.raises(ValueError, match="real statuses"):
        status_accuracy(["valid"], [])


def test_reward_mae_by_hand():
    assert reward_mae([0.1, 0.5, None, 0.9], [0.2, 0.2, 0.3, None]) == pytest.approx((0.1 + 0.3) / 2)
    assert reward_mae([None], [0.1]) is None


def test_pairwise_accuracy_by_hand():
    # group a: real (0, 0.1, 0.6), score (0.3, 0.2, 0.9): pairs (0,0.1) wrong, (0,0.6) right, (0.1,0.6) right
    # group b: real (0.2, 0.2, 0.7), score (0.5, 0.1, 0.5): (0.2,0.2) not a pair, (0.2,0.7) tie -> 1/2, (0.2,0.7) right
    real = [0.0, 0.1, 0.6, 0.2, 0.2, 0.7]
    score = [0.3, 0.2, 0.9, 0.5, 0.1, 0.5]
    groups = ["a", "a", "a", "b", "b", "b"]
    acc, pairs = pairwise_accuracy(real, score, groups)
    assert pairs == 5
    assert acc == pytest.approx((0 + 1 + 1 + 0.5 + 1) / 5)
    # pairs never cross groups: one pair per group here
    acc, pairs = pairwise_accuracy([0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0], ["x", "x", "y", "y"])
    assert (acc, pairs) == (0.5, 2)


def test_within_group_rank_correlation_matches_scipy_per_group_and_skips_flat_groups():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    real = rng.random(12).round(2)
    score = real + rng.normal(0, 0.3, 12)
    groups = ["a"] * 5 + ["b"] * 4 + ["flat"] * 3
    real[9:] = 0.2  # a group whose real rewards are all equal has no correlation
    rho, n = within_group_rank_correlation(real.tolist(), score.tolist(), groups)
    expected = (spearmanr(real[:5], score[:5]).statistic + spearmanr(real[5:9], score[5:9]).statistic) / 2
    assert n == 2 and rho == pytest.approx(expected)
    # a perfectly monotone score has correlation 1 and pairwise accuracy 1
    m = score_metrics([0.0, 0.1, 0.5, 0.9], [0.2, 0.3, 0.31, 0.8], ["g"] * 4)
    assert m["rank_correlation"] == pytest.approx(1.0) and m["pairwise_accuracy"] == 1.0
    assert m["reward_mae"] == pytest.approx((0.2 + 0.2 + 0.19 + 0.1) / 4)


def test_split_calibration_fits_on_one_half_and_reports_on_the_other():
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(1)
    score = rng.random(40)
    real = np.clip(score**3 + rng.normal(0, 0.02, 40), 0, 1)  # monotone but far from the identity
    groups = [k // 4 for k in range(40)]
    out = split_calibration(real.tolist(), score.tolist(), groups, seed=3)
    fit, report = np.array(out["fit_index"]), np.array(out["report_index"])
    assert len(fit) == len(report) == 20 and not set(fit) & set(report)
    iso = IsotonicRegression(out_of_bounds="clip").fit(score[fit], real[fit])
    expected_mae = float(np.mean(np.abs(iso.predict(score[report]) - real[report])))
    assert out["calibrated"]["reward_mae"] == pytest.approx(expected_mae)
    assert out["raw"]["reward_mae"] == pytest.approx(float(np.mean(np.abs(score[report] - real[report]))))
    assert out["calibrated"]["reward_mae"] < out["raw"]["reward_mae"] / 2  # calibration fixes the spacing
    # unknown rows are in neither half
    with_unknown = split_calibration([None, *real.tolist()], [0.5, *score.tolist()], [-1, *groups])
    assert 0 not in with_unknown["fit_index"] + with_unknown["report_index"]
