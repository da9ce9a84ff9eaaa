"""Serve any Robometer backend through Robometer's evaluation-server contract (stdlib HTTP server).

Endpoints (the subset of ``robometer/evals/eval_server.py`` that progress scoring uses):

* ``POST /evaluate_batch_npy``: the multipart request and JSON reply documented in
  :mod:`http_client` (progress samples only; ``use_frame_steps`` honoured as upstream does: every
  prefix ``[0, t]`` of a ``T``-frame sample is cut to 4 frames with ``linspace(0, t, 4)`` truncated
  to integers and scored, and the last value of each prefix is kept). A sample the backend cannot
  score gets empty lists; if none can be scored the reply is HTTP 500 with ``{"detail": reason}``.
* ``GET /health``: ``{"status": "healthy", "backend": name}``.

Run one on a GPU machine with a local checkpoint (no robometer package needed)::

    python -m wmrl.embodied.worldmodel.http_server --model /path/Robometer-4B \\
        --tokenizer /path/Qwen3-VL-4B-Instruct --device cuda --dtype bfloat16 --port 8001

``--tiny`` serves the random tiny model (smoke tests). Requests are scored one at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import numpy as np

from wmrl.embodied.worldmodel.backend import FramePredictions, RobometerBackend, Trajectory
from wmrl.embodied.worldmodel.multipart import parse_multipart

__all__ = ["FRAME_STEP_FRAMES", "RobometerHTTPServer", "decode_request", "frame_step_indices"]

FRAME_STEP_FRAMES = 4
_TRAJECTORY_KEYS = ("trajectory", "chosen_trajectory", "rejected_trajectory")


class RequestError(ValueError):
    """A request that does not follow the contract (answered with HTTP 400)."""


def frame_step_indices(prefix_len: int) -> np.ndarray:
    """Upstream's frame-step window: ``linspace(0, prefix_len - 1, 4)`` truncated to ``int``."""
    return np.linspace(0, prefix_len - 1, FRAME_STEP_FRAMES, dtype=int)


def _frames(array: np.ndarray, where: str) -> np.ndarray:
    arr = np.asarray(array)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0:
        raise RequestError(f"{where}: frames must be (T, H, W, 3) or (H, W, 3); got {arr.shape}")
    if arr.dtype != np.uint8:  # as upstream's collator: clip and cast
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    return arr


def decode_request(body: bytes, content_type: str) -> tuple[list[Trajectory], bool]:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    """The progress trajectories and the ``use_frame_steps`` flag of an ``/evaluate_batch_npy`` body."""
    try:
        parts = parse_multipart(body, content_type)
    except ValueError as err:
        raise RequestError(str(err)) from err
    arrays: dict[str, np.ndarray] = {}
    fields: dict[str, Any] = {}
    for part in parts:
        if part.filename:
            if not part.filename.endswith(".npy"):
                continue  # upstream ignores non-.npy files
            try:
                arrays[part.name] = np.load(io.BytesIO(part.data), allow_pickle=False)
            except ValueError as err:
                raise RequestError(f"file {part.name!r} is not a readable .npy array: {err}") from err
        else:
            text = part.data.decode("utf-8")
            try:
                fields[part.name] = json.loads(text)
            except json.JSONDecodeError:
                fields[part.name] = text
    flag = fields.pop("use_frame_steps", False)
    use_frame_steps = flag if isinstance(flag, bool) else str(flag).lower() == "true"
    trajectories: list[Trajectory] = []
    for i in range(len(fields)):
        sample = fields.get(f"sample_{i}")
        if sample is None:
            continue
        if not isinstance(sample, dict):
            raise RequestError(f"sample_{i} must be a JSON object")
        if sample.get("sample_type") != "progress":
            raise RequestError(
                f"sample_{i}: sample_type {sample.get('sample_type')!r} is not supported by this server (progress only)"
            )
        traj = sample.get("trajectory")
        if not isinstance(traj, dict):
            raise RequestError(f"sample_{i} has no 'trajectory' object")
        frames = traj.get("frames")
        if isinstance(frames, dict) and frames.get("__numpy_file__"):
            key = frames["__numpy_file__"]
            if key not in arrays:
                raise RequestError(f"sample_{i} refers to the missing file {key!r}")
            frames = arrays[key]
        elif isinstance(frames, list):
            frames = np.asarray(frames)
        else:
            raise RequestError(f"sample_{i}: frames must be a .npy file reference")
        task = traj.get("task")
        if not isinstance(task, str) or not task:
            raise RequestError(f"sample_{i}: the trajectory needs a non-empty 'task' string")
        trajectories.append((_frames(frames, f"sample_{i}"), task))
    if not trajectories:
        raise RequestError("the request holds no sample_{i} progress sample")
    return trajectories, use_frame_steps


def _score(
    backend: RobometerBackend, trajectories: Sequence[Trajectory], use_frame_steps: bool
) -> dict[str, Any]:
    if not use_frame_steps:
        preds = backend.predict(trajectories)
    else:
        expanded: list[Trajectory] = []
        counts = []
        for frames, task in trajectories:
            counts.append(len(frames))
            expanded += [(frames[frame_step_indices(t)], task) for t in range(1, len(frames) + 1)]
        sub = backend.predict(expanded)
        preds, at = [], 0
        for n in counts:
            pieces = sub[at : at + n]
            at += n
            errors = [p.error for p in pieces if p.error]
            if errors:
                preds.append(FramePredictions.failed(errors[0]))
            elif n == 1:  # upstream passes a one-frame sample's sub-prediction through whole
                preds.append(pieces[0])
            else:
                preds.append(
                    FramePredictions(
                        progress=np.array([p.progress[-1] for p in pieces]),
                        success=np.array([p.success[-1] for p in pieces if p.success.size]),
                    )
                )
    if all(p.error for p in preds):
        raise RuntimeError("; ".join(sorted({str(p.error) for p in preds})))
    return {
        "outputs_preference": None,
        "outputs_progress": {"progress_pred": [[] if p.error else p.progress.tolist() for p in preds]},
        "outputs_success": {"success_probs": [[] if p.error else p.success.tolist() for p in preds]},
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/health":
            self._reply(
                200, {"status": "healthy", "backend": getattr(self.server.backend, "name", "robometer")}
            )
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/evaluate_batch_npy":
            self._reply(404, {"detail": "Not Found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > self.server.max_body_bytes:
            self._reply(
                413 if length > 0 else 400,
                {"detail": f"body of {length} bytes (limit {self.server.max_body_bytes})"},
            )
            return
        body = self.rfile.read(length)
        try:
            trajectories, use_frame_steps = decode_request(body, self.headers.get("Content-Type", ""))
        except RequestError as err:
            self._reply(400, {"detail": str(err)})
            return
        try:
            with self.server.lock:
                payload = _score(self.server.backend, trajectories, use_frame_steps)
        except Exception as err:  # the contract's failure reply; the server keeps serving
            self._reply(500, {"detail": f"{type(err).__name__}: {err}"})
            return
        self._reply(200, payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], backend: RobometerBackend, max_body_bytes: int, verbose: bool
    ) -> None:
        super().__init__(address, _Handler)
        self.backend = backend
        self.max_body_bytes = max_body_bytes
        self.verbose = verbose
        self.lock = threading.Lock()


class RobometerHTTPServer:
    """An HTTP server around ``backend``; ``start()`` serves from a background thread.

    Args:
        backend: what scores the trajectories (e.g. :class:`~wmrl.embodied.worldmodel.robometer.Robometer`).
        host, port: where to listen (port 0 picks a free port; see :attr:`url`).
        max_body_bytes: largest request accepted.
    """

    def __init__(
        self,
        backend: RobometerBackend,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = 1 << 30,
        verbose: bool = False,
    ) -> None:
        self._server = _Server((host, port), backend, max_body_bytes, verbose)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = cast(tuple[str, int], self._server.server_address)[:2]  # an AF_INET server
        return f"http://{host}:{port}"

    def start(self) -> RobometerHTTPServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, name="robometer-http", daemon=True
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> RobometerHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(args: argparse.Namespace) -> int:
    """Load the model the arguments name and serve it until Ctrl-C."""
    import torch

    from wmrl.embodied.worldmodel.robometer import Robometer

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1; got {args.batch_size}")
    options = {"device": device, "dtype": dtype, "batch_size": args.batch_size}
    backend = (
        Robometer.tiny(**options)
        if args.tiny
        else Robometer.from_pretrained(args.model, tokenizer_path=args.tokenizer, **options)
    )
    server = RobometerHTTPServer(backend, host=args.host, port=args.port, verbose=True)
    print(
        f"Robometer server on {server.url} ({device}, {dtype}, batches of {args.batch_size}; "
        "POST /evaluate_batch_npy, GET /health)",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Serve a local Robometer through its HTTP evaluation contract."
    )
    from wmrl.embodied.cli import add_server_arguments

    add_server_arguments(parser)
    serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
