"""TRL integration: :class:`~wmrl.core.engines.trl.trainer.WMRLGRPOTrainer` (needs ``trl``; extra ``autoresearch``)."""

from wmrl.core.engines.trl.multiturn import EpisodeFactory, TurnContext, TurnEpisode, feedback_suffix
from wmrl.core.engines.trl.trainer import SUPPORTED_TRL, WMRLGRPOTrainer, completion_text, wmrl_reward
from wmrl.core.engines.trl.vllm_http import VLLMHTTPConfig

__all__ = [
    "SUPPORTED_TRL",
    "EpisodeFactory",
    "TurnContext",
    "TurnEpisode",
    "VLLMHTTPConfig",
    "WMRLGRPOTrainer",
    "completion_text",
    "feedback_suffix",
    "wmrl_reward",
]
