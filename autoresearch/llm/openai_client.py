"""A client for OpenAI-compatible chat-completions servers (``vllm serve``, this package's server).

Over ``requests`` (one pooled session; urllib3's ``Retry`` does the retrying). One HTTP request per
prompt, ``n`` samples per request, requests sent concurrently (the server batches them: vLLM
continuously, ours one at a time). An assistant prefix is sent the vLLM way: a final assistant
message plus ``continue_final_message=true`` and ``add_generation_prompt=false``.

Failures: connection errors, read timeouts, HTTP 408, 429 and 5xx are retried with exponential
backoff; other HTTP errors (a bad request, an unknown model) fail at once. After the last try a
:class:`~wmrl.autoresearch.llm.backend.BackendError` is raised whose ``partial`` holds the prompts
that did succeed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from wmrl.autoresearch.llm.backend import (
    BackendBase,
    BackendError,
    Completion,
    Conversation,
    SamplingConfig,
    validate_conversations,
)
from wmrl.core.http import RETRYABLE_STATUS, retrying_session

__all__ = ["OpenAIChatBackend"]


class OpenAIChatBackend(BackendBase):
    """Generation through ``POST {base_url}/chat/completions``.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name (``GET /v1/models`` lists it); ``None`` asks the server.
        api_key: sent as a bearer token when given (vLLM's ``--api-key``).
        timeout_s: seconds to wait for one reply.
        max_retries: extra tries after a retryable failure.
        concurrency: requests in flight at once.
        backoff_s: first retry delay; doubles each try.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        concurrency: int = 16,
        backoff_s: float = 0.5,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1; got {base_url!r}"
            )
        if timeout_s <= 0 or max_retries < 0 or concurrency < 1 or backoff_s < 0:
            raise ValueError(
                "timeout_s > 0, max_retries >= 0, concurrency >= 1 and backoff_s >= 0 are required"
            )
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self._session = retrying_session(max_retries, backoff_s, concurrency)
        self.model = model or self.list_models()[0]
        self.model_id = self.model

    def _with_retries(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request (the session retries what retrying can fix); the reply's JSON.

        Raises:
            BackendError: the server could not be reached, or answered an error or non-JSON.
        """
        import requests

        url = self.base_url + path
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            reply = self._session.request(method, url, json=body, headers=headers, timeout=self.timeout_s)
        except requests.RequestException as err:
            raise BackendError(f"{method} {url} failed after {self.max_retries + 1} tries: {err}") from None
        if reply.status_code >= 400:
            tries = f" after {self.max_retries + 1} tries" if reply.status_code in RETRYABLE_STATUS else ""
            raise BackendError(f"HTTP {reply.status_code} from {url}{tries}: {reply.text[:500]}")
        try:
            return reply.json()
        except ValueError:
            raise BackendError(
                f"the server at {url} replied with non-JSON: {reply.content[:200]!r}"
            ) from None

    def list_models(self) -> list[str]:
        """The model names the server serves (``GET /models``)."""
        reply = self._with_retries("GET", "/models")
        try:
            names = [m["id"] for m in reply["data"]]
        except (KeyError, TypeError):
            raise BackendError(f"unexpected /models reply from {self.base_url}: {str(reply)[:200]}") from None
        if not names:
            raise BackendError(f"the server at {self.base_url} serves no model")
        return names

    def _body(
        self, messages: list[dict[str, str]], sampling: SamplingConfig, prefix: str | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages + ([{"role": "assistant", "content": prefix}] if prefix else []),
            "n": sampling.n,
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "max_tokens": sampling.max_new_tokens,
            "logprobs": sampling.logprobs,
            "stream": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if prefix:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        return body

    def _one(
        self, messages: list[dict[str, str]], sampling: SamplingConfig, prefix: str | None
    ) -> list[Completion]:
        reply = self._with_retries("POST", "/chat/completions", self._body(messages, sampling, prefix))
        try:
            choices = sorted(reply["choices"], key=lambda c: c.get("index", 0))
            out = []
            for choice in choices:
                lp = None
                if sampling.logprobs and choice.get("logprobs"):
                    lp = tuple(float(t["logprob"]) for t in choice["logprobs"]["content"])
                out.append(
                    Completion(
                        text=choice["message"]["content"] or "",
                        token_logprobs=lp,
                        finish_reason=choice.get("finish_reason"),
                    )
                )
        except (KeyError, TypeError, ValueError) as err:
            raise BackendError(
                f"malformed chat-completions reply ({type(err).__name__}: {err}): {str(reply)[:200]}"
            ) from None
        if len(out) != sampling.n:
            raise BackendError(f"asked for n={sampling.n} completions, the server returned {len(out)}")
        return out

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


_Conv = TypeVar("_Conv", bound=Conversation)


def complete_concurrently(
    one: Callable[[_Conv], list[Completion]], conversations: Sequence[_Conv], concurrency: int
) -> list[list[Completion]]:
    """``one`` on every conversation, ``concurrency`` requests at a time, results in prompt order.

    Raises:
        BackendError: if any request failed; its ``partial`` holds the answers that came back
            (``None`` where a request failed), so a caller can keep them.
    """
    results: list[list[Completion] | None] = [None] * len(conversations)
    errors: list[str] = []

    def run(i: int) -> None:
        try:
            results[i] = one(conversations[i])
        except BackendError as err:
            errors.append(f"prompt {i}: {err}")

    with ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(conversations)))) as pool:
        list(pool.map(run, range(len(conversations))))
    if errors:
        raise BackendError(
            f"{len(errors)} of {len(conversations)} requests failed; first: {errors[0]}", partial=results
        )
    return results  # type: ignore[return-value]
