"""The vLLM backend's seam, tested with a fake of vLLM's public interface.

vLLM cannot be installed here (CUDA-only wheel that pins another torch; see
docs/autoresearch-agent.md), so these tests replace only the ``vllm`` module with an object
implementing the parts of its interface the backend uses (``LLM.generate``, ``LLM.get_tokenizer``,
``SamplingParams``, ``RequestOutput.outputs[i].{index,text,token_ids,logprobs,finish_reason}``,
``Logprob.logprob``). The tokenizer and chat template are real.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from wmrl.autoresearch.llm.backend import SamplingConfig

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


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.instances.clear()
    return module


def test_complete_maps_vllm_outputs(fake_vllm, tmp_path):
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.llm.vllm_backend import VLLMBackend

    folder = save_tiny_model(tmp_path / "m")
    backend = VLLMBackend(str(folder), gpu_memory_utilization=0.5)
    llm = FakeLLM.instances[-1]
    assert llm.model == str(folder) and llm.kwargs == {"gpu_memory_utilization": 0.5}
    prompts = [
        [{"role": "user", "content": "a"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}],
    ]
    rows = backend.complete(
        prompts,
        SamplingConfig(n=2, temperature=0.3, top_p=0.8, max_new_tokens=7, seed=4, logprobs=True),
        "PRE",
    )
    sent, params, use_tqdm = llm.calls[-1]
    assert use_tqdm is False
    assert params == FakeSamplingParams(n=2, temperature=0.3, top_p=0.8, max_tokens=7, seed=4, logprobs=0)
    # Prompts go as token ids of the rendered chat template + prefix, with no extra special tokens.
    tok = llm.tokenizer
    for conversation, request in zip(prompts, sent, strict=True):
        text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True) + "PRE"
        assert request == {"prompt_token_ids": tok(text, add_special_tokens=False)["input_ids"]}
    assert [[c.text for c in row] for row in rows] == [["p0s0", "p0s1"], ["p1s0", "p1s1"]]
    assert rows[1][1].token_ids == (11, 21) and rows[1][1].token_logprobs == (-0.5, -1.0)
    assert rows[0][0].finish_reason == "stop"
    plain = backend.complete(prompts[:1], SamplingConfig(n=1))
    assert plain[0][0].token_logprobs is None and llm.calls[-1][1].logprobs is None


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
