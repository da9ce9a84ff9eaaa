"""Training with Robometer on its own server: ``world_model.backend=http`` and ``world_model.url``.

The server is this package's real Robometer HTTP server (``wmrl serve robometer`` runs the same
class) serving the tiny Robometer on a local port; the trainer reaches it only through
:class:`~wmrl.embodied.worldmodel.http_client.RobometerHTTPClient`. One smoke step on the real LIBERO
simulator must give every episode the world-model score the in-process tiny Robometer gives it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wmrl.core.cli import main
from wmrl.embodied.worldmodel.http_server import RobometerHTTPServer
from wmrl.embodied.worldmodel.robometer import Robometer

pytestmark = [pytest.mark.libero, pytest.mark.slow, pytest.mark.peft, pytest.mark.matplotlib]


class Counted:
    """The real tiny Robometer, counting the trajectories the server asked it to score."""

    def __init__(self, model: Robometer) -> None:
        self.model = model
        self.trajectories = 0

    def predict(self, trajectories):
        self.trajectories += len(trajectories)
        return self.model.predict(trajectories)

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.fixture(scope="module", autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _wm_scores(run) -> list[float]:
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    return [r["wm"] for r in rows]


def test_training_scores_episodes_on_a_robometer_server(tmp_path):
    common = ["train", "embodied", "--smoke", "--no-progress"]
    step = ["steps=1", "groups_per_step=2", "logging.completions=true"]
    assert main([*common, "--out", str(tmp_path / "here"), *step]) == 0
    backend = Counted(Robometer.tiny())  # the trainer's own tiny model (same default seed)
    with RobometerHTTPServer(backend) as server:
        overrides = ["world_model.backend=http", f"world_model.url={server.url}"]
        assert main([*common, "--out", str(tmp_path / "served"), *step, *overrides]) == 0
    assert backend.trajectories >= 4  # every episode of the step crossed the wire
    resolved = json.loads((tmp_path / "served" / "config.json").read_text())["world_model"]
    assert resolved["backend"] == "http" and resolved["url"] == server.url
    here, served = _wm_scores(tmp_path / "here"), _wm_scores(tmp_path / "served")
    assert len(served) == 4 and all(s is not None for s in served)
    assert len(set(here)) == 4  # distinct episodes, distinct scores: the comparison can fail
    np.testing.assert_allclose(served, here, rtol=1e-5, atol=1e-9)
    report = json.loads((tmp_path / "served" / "cost_report.json").read_text())
    assert report["spent"]["world_model"]["items"] == 4
