"""World models that grade embodied episodes: Robometer (in process or over HTTP) and episode scoring.

Modules: :mod:`frames` (Robometer's uniform subsampling), :mod:`scoring` (progress curves -> one
score), :mod:`robometer_config` / :mod:`robometer_inputs` / :mod:`robometer_model` /
:mod:`robometer_checkpoint` (the model, its exact input format and checkpoint key mapping),
:mod:`robometer` (the in-process backend), :mod:`http_client` / :mod:`http_server` (Robometer's
evaluation-server contract), :mod:`tiny` (the random tiny configuration). Heavy imports (torch,
transformers) stay inside those modules; this package imports only the light ones.
"""

from wmrl.embodied.worldmodel.backend import FramePredictions, RobometerBackend
from wmrl.embodied.worldmodel.frames import subsample_frames, subsample_indices
from wmrl.embodied.worldmodel.scoring import SCORE_MODES, ScoreConfig, ScoreError, episode_score

__all__ = [
    "SCORE_MODES",
    "FramePredictions",
    "RobometerBackend",
    "ScoreConfig",
    "ScoreError",
    "episode_score",
    "subsample_frames",
    "subsample_indices",
]
