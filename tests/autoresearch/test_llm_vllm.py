"""The vLLM backend's two seams that need no engine: an existing ``vllm.LLM``-like object is reused
without importing vllm, and a missing vllm says what to do.

The engine itself runs for real (vLLM's CPU build in ``.venv-vllm``) in
``test_vllm_engine_real.py``: request mapping, sampled log-probs, seeds and candidate scoring.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

pytestmark = pytest.mark.transformers


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = 16
    seed: int | None = None
    logprobs: int | None = None


@dataclass
class FakeLogprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FakeCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str | None = "length"


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletionOutput] = field(default_factory=list)


class FakeLLM:
    """Records what it is given; answers deterministically (outputs reversed to test re-ordering)."""

    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, model=None, **kwargs):
        from wmrl.autoresearch.llm.tiny import build_tiny_tokenizer

        self.model, self.kwargs = model, kwargs
        self.tokenizer = build_tiny_tokenizer()
        self.calls = []
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params, use_tqdm))
        out = []
        for r, prompt in enumerate(prompts):
            completions = []
            for i in range(sampling_params.n):
                ids = [10 + i, 20 + r]
                lp = (
                    [{t: FakeLogprob(-0.5 * (k + 1))} for k, t in enumerate(ids)]
                    if sampling_params.logprobs is not None
                    else None
                )
                completions.append(FakeCompletionOutput(i, f"p{r}s{i}", ids, None, lp, "stop"))
            out.append(FakeRequestOutput(str(r), prompt["prompt_token_ids"], list(reversed(completions))))
        return out


def test_an_existing_llm_object_is_reused_without_importing_vllm(monkeypatch):
    from wmrl.autoresearch.llm.vllm_backend import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)  # importing vllm would now fail
    llm = FakeLLM()
    backend = VLLMBackend(llm=llm, sampling_params_cls=FakeSamplingParams, model_id="mine")
    assert backend.model_id == "mine"
    assert backend.generate([[{"role": "user", "content": "x"}]], n=3) == [["p0s0", "p0s1", "p0s2"]]


def test_missing_vllm_says_what_to_do(monkeypatch):
    from wmrl.autoresearch.llm.vllm_backend import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="pip install vllm"):
        VLLMBackend("smollm2")
    with pytest.raises(ValueError, match="model spec or an existing llm"):
        VLLMBackend()


def test_status_scoring_by_token_ids_is_asked_for_only_where_sampling_params_has_it(monkeypatch):
    from wmrl.autoresearch.llm.vllm_backend import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)
    # a SamplingParams without logprob_token_ids: candidates are read from prompt_logprobs
    assert not VLLMBackend(llm=FakeLLM(), sampling_params_cls=FakeSamplingParams).token_logprobs
    with pytest.raises(ValueError, match="logprob_token_ids"):
        VLLMBackend(llm=FakeLLM(), sampling_params_cls=FakeSamplingParams, token_logprobs=True)

    class WithTokenIds(FakeSamplingParams):
        __struct_fields__ = ("n", "logprob_token_ids")  # how vLLM's msgspec struct declares its fields

    assert VLLMBackend(llm=FakeLLM(), sampling_params_cls=WithTokenIds).token_logprobs
    assert not VLLMBackend(
        llm=FakeLLM(), sampling_params_cls=WithTokenIds, token_logprobs=False
    ).token_logprobs
