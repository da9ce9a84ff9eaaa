"""A small OpenAI-compatible chat-completions server over any generation backend (stdlib only).

Serves ``GET /v1/models`` and ``POST /v1/chat/completions`` (non-streaming) in the format of the
OpenAI API, with vLLM's extensions ``continue_final_message`` / ``add_generation_prompt`` (continue
a final assistant message) and ``top_k`` accepted. It exists so the HTTP client
(:class:`~wmrl.autoresearch.llm.openai_client.OpenAIChatBackend`) can be used and tested against a
real server on any machine, and so a CPU box can share one loaded model between processes; on
GPUs use ``vllm serve`` instead, which the same client speaks to.

Run it::

    python -m wmrl.autoresearch.llm.server --model smollm2 --port 8000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from wmrl.autoresearch.llm.backend import BackendError, GenerationBackend, SamplingConfig

__all__ = ["OpenAICompatServer", "main"]

_MAX_BODY_BYTES = 16 * 1024 * 1024


class _RequestError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def _number(body: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise _RequestError(400, f"'{key}' must be a {kind.__name__}; got {value!r}")
    return kind(value)


def parse_chat_request(
    body: Any, served_model: str
) -> tuple[list[dict[str, str]], SamplingConfig, str | None]:
    """Translate a chat-completions request body into (messages, sampling, assistant_prefix)."""
    if not isinstance(body, dict):
        raise _RequestError(400, "the request body must be a JSON object")
    if body.get("stream"):
        raise _RequestError(400, "streaming is not supported by this server; send stream=false")
    model = body.get("model")
    if model is not None and model != served_model:
        raise _RequestError(
            404, f"the model `{model}` does not exist; this server serves `{served_model}`", "NotFoundError"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _RequestError(400, "'messages' must be a non-empty list of {role, content} objects")
    clean = []
    for m in messages:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content", ""), str)
        ):
            raise _RequestError(
                400, "each message must be an object with a string 'role' and string 'content'"
            )
        clean.append({"role": m["role"], "content": m.get("content", "")})
    prefix = None
    if body.get("continue_final_message"):
        if clean[-1]["role"] != "assistant":
            raise _RequestError(
                400, "continue_final_message needs the last message to be an assistant message"
            )
        if body.get("add_generation_prompt", True) is not False:
            raise _RequestError(
                400, "continue_final_message requires add_generation_prompt=false (as in vLLM)"
            )
        prefix = clean.pop()["content"]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise _RequestError(400, "'logprobs' must be a boolean")
    try:
        sampling = SamplingConfig(
            n=_number(body, "n", 1, int),
            temperature=_number(body, "temperature", 1.0, float),  # the OpenAI API's default
            top_p=_number(body, "top_p", 1.0, float),
            max_new_tokens=_number({"m": max_tokens}, "m", 256, int),
            seed=_number(body, "seed", None, int),
            logprobs=logprobs,
        )
    except ValueError as err:
        raise _RequestError(400, str(err)) from None
    return clean, sampling, prefix


class OpenAICompatServer:
    """Serve ``backend`` on ``host:port`` (``port=0`` picks a free port) in a background thread.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. ``url`` is the base URL
    (``http://host:port/v1``) to give a client.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str | None = None,
    ):
        self.backend = backend
        self.model_name = model_name or backend.model_id
        self.requests_served = 0
        handler = self._make_handler()
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        # open client connections (HTTP/1.1 keeps them alive): a stopped server closes them, as a
        # killed one would, instead of answering on them after stop()
        self._connections: set[Any] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = cast(tuple[str, int], self._httpd.server_address)[:2]  # an AF_INET server
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAICompatServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="openai-compat-server", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            open_connections = list(self._connections)
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> OpenAICompatServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _chat(self, body: Any) -> dict[str, Any]:
        messages, sampling, prefix = parse_chat_request(body, self.model_name)
        try:
            rows = self.backend.complete([messages], sampling, assistant_prefix=prefix)
        except (ValueError, TypeError) as err:  # the backend rejected the conversation itself
            raise _RequestError(400, str(err)) from None
        except BackendError as err:
            raise _RequestError(500, f"generation failed: {err}", "InternalServerError") from None
        choices = []
        for i, completion in enumerate(rows[0]):
            choice: dict[str, Any] = {
                "index": i,
                "message": {"role": "assistant", "content": completion.text},
                "finish_reason": completion.finish_reason or "stop",
                "logprobs": None,
            }
            if sampling.logprobs and completion.token_logprobs is not None:
                # Token strings are not tracked per position; the log-prob values are what clients use.
                choice["logprobs"] = {
                    "content": [{"token": "", "logprob": lp} for lp in completion.token_logprobs]
                }
            choices.append(choice)
        generated = sum(len(c.token_logprobs or ()) for c in rows[0])
        self.requests_served += 1
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {"completion_tokens": generated} if sampling.logprobs else {},
        }

    def _make_handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)

            def finish(self) -> None:
                with server._lock:
                    server._connections.discard(self.connection)
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:  # quiet by default
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, kind: str) -> None:
                self._send(status, {"error": {"message": message, "type": kind, "code": status}})

            def do_GET(self) -> None:
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": server.model_name, "object": "model", "owned_by": "wmrl"}],
                        },
                    )
                elif self.path.rstrip("/") in ("/health", "/v1/health"):
                    self._send(200, {"status": "ok", "requests_served": server.requests_served})
                else:
                    self._error(404, f"no route {self.path}", "NotFoundError")

            def do_POST(self) -> None:
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._error(404, f"no route {self.path}", "NotFoundError")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length <= 0 or length > _MAX_BODY_BYTES:
                    self._error(
                        400,
                        f"the request needs a JSON body of at most {_MAX_BODY_BYTES} bytes",
                        "invalid_request_error",
                    )
                    return
                try:
                    body = json.loads(self.rfile.read(length))
                except json.JSONDecodeError as err:
                    self._error(400, f"the body is not valid JSON: {err}", "invalid_request_error")
                    return
                try:
                    self._send(200, server._chat(body))
                except _RequestError as err:
                    self._error(err.status, str(err), err.kind)
                except Exception as err:  # keep serving; report the failure to this client only
                    self._error(500, f"{type(err).__name__}: {err}", "InternalServerError")

        return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Serve a local model over an OpenAI-compatible chat-completions API."
    )
    parser.add_argument("--model", default="smollm2", help="model spec: 'smollm2' or a local model folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--served-model-name", default=None)
    args = parser.parse_args(argv)
    from wmrl.autoresearch.llm.hf import TransformersBackend

    backend = TransformersBackend.from_spec(args.model, batch_size=args.batch_size)
    server = OpenAICompatServer(backend, host=args.host, port=args.port, model_name=args.served_model_name)
    print(f"serving {server.model_name} at {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
