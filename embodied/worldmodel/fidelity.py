"""How well a world model's episode scores tell the simulator's successes from its failures.

For each episode the world model reads the window the RL reward source would read (``num_frames``
frames subsampled from the whole episode) and each score mode of
:mod:`~wmrl.embodied.worldmodel.scoring` turns its curves into one number. Against the simulator's
success flag (what ``real`` mode rewards) the report gives, per mode:

* ``auroc``: the probability that a random success scores above a random failure (ties count
  half), with a percentile-bootstrap 95% interval over episodes (``None`` when a class is missing);
* ``spearman``: the rank correlation of score and success;
* ``mean_success`` / ``mean_failure``: the mean score of each class;
* for ``success`` mode also ``accuracy`` (threshold 0.5) and ``brier`` (mean squared error of the
  probability).

An episode the model cannot score counts in ``unscored``, never as a score of 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wmrl.embodied.worldmodel.frames import subsample_frames
from wmrl.embodied.worldmodel.scoring import SCORE_MODES, ScoreConfig, ScoreError, episode_score

__all__ = ["auroc", "bootstrap_auroc", "episode_scores", "fidelity_report", "measure_fidelity"]


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float | None:
    """AUROC of ``scores`` for binary ``labels`` (ties count half); ``None`` without both classes."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(labels, dtype=bool)
    if y.all() or not y.any():
        return None
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64)))


def bootstrap_auroc(
    scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray, resamples: int, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile 95% interval of the AUROC over ``resamples`` episode resamples (``None`` if undefined)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if resamples < 1 or auroc(s, y) is None:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        pick = rng.integers(0, s.size, s.size)
        value = auroc(s[pick], y[pick])
        if value is not None:
            values.append(value)
    if not values:
        return None
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def episode_scores(
    model: Any, episodes: Sequence[tuple[np.ndarray, str]], num_frames: int, k: int = 3
) -> list[dict[str, float] | None]:
    """Every score mode of each ``(frames uint8 (T, H, W, 3), instruction)`` episode, or ``None``.

    ``model`` is a :class:`~wmrl.embodied.worldmodel.backend.RobometerBackend` (``predict``).
    """
    windows = [(subsample_frames(frames, num_frames)[0], task) for frames, task in episodes]
    out: list[dict[str, float] | None] = []
    for pred in model.predict(windows):
        if pred.error is not None:
            out.append(None)
            continue
        try:
            out.append(
                {
                    mode: episode_score(pred.progress, pred.success, ScoreConfig(mode=mode, k=k))
                    for mode in SCORE_MODES
                }
            )
        except ScoreError:
            out.append(None)
    return out


def fidelity_report(
    scores: Sequence[dict[str, float] | None], successes: Sequence[bool], resamples: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Per score mode: AUROC with interval, Spearman, class means (see the module docstring)."""
    from scipy.stats import spearmanr

    if len(scores) != len(successes):
        raise ValueError(f"{len(scores)} scores for {len(successes)} outcomes")
    kept = [(s, bool(y)) for s, y in zip(scores, successes, strict=True) if s is not None]
    labels = np.array([y for _, y in kept], dtype=bool)
    report: dict[str, Any] = {
        "episodes": len(scores),
        "unscored": len(scores) - len(kept),
        "successes": int(labels.sum()),
        "failures": int((~labels).sum()),
        "modes": {},
    }
    for mode in SCORE_MODES:
        values = np.array([s[mode] for s, _ in kept], dtype=np.float64)
        both = labels.any() and (~labels).any()
        rho = spearmanr(values, labels.astype(float)).statistic if both and np.ptp(values) > 0 else None
        entry: dict[str, Any] = {
            "auroc": auroc(values, labels),
            "auroc_interval": bootstrap_auroc(values, labels, resamples, seed),
            "spearman": None if rho is None or not np.isfinite(rho) else float(rho),
            "mean_success": float(values[labels].mean()) if labels.any() else None,
            "mean_failure": float(values[~labels].mean()) if (~labels).any() else None,
        }
        if mode == "success" and values.size:
            entry["accuracy"] = float(((values >= 0.5) == labels).mean())
            entry["brier"] = float(((values - labels) ** 2).mean())
        report["modes"][mode] = entry
    return report


def measure_fidelity(
    model: Any,
    episodes: Sequence[Any],
    num_frames: int,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any] | None:
    """:func:`fidelity_report` of ``model`` on recorded episodes (``frames``, ``instruction``, ``success``,
    ``name``), with every episode's scores under ``"scores"``; ``None`` for no episode."""
    if not episodes:
        return None
    if hasattr(model, "model"):
        model.model.eval()
    scores = episode_scores(model, [(e.frames, e.instruction) for e in episodes], num_frames)
    report = fidelity_report(scores, [e.success for e in episodes], resamples, seed)
    report["scores"] = [
        {"episode": e.name, "success": e.success, "scores": s} for e, s in zip(episodes, scores, strict=True)
    ]
    return report
