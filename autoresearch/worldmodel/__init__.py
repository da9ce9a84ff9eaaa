"""The AutoResearch world model: a frozen LLM that predicts what running a script would do.

* :class:`WorldModel`: the core ``RewardSource`` (role ``world_model``) over any generation backend;
  expected-reward scoring over samples or status probabilities, unknown is ``None``.
* :func:`gate`: exact outcomes without a model (empty code, syntax errors).
* :func:`parse_prediction`: robust JSON parsing with schema validation.
* :class:`PredictionCache`: predictions keyed by (task, code hash, model, prompt version, sampling).
"""

from wmrl.autoresearch.worldmodel.cache import CachedPrediction, PredictionCache, cache_key, code_hash
from wmrl.autoresearch.worldmodel.gate import gate
from wmrl.autoresearch.worldmodel.model import WMOutcome, WorldModel, WorldModelConfig, WorldModelStats
from wmrl.autoresearch.worldmodel.prediction import (
    WM_STATUSES,
    Prediction,
    PredictionParseError,
    parse_prediction,
)
from wmrl.autoresearch.worldmodel.prompts import ASSISTANT_PREFIX, PROMPT_VERSION, build_messages
from wmrl.autoresearch.worldmodel.scoring import (
    expected_reward_from_probs,
    prediction_reward,
    summarise_samples,
)

__all__ = [
    "ASSISTANT_PREFIX",
    "PROMPT_VERSION",
    "WM_STATUSES",
    "CachedPrediction",
    "Prediction",
    "PredictionCache",
    "PredictionParseError",
    "WMOutcome",
    "WorldModel",
    "WorldModelConfig",
    "WorldModelStats",
    "build_messages",
    "cache_key",
    "code_hash",
    "expected_reward_from_probs",
    "gate",
    "parse_prediction",
    "prediction_reward",
    "summarise_samples",
]
