"""What a policy was trained to write: ``script`` (whole scripts) or ``model`` (the model block of
the fixed pipeline, :mod:`.model_slot`), read from what its run recorded.

Training refuses a policy warm-started for the other action (its replies would not fit the prompt),
and evaluation asks a policy for what it was trained to write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["trained_action_of"]


def trained_action_of(model: str | os.PathLike) -> tuple[str, str]:
    """What the policy was trained to write (``script`` or ``model``), and where that answer came from:
    an embedded warm start's own action, else the run's ``config.json`` next to (or above) the model
    folder (``tasks.action`` of a GRPO run, ``corpus.action`` of a warm start), else ``script``."""
    from wmrl.autoresearch.training.warm_specs import WARM_SPECS

    if str(model) in WARM_SPECS:
        return WARM_SPECS[str(model)], str(model)
    path = Path(model)
    for folder in (path, path.parent, path.parent.parent):
        config = folder / "config.json"
        if not (path.exists() and config.is_file()):
            continue
        try:
            data = json.loads(config.read_text())
        except json.JSONDecodeError:
            continue
        section = (
            data.get("tasks") if isinstance(data, dict) and isinstance(data.get("tasks"), dict) else None
        )
        if section is None and isinstance(data, dict) and isinstance(data.get("corpus"), dict):
            section = data["corpus"]
        if section is not None:
            return str(section.get("action") or "script"), str(config)
    return "script", "the default"
