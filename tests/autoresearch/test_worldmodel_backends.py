"""The world model's backends at scale: several OpenAI-compatible servers, and vLLM's offline engine.

Servers: this package's real OpenAI-compatible server (``llm/server.py``) over tiny models, two of
them plus one address nobody listens on; prompts spread over the live ones, a server stopped
mid-run is failed over, and with every server down the world model's grade is unknown, never 0.

vLLM: the offline engine and real ``vllm serve`` processes run (vLLM's CPU build in
``.venv-vllm``) in ``test_vllm_engine_real.py`` and ``test_vllm_serve_real.py``; here, the
settings that choose the worker and their refusals.
"""

from __future__ import annotations

from pathlib import Path

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


def test_a_vllm_worker_is_configured_or_refused(tmp_path):
    from wmrl.autoresearch.llm.vllm_worker import VLLMWorkerBackend, WorkerError
    from wmrl.autoresearch.worldmodel.model import BackendConfig

    assert BackendConfig(kind="vllm", python="/opt/vllm/bin/python").python == "/opt/vllm/bin/python"
    with pytest.raises(ValueError, match="for kind=vllm"):
        BackendConfig(kind="transformers", python="/opt/vllm/bin/python")
    with pytest.raises(ValueError, match="python must be null"):
        BackendConfig(kind="vllm", python=" ")
    with pytest.raises(WorkerError, match="no interpreter"):
        VLLMWorkerBackend(str(tmp_path), python=str(tmp_path / "missing" / "python"))
