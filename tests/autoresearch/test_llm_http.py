"""The OpenAI-compatible HTTP client against a REAL local server (this package's, serving a tiny model)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from wmrl.autoresearch.llm.backend import BackendError, SamplingConfig

pytestmark = pytest.mark.transformers

PROMPTS = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "write a script"}]]


@pytest.fixture(scope="module")
def backend():
    from wmrl.autoresearch.llm.hf import TransformersBackend
    from wmrl.autoresearch.llm.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=5)
    return TransformersBackend(model, tokenizer, model_id="tiny-http")


@pytest.fixture(scope="module")
def server(backend):
    from wmrl.autoresearch.llm.server import OpenAICompatServer

    with OpenAICompatServer(backend) as srv:
        yield srv


def _post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_models_endpoint_and_wire_format(server):
    with urllib.request.urlopen(server.url + "/models", timeout=10) as reply:
        listing = json.loads(reply.read())
    assert listing["object"] == "list" and listing["data"][0]["id"] == "tiny-http"
    status, body = _post(
        server.url + "/chat/completions",
        {"model": "tiny-http", "messages": PROMPTS[0], "n": 2, "max_tokens": 4, "seed": 1, "logprobs": True},
    )
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == "tiny-http"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] in ("stop", "length")
        assert all(isinstance(t["logprob"], float) for t in choice["logprobs"]["content"])


def test_client_matches_the_backend_it_serves(server, backend):
    from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend

    client = OpenAIChatBackend(server.url)
    assert client.model == "tiny-http"
    sampling = SamplingConfig(n=3, max_new_tokens=5, seed=11, temperature=1.0, logprobs=True)
    remote = client.complete(PROMPTS, sampling, assistant_prefix='{"status": "')
    assert [len(r) for r in remote] == [3, 3]
    # One request per prompt with the same seed: each equals a direct one-prompt call.
    for conversation, row in zip(PROMPTS, remote, strict=True):
        local = backend.complete([conversation], sampling, assistant_prefix='{"status": "')[0]
        assert [c.text for c in row] == [c.text for c in local]
        for r, c in zip(row, local, strict=True):
            assert r.token_logprobs == pytest.approx(c.token_logprobs, abs=1e-6)
    assert client.generate(PROMPTS, n=1, max_new_tokens=3) == [
        [backend.generate([p], n=1, max_new_tokens=3)[0][0]] for p in PROMPTS
    ]


def test_bad_requests_fail_fast_with_the_servers_reason(server):
    from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend

    before = server.requests_served
    with pytest.raises(BackendError, match="does not exist"):
        OpenAIChatBackend(server.url, model="other-model", max_retries=3).generate(
            PROMPTS[:1], max_new_tokens=2
        )
    status, body = _post(server.url + "/chat/completions", {"messages": PROMPTS[0], "n": 0})
    assert status == 400 and "n must be" in body["error"]["message"]
    status, body = _post(server.url + "/chat/completions", {"messages": PROMPTS[0], "stream": True})
    assert status == 400 and "stream" in body["error"]["message"]
    status, body = _post(server.url + "/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})
    assert status == 400 and "role" in body["error"]["message"]
    status, body = _post(
        server.url + "/chat/completions",
        {"messages": PROMPTS[0], "continue_final_message": True, "add_generation_prompt": False},
    )
    assert status == 400 and "assistant" in body["error"]["message"]
    assert server.requests_served == before  # none of them generated anything


class _FlakyBackend:
    """Serves a real backend but fails the first ``fail`` calls (or any prompt containing 'POISON')."""

    def __init__(self, inner, fail):
        self.inner, self.fail, self.calls = inner, fail, 0
        self.model_id = inner.model_id

    def complete(self, prompts, sampling, assistant_prefix=None):
        self.calls += 1
        if self.calls <= self.fail or "POISON" in prompts[0][-1]["content"]:
            raise BackendError("simulated overload")
        return self.inner.complete(prompts, sampling, assistant_prefix)


def test_retries_on_server_errors_then_succeeds(backend):
    from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend
    from wmrl.autoresearch.llm.server import OpenAICompatServer

    flaky = _FlakyBackend(backend, fail=2)
    with OpenAICompatServer(flaky) as srv:
        client = OpenAIChatBackend(srv.url, max_retries=2, backoff_s=0.01)
        out = client.generate(PROMPTS[:1], n=1, max_new_tokens=3)
    assert len(out) == 1 and flaky.calls == 3


def test_partial_failure_keeps_the_prompts_that_worked(backend):
    from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend
    from wmrl.autoresearch.llm.server import OpenAICompatServer

    with OpenAICompatServer(_FlakyBackend(backend, fail=0)) as srv:
        client = OpenAIChatBackend(srv.url, max_retries=1, backoff_s=0.01)
        prompts = [PROMPTS[0], [{"role": "user", "content": "POISON"}]]
        with pytest.raises(BackendError) as err:
            client.complete(prompts, SamplingConfig(n=2, max_new_tokens=3))
    partial = err.value.partial
    assert partial is not None and len(partial) == 2
    assert partial[1] is None and len(partial[0]) == 2
    assert "1 of 2 requests failed" in str(err.value) and "HTTP 500" in str(err.value)


def test_unreachable_server_is_a_backend_error(unused_port):
    from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend

    port = unused_port()  # nobody listens on it
    with pytest.raises(BackendError, match="failed after 2 tries"):
        OpenAIChatBackend(f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.01, timeout_s=5)
    with pytest.raises(ValueError, match="http"):
        OpenAIChatBackend("localhost:8000")
