"""A client for Robometer's HTTP evaluation server (``robometer/evals/eval_server.py``), over ``requests``.

Request (``POST {url}/evaluate_batch_npy``, ``multipart/form-data``), as Robometer's own client
``scripts/example_inference.py`` sends it:

* one form field per trajectory, ``sample_{i}``, holding the JSON of a progress sample::

    {"sample_type": "progress",
     "trajectory": {"frames": {"__numpy_file__": "sample_{i}_trajectory_frames"},
                    "frames_shape": [T, H, W, 3], "task": "...", "id": "{i}",
                    "metadata": {"subsequence_length": T}, "video_embeddings": null}}

* one file per trajectory, ``sample_{i}_trajectory_frames`` (filename ``….npy``, type
  ``application/octet-stream``): the ``uint8 (T, H, W, 3)`` frames written by ``numpy.save``;
* the field ``use_frame_steps``: ``"true"`` or ``"false"``.

Response (JSON)::

    {"outputs_preference": null,
     "outputs_progress": {"progress_pred": [[p_0, ..., p_T-1], ...]},   # one list per sample
     "outputs_success": {"success_probs": [[s_0, ..., s_T-1], ...]}}

The server scores the frames it receives (it does not subsample), so the caller sends the 8 frames
the model should read (:func:`~wmrl.embodied.worldmodel.frames.subsample_frames`). With
``use_frame_steps`` the server scores every prefix ``[0, t]`` (4 frames each) and returns one
value per frame, at ``T`` times the cost. Any transport or format failure becomes a per-trajectory
error (:class:`FramePredictions.error`), never a made-up value.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from wmrl.core.http import retrying_session
from wmrl.embodied.worldmodel.backend import FramePredictions, Trajectory
from wmrl.embodied.worldmodel.frames import check_frames

__all__ = ["RobometerHTTPClient", "encode_request", "parse_response"]


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def encode_request(trajectories: Sequence[Trajectory], use_frame_steps: bool = False) -> tuple[bytes, str]:
    """The body and ``Content-Type`` of one ``/evaluate_batch_npy`` request (see the module docstring),
    encoded by urllib3 as ``requests.post(data=..., files=...)`` encodes Robometer's own client's."""
    from urllib3 import encode_multipart_formdata

    fields: list[tuple[str, Any]] = []
    files: list[tuple[str, Any]] = []
    for i, (frames, task) in enumerate(trajectories):
        key = f"sample_{i}_trajectory_frames"
        sample = {
            "sample_type": "progress",
            "trajectory": {
                "frames": {"__numpy_file__": key},
                "frames_shape": [int(x) for x in frames.shape],
                "task": task,
                "id": str(i),
                "metadata": {"subsequence_length": int(frames.shape[0])},
                "video_embeddings": None,
            },
        }
        fields.append((f"sample_{i}", json.dumps(sample)))
        files.append((key, (f"{key}.npy", _npy_bytes(frames), "application/octet-stream")))
    fields.append(("use_frame_steps", "true" if use_frame_steps else "false"))
    return encode_multipart_formdata(fields + files)


def _curve(values: Any, what: str) -> np.ndarray:
    if not isinstance(values, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
    ):
        raise ValueError(f"{what} must be a list of finite numbers; got {str(values)[:200]}")
    return np.asarray(values, dtype=np.float64)


def parse_response(payload: Any, n: int) -> list[FramePredictions]:
    """Per-trajectory predictions from the server's JSON reply to ``n`` progress samples.

    A reply without ``outputs_progress.progress_pred`` for exactly ``n`` samples fails every
    trajectory; an empty or malformed list fails its trajectory only.
    """
    progress_block = payload.get("outputs_progress") if isinstance(payload, dict) else None
    preds = progress_block.get("progress_pred") if isinstance(progress_block, dict) else None
    if not isinstance(preds, list) or len(preds) != n:
        got = (
            "no outputs_progress.progress_pred"
            if not isinstance(preds, list)
            else f"{len(preds)} progress lists"
        )
        return [FramePredictions.failed(f"server reply has {got} for {n} samples")] * n
    success_block = payload.get("outputs_success")
    succ = success_block.get("success_probs") if isinstance(success_block, dict) else None
    if not isinstance(succ, list) or len(succ) != n:
        succ = [[] for _ in range(n)]
    out = []
    for i in range(n):
        try:
            progress = _curve(preds[i], f"progress_pred[{i}]")
            if progress.size == 0:
                raise ValueError(f"the server returned no progress for sample {i}")
            success = _curve(succ[i], f"success_probs[{i}]")
            if success.size not in (0, progress.size):
                raise ValueError(
                    f"sample {i}: {success.size} success values for {progress.size} progress values"
                )
            out.append(FramePredictions(progress=progress, success=success))
        except ValueError as err:
            out.append(FramePredictions.failed(str(err)))
    return out


class RobometerHTTPClient:
    """The HTTP backend: Robometer's evaluation server scores the trajectories.

    Args:
        url: the server's base URL, e.g. ``http://gpu-box:8001``.
        timeout_s: seconds to wait for one request.
        use_frame_steps: ask for prefix-by-prefix scoring (see the module docstring).
        batch_size: trajectories per request.
    """

    name = "robometer-http"

    def __init__(
        self, url: str, timeout_s: float = 120.0, use_frame_steps: bool = False, batch_size: int = 8
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the Robometer server URL must start with http:// or https://; got {url!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0; got {timeout_s}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self._session = retrying_session(retries=2, backoff_s=0.5)
        self.use_frame_steps = bool(use_frame_steps)
        self.batch_size = batch_size

    def health(self) -> dict[str, Any]:
        """The server's ``GET /health`` reply (raises on failure)."""
        reply = self._session.get(self.url + "/health", timeout=self.timeout_s)
        reply.raise_for_status()
        return reply.json()

    def predict(self, trajectories: Sequence[Trajectory]) -> list[FramePredictions]:
        valid: list[tuple[int, Trajectory]] = []
        slots: list[FramePredictions | None] = [None] * len(trajectories)
        for i, item in enumerate(trajectories):
            try:
                frames, task = item
                frames = check_frames(frames, what=f"trajectory {i} frames")
                if not isinstance(task, str) or not task.strip():
                    raise ValueError(f"trajectory {i} needs a non-empty task string; got {task!r}")
                valid.append((i, (frames, task)))
            except (ValueError, TypeError) as err:
                slots[i] = FramePredictions.failed(f"invalid input: {err}")
        for start in range(0, len(valid), self.batch_size):
            chunk = valid[start : start + self.batch_size]
            for (i, _), pred in zip(chunk, self._post([t for _, t in chunk]), strict=True):
                slots[i] = pred
        return [s if s is not None else FramePredictions.failed("not scored") for s in slots]

    def _post(self, batch: Sequence[Trajectory]) -> list[FramePredictions]:
        import requests

        body, content_type = encode_request(batch, self.use_frame_steps)
        try:
            reply = self._session.post(
                self.url + "/evaluate_batch_npy",
                data=body,
                headers={"Content-Type": content_type},
                timeout=self.timeout_s,
            )
        except requests.RequestException as err:
            return [FramePredictions.failed(f"server unreachable at {self.url}: {err}")] * len(batch)
        if reply.status_code >= 400:
            detail = reply.content[:500].decode("utf-8", "replace")
            return [FramePredictions.failed(f"server answered HTTP {reply.status_code}: {detail}")] * len(
                batch
            )
        try:
            payload = reply.json()
        except ValueError as err:
            return [FramePredictions.failed(f"server reply is not JSON: {err}")] * len(batch)
        return parse_response(payload, len(batch))
