"""The fake vLLM's ``vllm.sampling_params`` (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm import SamplingParams

__all__ = ["SamplingParams", "StructuredOutputsParams"]


@dataclass
class StructuredOutputsParams:
    regex: str | None = None
    json: Any = None
