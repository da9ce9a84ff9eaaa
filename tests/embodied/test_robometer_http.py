"""Robometer's HTTP evaluation-server contract: our client against a real local server serving the tiny model.

The server is a real HTTP server on a local port; the model behind it is the real tiny Robometer, so
every number crossing the wire can be compared with the in-process prediction.
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import json
import urllib.request

import numpy as np
import pytest

from wmrl.embodied.worldmodel.backend import FramePredictions
from wmrl.embodied.worldmodel.http_client import RobometerHTTPClient, encode_request, parse_response
from wmrl.embodied.worldmodel.http_server import RobometerHTTPServer, decode_request, frame_step_indices
from wmrl.embodied.worldmodel.robometer import Robometer

pytestmark = pytest.mark.transformers

TASK = "put the black bowl in the bottom drawer of the cabinet and close it"


@pytest.fixture(scope="module")
def robometer() -> Robometer:
    return Robometer.tiny(seed=0)


@pytest.fixture(scope="module")
def server(robometer):
    with RobometerHTTPServer(robometer) as srv:
        yield srv


def _frames(seed: int, n: int = 8, size: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def test_client_gets_the_in_process_predictions(server, robometer):
    trajectories = [(_frames(0), TASK), (_frames(1, n=5, size=96), "open the top drawer")]
    remote = RobometerHTTPClient(server.url, timeout_s=60).predict(trajectories)
    local = robometer.predict(trajectories)
    for r, loc in zip(remote, local, strict=True):
        assert r.error is None
        np.testing.assert_allclose(r.progress, loc.progress, rtol=0, atol=1e-12)
        np.testing.assert_allclose(r.success, loc.success, rtol=0, atol=1e-12)


def test_client_batches_requests(server, robometer):
    trajectories = [(_frames(i, n=3), TASK) for i in range(5)]
    remote = RobometerHTTPClient(server.url, batch_size=2).predict(trajectories)
    local = robometer.predict(trajectories)
    assert [r.error for r in remote] == [None] * 5
    for r, loc in zip(remote, local, strict=True):  # other batch splits: float round-off only
        np.testing.assert_allclose(r.progress, loc.progress, rtol=0, atol=1e-6)


def test_frame_steps_score_every_prefix(server, robometer):
    frames = _frames(2, n=5)
    remote = RobometerHTTPClient(server.url, use_frame_steps=True).predict([(frames, TASK)])[0]
    assert remote.error is None and remote.progress.shape == (5,)
    # upstream: prefix [0, t] cut to linspace(0, t, 4) truncated, last value of each prefix kept
    assert frame_step_indices(5).tolist() == [0, 1, 2, 4]
    assert frame_step_indices(1).tolist() == [0, 0, 0, 0]
    prefixes = [(frames[frame_step_indices(t)], TASK) for t in range(1, 6)]
    expected = [p.progress[-1] for p in robometer.predict(prefixes)]
    np.testing.assert_allclose(remote.progress, expected, atol=1e-12)


def test_request_body_is_what_robometers_client_sends():
    """Parse our body with the standard library's MIME parser and check every field of the contract."""
    frames = _frames(3, n=2, size=32)
    body, ctype = encode_request([(frames, TASK)], use_frame_steps=False)
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body
    )
    parts = {p.get_param("name", header="content-disposition"): p for p in message.iter_parts()}
    assert set(parts) == {"sample_0", "use_frame_steps", "sample_0_trajectory_frames"}
    assert parts["use_frame_steps"].get_payload(decode=True) == b"false"
    sample = json.loads(parts["sample_0"].get_payload(decode=True))
    assert sample == {
        "sample_type": "progress",
        "trajectory": {
            "frames": {"__numpy_file__": "sample_0_trajectory_frames"},
            "frames_shape": [2, 32, 32, 3],
            "task": TASK,
            "id": "0",
            "metadata": {"subsequence_length": 2},
            "video_embeddings": None,
        },
    }
    file_part = parts["sample_0_trajectory_frames"]
    assert file_part.get_filename() == "sample_0_trajectory_frames.npy"
    assert file_part.get_content_type() == "application/octet-stream"
    np.testing.assert_array_equal(np.load(io.BytesIO(file_part.get_payload(decode=True))), frames)


def test_server_reads_a_body_encoded_like_requests_does():
    """The official client posts with ``requests``, which encodes multipart bodies with urllib3."""
    urllib3 = pytest.importorskip("urllib3")
    frames = _frames(4, n=3, size=32)
    buf = io.BytesIO()
    np.save(buf, frames)
    sample = {
        "sample_type": "progress",
        "trajectory": {"frames": {"__numpy_file__": "sample_0_trajectory_frames"}, "task": TASK},
    }
    body, ctype = urllib3.encode_multipart_formdata(
        [
            ("sample_0", json.dumps(sample)),
            ("use_frame_steps", "true"),
            (
                "sample_0_trajectory_frames",
                ("sample_0_trajectory_frames.npy", buf.getvalue(), "application/octet-stream"),
            ),
        ]
    )
    trajectories, use_frame_steps = decode_request(body, ctype)
    assert use_frame_steps is True
    np.testing.assert_array_equal(trajectories[0][0], frames)
    assert trajectories[0][1] == TASK


def test_response_format(server):
    body, ctype = encode_request([(_frames(5, n=4), TASK)])
    request = urllib.request.Request(
        server.url + "/evaluate_batch_npy", data=body, headers={"Content-Type": ctype}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        payload = json.loads(resp.read())
    assert set(payload) == {"outputs_preference", "outputs_progress", "outputs_success"}
    assert payload["outputs_preference"] is None
    assert len(payload["outputs_progress"]["progress_pred"]) == 1
    assert len(payload["outputs_progress"]["progress_pred"][0]) == 4
    assert len(payload["outputs_success"]["success_probs"][0]) == 4
    with urllib.request.urlopen(server.url + "/health", timeout=10) as resp:
        assert json.loads(resp.read())["status"] == "healthy"


def test_bad_requests_get_400_with_the_reason(server):
    body, ctype = encode_request([(_frames(6, n=2), TASK)])
    body = body.replace(b'"progress"', b'"preference"', 1)
    request = urllib.request.Request(
        server.url + "/evaluate_batch_npy", data=body, headers={"Content-Type": ctype}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 400
    assert "progress only" in json.loads(err.value.read())["detail"]


class _Broken:
    name = "broken"

    def predict(self, trajectories):
        raise RuntimeError("CUDA out of memory")


class _PartlyBroken:
    name = "partly-broken"

    def __init__(self, inner):
        self.inner = inner

    def predict(self, trajectories):
        preds = self.inner.predict(trajectories)
        return [FramePredictions.failed("frame decode failed"), *preds[1:]]


def test_a_failing_server_gives_reasons_not_values():
    with RobometerHTTPServer(_Broken()) as srv:
        preds = RobometerHTTPClient(srv.url).predict([(_frames(7, n=2), TASK)])
    assert (
        preds[0].error is not None and "HTTP 500" in preds[0].error and "CUDA out of memory" in preds[0].error
    )
    assert preds[0].progress.size == 0


def test_a_partly_failing_server_fails_only_those_samples(robometer):
    with RobometerHTTPServer(_PartlyBroken(robometer)) as srv:
        preds = RobometerHTTPClient(srv.url).predict([(_frames(8, n=2), TASK), (_frames(9, n=2), TASK)])
    assert "no progress" in preds[0].error
    assert preds[1].error is None and preds[1].progress.shape == (2,)


def test_an_unreachable_server_is_an_error_per_trajectory(unused_port):
    port = unused_port()  # nobody listens on it
    preds = RobometerHTTPClient(f"http://127.0.0.1:{port}", timeout_s=5).predict(
        [(_frames(10, n=2), TASK)] * 2
    )
    assert all("unreachable" in p.error for p in preds)


def test_malformed_replies_are_errors():
    assert all("progress_pred" in p.error for p in parse_response({"outputs_progress": None}, 2))
    assert all(
        "1 progress lists for 2" in p.error
        for p in parse_response({"outputs_progress": {"progress_pred": [[0.1]]}}, 2)
    )
    preds = parse_response(
        {
            "outputs_progress": {"progress_pred": [[0.1, "x"], [0.2, 0.3]]},
            "outputs_success": {"success_probs": [[], [0.5]]},
        },
        2,
    )
    assert "finite numbers" in preds[0].error
    assert "1 success values for 2" in preds[1].error


def test_client_validates_its_arguments():
    with pytest.raises(ValueError, match="http"):
        RobometerHTTPClient("localhost:8001")
    client = RobometerHTTPClient("http://127.0.0.1:9")
    preds = client.predict([(np.zeros((2, 8, 8), np.uint8), TASK)])
    assert "invalid input" in preds[0].error


@pytest.mark.slow
def test_wmrl_serve_robometer_starts_a_server_with_health_and_scoring(unused_port):
    import subprocess
    import sys
    import time

    port = unused_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wmrl.core.cli", "serve", "robometer", "--tiny", "--port", str(port),
         "--batch-size", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                    health = json.loads(reply.read())
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.5)
        else:
            raise AssertionError("the server did not answer /health within 120 s")
        assert health["status"] == "healthy"
        rng = np.random.default_rng(0)
        trajectories = [(rng.integers(0, 255, size=(3, 32, 32, 3), dtype=np.uint8), TASK) for _ in range(3)]
        out = RobometerHTTPClient(url, timeout_s=120).predict(trajectories)
        assert len(out) == 3 and all(p.error is None and len(p.progress) == 3 for p in out)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
