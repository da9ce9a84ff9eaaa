"""``wmrl bench cost RUN --against REAL_RUN``: what a run cost, measured, against a measured real run.

A run's ``cost_report.json`` estimates what real-execution GRPO would have cost (every graded rollout
at the run's mean anchor cost per item): a **model**. Where a real run of the same work exists (``mode=real``,
same steps), this compares the two runs' own measurements: their wall time (``run_summary.json``: every
attempt of a resumed run), the seconds and accelerator-seconds each stream spent, the executions, and
the ratios ``real / run``. The streams' seconds overlap (the world model scores while the sandbox
executes; asynchronous anchors run beside the next steps), so their sum is compute, not wall time;
only ``wall_s`` is the time the run took. Runs of different lengths are compared per step, and say so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["compare_costs", "format_comparison"]


def _run(folder: Path) -> dict[str, Any]:
    cost_file, summary_file = folder / "cost_report.json", folder / "run_summary.json"
    if not cost_file.is_file():
        raise FileNotFoundError(f"{folder} has no cost_report.json: it is not a finished WMRL run")
    cost = json.loads(cost_file.read_text())
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    wall = summary.get("wall_s_total", summary.get("wall_s"))
    return {
        "path": str(folder),
        "mode": cost.get("mode"),
        "steps": cost.get("steps"),
        "wall_s": None if wall is None else float(wall),
        "streams": {name: dict(c) for name, c in cost.get("spent", {}).items()},
        "compute_wall_s": cost.get("total", {}).get("wall_s"),
        "accel_s": cost.get("total", {}).get("accel_s"),
        "executions": cost.get("spent", {}).get("anchor", {}).get("items"),
        "modelled_real_wall_s": (cost.get("real_mode_estimate") or {}).get("wall_s"),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare_costs(run: str | Path, against: str | Path) -> dict[str, Any]:
    """Both runs' measured costs and the ratios ``against / run`` (per step when their steps differ).

    Raises:
        FileNotFoundError: a folder is not a finished run.
        ValueError: ``against`` is not a ``real``-mode run.
    """
    this, real = _run(Path(run)), _run(Path(against))
    if real["mode"] != "real":
        raise ValueError(f"{against} ran mode {real['mode']!r}: compare against a mode=real run")
    per_step = this["steps"] != real["steps"]

    def scaled(entry: dict[str, Any], key: str) -> float | None:
        value = entry[key]
        if value is None:
            return None
        if not per_step:
            return float(value)
        return float(value) / entry["steps"] if entry["steps"] else None

    return {
        "run": this,
        "real": real,
        "per_step": per_step,
        "measured": {
            "wall_ratio": _ratio(scaled(real, "wall_s"), scaled(this, "wall_s")),
            "compute_ratio": _ratio(scaled(real, "compute_wall_s"), scaled(this, "compute_wall_s")),
            "accel_ratio": _ratio(scaled(real, "accel_s"), scaled(this, "accel_s")),
            "execution_ratio": _ratio(scaled(real, "executions"), scaled(this, "executions")),
        },
        "modelled": {
            "real_wall_s": this["modelled_real_wall_s"],
            "note": "the run's own estimate of real-execution GRPO (a model, not a measurement)",
        },
    }


def format_comparison(result: dict[str, Any]) -> str:
    """The comparison as text, measured figures first and the model labelled as one."""
    this, real, measured = result["run"], result["real"], result["measured"]
    unit = " per step" if result["per_step"] else ""

    def cell(value: float | None, fmt: str = "{:.1f}") -> str:
        return "unknown" if value is None else fmt.format(value)

    lines = [f"measured costs{unit} ({this['steps']} steps against {real['steps']}):"]
    lines.append(f"{'':<18} {'this run':>12} {'real run':>12}")
    lines.append(f"{'wall s (the run)':<18} {cell(this['wall_s']):>12} {cell(real['wall_s']):>12}")
    for name in sorted(set(this["streams"]) | set(real["streams"])):
        a = this["streams"].get(name, {}).get("wall_s")
        b = real["streams"].get(name, {}).get("wall_s")
        lines.append(f"{'  ' + name + ' s':<18} {cell(a):>12} {cell(b):>12}")
    lines.append(
        f"{'executions':<18} {cell(this['executions'], '{:.0f}'):>12} {cell(real['executions'], '{:.0f}'):>12}"
    )
    lines.append(
        f"real / this run, measured: wall {cell(measured['wall_ratio'], '{:.2f}x')}, stream seconds summed "
        f"{cell(measured['compute_ratio'], '{:.2f}x')}, accelerator-seconds {cell(measured['accel_ratio'], '{:.2f}x')}, "
        f"executions {cell(measured['execution_ratio'], '{:.2f}x')}"
    )
    modelled = result["modelled"]["real_wall_s"]
    if modelled is not None:
        lines.append(
            f"(the run's own estimate of a real run, {modelled:.1f} compute s, is a model, not a measurement)"
        )
    return "\n".join(lines)
