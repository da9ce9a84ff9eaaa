"""Text summary and calibration plot of a fidelity report (see :mod:`.run`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["format_report", "plot_calibration"]


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_report(report: dict[str, Any]) -> str:
    cal = report["calibration"]
    lines = [
        f"solutions: {report['solutions']} ({report['source']}); world model {report['world_model']['model']} "
        f"({report['world_model']['scoring']}); sandbox {report['sandbox']}",
        f"status accuracy: {_fmt(report['status_accuracy'])} (model-predicted only, without the exact gate: "
        f"{_fmt(report['status_accuracy_model_only'])}; gated: {report['world_model_gated']})",
        "all solutions:   reward MAE {mae}, within-group rank correlation {rho} ({g} groups), pairwise accuracy {acc} ({p} pairs)".format(
            mae=_fmt(report["score"]["reward_mae"]),
            rho=_fmt(report["score"]["rank_correlation"]),
            g=report["score"]["rank_groups"],
            acc=_fmt(report["score"]["pairwise_accuracy"]),
            p=report["score"]["pairs"],
        ),
        f"calibration: isotonic map fitted on {cal['fit_items']} solutions, measured on the other {cal['report_items']}:",
    ]
    for name in ("raw", "calibrated"):
        m = cal[name]
        if m is None:
            lines.append(f"  {name:<10}  (too few solutions to fit)")
            continue
        lines.append(
            f"  {name:<10}  reward MAE {_fmt(m['reward_mae'])}, rank correlation {_fmt(m['rank_correlation'])}, "
            f"pairwise accuracy {_fmt(m['pairwise_accuracy'])}"
        )
    per = report.get("seconds_per_solution", {})
    if per:
        lines.append(
            "cost per solution: "
            + ", ".join(f"{name} {_fmt(value, 2)} s" for name, value in per.items())
            + " (wall, graded concurrently)"
        )
    confusion = report.get("status_confusion", {})
    if confusion:
        lines.append("status confusion (real -> predicted: count):")
        for real, row in sorted(confusion.items()):
            lines.append(f"  {real:<19} " + ", ".join(f"{p} {c}" for p, c in sorted(row.items())))
    return "\n".join(lines)


def plot_calibration(report: dict[str, Any], path: str | os.PathLike) -> Path:
    """World-model score vs real reward (fit half and report half) with the fitted isotonic map."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = report["rows"]
    cal = report["calibration"]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for index, marker, label in (
        (cal["fit_index"], "o", "fit half"),
        (cal["report_index"], "^", "report half"),
    ):
        xs = [rows[i]["wm_score"] for i in index]
        ys = [rows[i]["real_reward"] for i in index]
        jitter = np.random.default_rng(0).normal(0, 0.006, len(ys))  # equal rewards would hide each other
        ax.scatter(xs, np.asarray(ys) + jitter, marker=marker, s=22, alpha=0.6, label=f"{label} ({len(xs)})")
    if cal.get("map"):
        ax.plot(cal["map"]["x"], cal["map"]["y"], color="C3", label="isotonic map (fit half)")
    ax.plot([0, 1], [0, 1], ls=":", color="grey", label="y = x")
    ax.set_xlabel("world-model score (expected reward)")
    ax.set_ylabel("real reward (sandbox)")
    ax.set_title(f"World-model fidelity: {report['world_model']['scoring']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
