"""The completions table: what every rollout of a step was and how each stream graded it.

The first thing a user looks at when the reward stays at 0: one row per rollout with the world
model's score raw and calibrated, the real result (anchor groups), the reward the update used and
the advantage, side by side with what the rollout was (the prompt and completion of a text agent;
a domain adds its own columns). Written to ``RUN/completions.jsonl`` (``logging.completions``), one
JSON object per row, and sampled to the console by :func:`format_sample`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["COLUMNS", "CompletionsTable", "completion_rows", "format_sample"]

#: The columns every row has (a domain's extra columns follow).
COLUMNS = (
    "step",
    "group",
    "rollout",
    "task",
    "stream",
    "wm",
    "wm_calibrated",
    "real",
    "reward",
    "advantage",
    "status",
)


def _value(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def _stream(correction: Any, g: int, i: int) -> str:
    """Which stream graded rollout ``i`` of group ``g``: ``memory`` (a solution executed before),
    ``anchor`` (real execution this step) or ``world_model``."""
    memory = getattr(correction, "from_memory", None)
    if memory is not None and bool(memory[g, i]):
        return "memory"
    executed = getattr(correction, "executed", None)
    if bool(correction.anchor[g]) or (executed is not None and bool(executed[g, i])):
        return "anchor"
    return "world_model"


def completion_rows(
    step: int,
    group_keys: Sequence[str],
    task_keys: Sequence[str | None] | None,
    correction: Any,
    wm: npt.NDArray[Any],
    real: npt.NDArray[Any],
    statuses: Sequence[str | None] | None = None,
    extra: Mapping[str, Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """One row per rollout of a step, group-major.

    Args:
        step: the training step.
        group_keys / task_keys: per group.
        correction: the step's :class:`~wmrl.core.corrector.Correction`.
        wm / real: ``(n_groups, G)`` raw world-model and real scores (NaN = none).
        statuses: per rollout (flat, group-major) the outcome label of the stream that trained it.
        extra: more columns, each a flat group-major sequence (``prompt``, ``completion``...).
    """
    n_groups, width = wm.shape
    calibrated = correction.calibrated if correction.calibrated is not None else np.full_like(wm, np.nan)
    rows = []
    for g in range(n_groups):
        for i in range(width):
            flat = g * width + i
            row = {
                "step": int(step),
                "group": str(group_keys[g]),
                "rollout": i,
                # a group without a task is null, also in a batch where other groups have one
                "task": None if task_keys is None or task_keys[g] is None else str(task_keys[g]),
                "stream": _stream(correction, g, i),
                "wm": _value(wm[g, i]),
                "wm_calibrated": _value(calibrated[g, i]),
                "real": _value(real[g, i]),
                "reward": _value(correction.rewards[g, i]),
                "advantage": _value(correction.advantages[g, i]),
                "status": None if statuses is None else statuses[flat],
            }
            for column, values in (extra or {}).items():
                row[column] = values[flat]
            rows.append(row)
    return rows


class CompletionsTable:
    """Appends rows to ``RUN/completions.jsonl`` (a resumed run continues it)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "completions.jsonl"

    def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
        with self.path.open("a") as fh:
            for row in rows:
                fh.write(json.dumps(row, default=str) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def drop_from(self, step: int) -> None:
        """Forget rows of steps >= ``step`` (they are redone after a resume)."""
        kept = [r for r in self.read() if r["step"] < step]
        self.path.write_text("".join(json.dumps(r, default=str) + "\n" for r in kept))


def _cell(value: Any, width: int) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, float):
        text = f"{value:.3f}"
    else:
        text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def format_sample(rows: Sequence[Mapping[str, Any]], n: int, text_columns: Sequence[str] = ()) -> str:
    """The first ``n`` rows as a fixed-width text table (long text cut), for the console."""
    shown = list(rows[:n])
    if not shown:
        return ""
    columns = [c for c in COLUMNS if c not in ("step", "rollout", "task")] + list(text_columns)
    widths = {c: (40 if c in text_columns else 14) for c in columns}
    header = "  ".join(f"{c:<{widths[c]}}" for c in columns)
    lines = [header]
    for row in shown:
        lines.append("  ".join(f"{_cell(row.get(c), widths[c]):<{widths[c]}}" for c in columns))
    return "\n".join(lines)
