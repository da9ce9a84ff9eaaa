"""How well a world model's scores track real execution: pure functions over paired arrays.

Inputs are aligned per solution: the world model's predicted status and score, the real status
and reward, and a *group* (the solutions of one task, or of one GRPO group), since only
within-group differences reach a GRPO gradient. Unknown values (``None``/NaN: a harness failure,
an unparseable prediction) are left out of every metric, never counted as 0.

* **status accuracy**: share of solutions whose predicted status equals the real one (a real
  ``killed`` is compared as ``timeout``: the world model has one status for both);
* **reward MAE**: mean absolute difference between the score and the real reward;
* **within-group rank correlation**: Spearman's rho between score and real reward inside each group
  with at least two distinct real rewards and two distinct scores, averaged over those groups;
* **pairwise accuracy**: over pairs inside a group whose real rewards differ, the share ordered
  the same way by the scores (a tied score counts one half).

:func:`split_calibration` fits an isotonic map (scikit-learn) from score to real reward on one half
of the solutions and reports the metrics of raw and calibrated scores on the OTHER half.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

__all__ = [
    "STATUS_ALIASES",
    "compare_status",
    "pairwise_accuracy",
    "reward_mae",
    "score_metrics",
    "split_calibration",
    "status_accuracy",
    "status_confusion",
    "within_group_rank_correlation",
]

#: Real statuses compared under another name: the world model predicts one status for both kills.
STATUS_ALIASES = {"killed": "timeout"}


@overload
def compare_status(status: str) -> str: ...
@overload
def compare_status(status: None) -> None: ...
@overload
def compare_status(status: str | None) -> str | None: ...
def compare_status(status: str | None) -> str | None:
    return None if status is None else STATUS_ALIASES.get(status, status)


def _known_status(real: Sequence[str | None], predicted: Sequence[str | None]) -> list[tuple[str, str]]:
    if len(real) != len(predicted):
        raise ValueError(f"{len(real)} real statuses but {len(predicted)} predictions")
    return [
        (compare_status(r), compare_status(p))
        for r, p in zip(real, predicted, strict=True)
        if r is not None and p is not None and r != "harness_error"
    ]


def status_accuracy(real: Sequence[str | None], predicted: Sequence[str | None]) -> float | None:
    """Share of solutions (with both statuses known) whose predicted status is the real one."""
    pairs = _known_status(real, predicted)
    return sum(r == p for r, p in pairs) / len(pairs) if pairs else None


def status_confusion(
    real: Sequence[str | None], predicted: Sequence[str | None]
) -> dict[str, dict[str, int]]:
    """``{real status: {predicted status: count}}``."""
    table: dict[str, dict[str, int]] = {}
    for r, p in _known_status(real, predicted):
        row = table.setdefault(r, {})
        row[p] = row.get(p, 0) + 1
    return table


def _arrays(*columns: Sequence[float | None]) -> list[np.ndarray]:
    return [np.array([np.nan if v is None else float(v) for v in c], dtype=np.float64) for c in columns]


def reward_mae(real: Sequence[float | None], score: Sequence[float | None]) -> float | None:
    """Mean absolute error of ``score`` against ``real`` over solutions where both are known."""
    r, s = _arrays(real, score)
    if r.shape != s.shape:
        raise ValueError(f"{r.size} real rewards but {s.size} scores")
    known = ~np.isnan(r) & ~np.isnan(s)
    return float(np.mean(np.abs(r[known] - s[known]))) if known.any() else None


def _groups(groups: Sequence[Any], *columns: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    keys = list(groups)
    if any(len(keys) != c.size for c in columns):
        raise ValueError("groups and values must have the same length")
    out = []
    for key in dict.fromkeys(keys):
        sel = np.array([k == key for k in keys])
        parts = [c[sel] for c in columns]
        known = np.logical_and.reduce([~np.isnan(p) for p in parts])
        out.append(tuple(p[known] for p in parts))
    return out


def within_group_rank_correlation(
    real: Sequence[float | None], score: Sequence[float | None], groups: Sequence[Any]
) -> tuple[float | None, int]:
    """Mean within-group Spearman correlation and the number of groups it averages.

    Groups with fewer than two distinct real rewards or two distinct scores have no defined
    correlation and are skipped.
    """
    from scipy.stats import spearmanr

    r, s = _arrays(real, score)
    values = []
    for gr, gs in _groups(groups, r, s):
        if len(np.unique(gr)) < 2 or len(np.unique(gs)) < 2:
            continue
        values.append(float(spearmanr(gr, gs).statistic))
    return (math.fsum(values) / len(values) if values else None), len(values)


def pairwise_accuracy(
    real: Sequence[float | None], score: Sequence[float | None], groups: Sequence[Any]
) -> tuple[float | None, int]:
    """Share of within-group pairs with different real rewards that the scores order the same way
    (tied scores count 1/2), and the number of such pairs."""
    r, s = _arrays(real, score)
    correct, pairs = 0.0, 0
    for gr, gs in _groups(groups, r, s):
        for i in range(len(gr)):
            for j in range(i + 1, len(gr)):
                if gr[i] == gr[j]:
                    continue
                pairs += 1
                agree = np.sign(gr[i] - gr[j]) * np.sign(gs[i] - gs[j])
                correct += 1.0 if agree > 0 else 0.5 if agree == 0 else 0.0
    return (correct / pairs if pairs else None), pairs


def score_metrics(
    real: Sequence[float | None], score: Sequence[float | None], groups: Sequence[Any]
) -> dict[str, float | int | None]:
    """Reward MAE, within-group rank correlation and pairwise accuracy of ``score``."""
    rho, n_groups = within_group_rank_correlation(real, score, groups)
    acc, n_pairs = pairwise_accuracy(real, score, groups)
    return {
        "reward_mae": reward_mae(real, score),
        "rank_correlation": rho,
        "rank_groups": n_groups,
        "pairwise_accuracy": acc,
        "pairs": n_pairs,
    }


def split_calibration(
    real: Sequence[float | None],
    score: Sequence[float | None],
    groups: Sequence[Any],
    seed: int = 0,
    fit_fraction: float = 0.5,
) -> dict[str, Any]:
    """Fit an isotonic map on a random ``fit_fraction`` of the solutions; report on the rest.

    Returns ``{"fit_items", "report_items", "raw", "calibrated", "map": {"x", "y"}, "fit_index",
    "report_index"}`` where ``raw`` and ``calibrated`` are :func:`score_metrics` on the report half.
    ``calibrated`` is ``None`` when the fit half has fewer than 2 known pairs.
    """
    from sklearn.isotonic import IsotonicRegression

    r, s = _arrays(real, score)
    keys = list(groups)
    known = np.flatnonzero(~np.isnan(r) & ~np.isnan(s))
    rng = np.random.default_rng(seed)
    order = rng.permutation(known)
    n_fit = round(fit_fraction * len(order))
    fit, report = np.sort(order[:n_fit]), np.sort(order[n_fit:])
    raw = score_metrics(r[report], s[report], [keys[i] for i in report])
    out: dict[str, Any] = {
        "fit_items": len(fit),
        "report_items": len(report),
        "fit_index": fit.tolist(),
        "report_index": report.tolist(),
        "raw": raw,
        "calibrated": None,
        "map": None,
    }
    if len(fit) >= 2:
        iso = IsotonicRegression(out_of_bounds="clip").fit(s[fit], r[fit])
        calibrated = iso.predict(s[report])
        out["calibrated"] = score_metrics(r[report], calibrated, [keys[i] for i in report])
        out["map"] = {"x": iso.X_thresholds_.tolist(), "y": iso.y_thresholds_.tolist()}
    return out
