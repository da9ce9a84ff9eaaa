"""The names of the embedded warm starts (data only, so configs can name them without importing the stage)."""

from __future__ import annotations

from typing import Literal

__all__ = ["WARM_SPEC", "WARM_SPECS"]

#: The model spec of the embedded warm start (whole scripts).
WARM_SPEC = "smollm2-warm"
#: Every embedded warm start: its spec and the action its agent examples teach (``corpus.action``).
WARM_SPECS: dict[str, Literal["script", "model"]] = {WARM_SPEC: "script", "smollm2-warm-model": "model"}
