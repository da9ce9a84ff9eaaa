"""The world model's backends at scale: several OpenAI-compatible servers, and vLLM's offline engine.

Servers: this package's real OpenAI-compatible server (``llm/server.py``) over tiny models, two of
them plus one address nobody listens on; prompts spread over the live ones, a server stopped
mid-run is failed over, and with every server down the world model's grade is unknown, never 0.

vLLM: its wheel is CUDA-only, so ``status_probs`` scoring through ``VLLMBackend`` runs against the
fake of vLLM's interface in ``tests/fakes/vllm`` (which computes ``prompt_logprobs`` with the same
transformers model): the numbers must equal the transformers backend's on the same prompts. On a
GPU, ``benchmarks/gpu_check.py`` compares real vLLM with the transformers backend.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.transformers]

FAKES = Path(__file__).resolve().parents[1] / "fakes"
PROMPTS = [[{"role": "user", "content": f"write script {k}"}] for k in range(8)]


@pytest.fixture(scope="module")
def tiny():
    from wmrl.autoresearch.llm.hf import TransformersBackend
    from wmrl.autoresearch.llm.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=3)
    return TransformersBackend(model, tokenizer, model_id="tiny-wm")


def test_prompts_spread_over_servers_and_fail_over(tiny, unused_port):
    from wmrl.autoresearch.llm.backend import SamplingConfig
    from wmrl.autoresearch.llm.endpoints import EndpointPool
    from wmrl.autoresearch.llm.server import OpenAICompatServer

    dead = f"http://127.0.0.1:{unused_port()}/v1"
    one, two = OpenAICompatServer(tiny).start(), OpenAICompatServer(tiny).start()
    try:
        pool = EndpointPool([one.url, two.url, dead], timeout_s=30, max_retries=0, backoff_s=0.0)
        sampling = SamplingConfig(n=1, max_new_tokens=4, seed=0)
        rows = pool.complete(PROMPTS, sampling)
        assert len(rows) == len(PROMPTS) and all(len(r) == 1 for r in rows)
        served = dict(zip(pool.base_urls, pool.served, strict=True))
        assert served[one.url] > 0 and served[two.url] > 0  # the load went to both live servers
        assert sum(served.values()) == len(PROMPTS)  # the dead one answered nothing
        one.stop()  # a server lost mid-run: its prompts go to the other
        again = pool.complete(PROMPTS, sampling)
        assert all(r is not None for r in again)
        assert pool.failures[pool.base_urls.index(one.url)] + pool.failures[2] >= 1
    finally:
        two.stop()
    with pytest.raises(Exception) as caught:  # every server down: no completions, reason given
        pool.complete(PROMPTS[:2], sampling)
    assert getattr(caught.value, "partial", None) == [None, None]


def test_a_world_model_on_dead_servers_grades_unknown_not_zero(tiny, unused_port):
    from wmrl.autoresearch.llm.endpoints import EndpointPool
    from wmrl.autoresearch.llm.server import OpenAICompatServer
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    server = OpenAICompatServer(tiny).start()
    pool = EndpointPool([server.url], timeout_s=30, max_retries=0, backoff_s=0.0)
    server.stop()
    wm = WorldModel(pool, WorldModelConfig(scoring="samples", samples=2), overview_fn=lambda task: "a task")
    grades = wm.grade([("t", "print(1)"), ("t", "import os")])
    assert [g.value for g in grades] == [None, None]
    assert all("backend error" in g.info["reason"] for g in grades)


def test_the_training_config_selects_the_servers(tiny, tmp_path):
    from wmrl.autoresearch.llm.endpoints import EndpointPool
    from wmrl.autoresearch.llm.server import OpenAICompatServer
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.training.builders import world_model_backend
    from wmrl.autoresearch.worldmodel.model import BackendConfig

    with OpenAICompatServer(tiny) as server:
        settings = BackendConfig(kind="openai", endpoints=(server.url,), timeout_s=30)
        folder = save_tiny_model(tmp_path / "tok")
        backend, tokenizer = world_model_backend(settings, str(folder), "float32", "cpu")
        assert isinstance(backend, EndpointPool) and backend.base_urls == [server.url]
        assert tokenizer.chat_template
    with pytest.raises(ValueError, match="needs endpoints"):
        BackendConfig(kind="openai")
    with pytest.raises(ValueError, match="for kind=openai"):
        BackendConfig(kind="vllm", endpoints=("http://x:1/v1",))


@pytest.fixture
def fake_vllm(monkeypatch):
    """The fake of vLLM's interface (tests/fakes/vllm) as ``vllm`` for this test only."""
    spec = importlib.util.spec_from_file_location(
        "vllm", FAKES / "vllm" / "__init__.py", submodule_search_locations=[str(FAKES / "vllm")]
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "vllm", module)
    spec.loader.exec_module(module)
    return module


def test_status_probs_from_vllm_prompt_logprobs_equal_the_transformers_numbers(fake_vllm, tmp_path):
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.llm.vllm_backend import VLLMBackend
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig
    from wmrl.autoresearch.worldmodel.prompts import ASSISTANT_PREFIX

    folder = save_tiny_model(tmp_path / "wm")
    loaded = load_model(folder)
    hf = TransformersBackend(loaded.model, loaded.tokenizer, model_id="tiny")
    vllm_backend = VLLMBackend(str(folder), model_id="tiny")
    conversation = [{"role": "user", "content": "predict the outcome"}]
    candidates = ['valid"', 'runtime_error"', ['valid", "position":', " 0.5,"]]
    a = hf.score_continuations(conversation, ASSISTANT_PREFIX, candidates)
    b = vllm_backend.score_continuations(conversation, ASSISTANT_PREFIX, candidates)
    assert np.allclose(a, b, atol=1e-4), (a, b)
    # the same expected rewards through the world model (status_probs scoring) on both backends
    config = WorldModelConfig(scoring="status_probs", worked_example=False, overview_tokens=300)
    items = [("t", "import pandas as pd\nprint(pd.__version__)\n"), ("t", "x = 1\nprint(x)\n")]
    grades = [
        WorldModel(backend, config, overview_fn=lambda task: "a toy task", cache=False).grade(items)
        for backend in (hf, vllm_backend)
    ]
    assert [g.value for g in grades[0]] == pytest.approx([g.value for g in grades[1]], abs=1e-4)
    assert all(g.value is not None for g in grades[1])
