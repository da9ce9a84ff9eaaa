"""Several OpenAI-compatible servers as one generation backend: load spread and fail-over.

The paper served the world model from one vLLM server per GPU. :class:`EndpointPool` holds one
:class:`~wmrl.autoresearch.llm.openai_client.OpenAIChatBackend` per server (each with its timeout,
retries and concurrency) and sends every prompt of a batch to the server with the fewest requests
in flight, so a slow or busy server gets less. A prompt whose server fails after its own retries
is tried on the next server that has not failed it; when every server has failed it, the prompt
has no completions (``BackendError.partial`` holds ``None`` for it) and the world model grades it
unknown, never 0. A server that fails is not given new prompts for ``cooldown_s`` seconds while
another one is healthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from wmrl.autoresearch.llm.backend import (
    BackendBase,
    BackendError,
    Completion,
    Conversation,
    SamplingConfig,
    validate_conversations,
)
from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend, complete_concurrently

__all__ = ["EndpointPool"]


class EndpointPool(BackendBase):
    """A :class:`~wmrl.autoresearch.llm.backend.GenerationBackend` over several servers.

    Args:
        base_urls: the servers' API roots (``http://host:port/v1``), at least one.
        model: the served model name (``None``: the first server's first model; every server
            must serve it).
        timeout_s / max_retries / concurrency / backoff_s / api_key: per server, as
            :class:`~wmrl.autoresearch.llm.openai_client.OpenAIChatBackend`.
        cooldown_s: seconds a failed server gets no new prompts while another is healthy.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str | None = None,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        concurrency: int = 16,
        backoff_s: float = 0.5,
        cooldown_s: float = 30.0,
    ) -> None:
        urls = list(dict.fromkeys(base_urls))
        if not urls:
            raise ValueError("EndpointPool needs at least one server URL")
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0; got {cooldown_s!r}")
        self.servers: list[OpenAIChatBackend] = []
        errors = []
        for url in urls:  # a server that is down at start still joins: it may come back
            try:
                self.servers.append(
                    OpenAIChatBackend(url, model, api_key, timeout_s, max_retries, concurrency, backoff_s)
                )
                model = model or self.servers[-1].model
            except BackendError as err:
                errors.append((url, err))
        if not self.servers:
            raise BackendError(f"none of {len(urls)} world-model servers answered; first: {errors[0][1]}")
        for url, _ in errors:  # joined without asking for its models: it uses the others' model name
            self.servers.append(
                _Late(
                    url,
                    model or self.servers[0].model,
                    api_key,
                    timeout_s,
                    max_retries,
                    concurrency,
                    backoff_s,
                )
            )
        self.model = model or self.servers[0].model
        self.model_id = self.model
        self.concurrency = concurrency * len(self.servers)
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._in_flight = [0] * len(self.servers)
        self._failed_at = [float("-inf")] * len(self.servers)
        for s in self.servers:
            s.model = self.model
        #: requests each server answered (for logs and the tests of the spread)
        self.served = [0] * len(self.servers)
        #: requests each server failed after its own retries
        self.failures = [0] * len(self.servers)

    @property
    def base_urls(self) -> list[str]:
        return [s.base_url for s in self.servers]

    def _pick(self, excluded: set[int]) -> int | None:
        now = time.monotonic()
        with self._lock:
            candidates = [i for i in range(len(self.servers)) if i not in excluded]
            if not candidates:
                return None
            healthy = [i for i in candidates if now - self._failed_at[i] >= self.cooldown_s]
            i = min(healthy or candidates, key=lambda k: (self._in_flight[k], k))
            self._in_flight[i] += 1
            return i

    def _one(self, messages, sampling: SamplingConfig, prefix: str | None) -> list[Completion]:
        tried: set[int] = set()
        errors: list[str] = []
        while True:
            i = self._pick(tried)
            if i is None:
                raise BackendError(f"every world-model server failed this prompt: {'; '.join(errors)}")
            try:
                out = self.servers[i]._one(messages, sampling, prefix)
                with self._lock:
                    self.served[i] += 1
                return out
            except BackendError as err:
                with self._lock:
                    self.failures[i] += 1
                    self._failed_at[i] = time.monotonic()
                tried.add(i)
                errors.append(f"{self.servers[i].base_url}: {err}")
            finally:
                with self._lock:
                    self._in_flight[i] -= 1

    def complete(
        self,
        prompts: Sequence[Conversation],
        sampling: SamplingConfig,
        assistant_prefix: str | None = None,
    ) -> list[list[Completion]]:
        return complete_concurrently(
            lambda c: self._one(c, sampling, assistant_prefix),
            validate_conversations(prompts),
            self.concurrency,
        )


class _Late(OpenAIChatBackend):
    """A server that did not answer at start: the same client, without the start-up model query."""

    def __init__(self, base_url, model, api_key, timeout_s, max_retries, concurrency, backoff_s) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self.model = model
        self.model_id = model
