"""GRPO for VLA policies on LIBERO, with rewards corrected by WMRL (``wmrl train embodied``).

Modules: :mod:`config` (the typed config and presets), :mod:`groups` (G rollouts per (task, initial
state)), :mod:`batch` (per-(episode, timestep) samples), :mod:`ppo` (the clipped token loss),
:mod:`update` (PPO epochs), :mod:`policy_setup` (policy, LoRA, reference), :mod:`trainer` (the
domain on the core loop trainer), :mod:`report` (plots). Heavy imports (torch models, the
simulator) happen when a trainer is built, not when this package is imported.
"""

from wmrl.embodied.training.config import (
    PRESETS,
    EmbodiedTrainConfig,
    EnvSpec,
    PolicySpec,
    PPOConfig,
    load_train_config,
)
from wmrl.embodied.training.groups import GroupSpec, choose_groups, episode_specs

__all__ = [
    "PRESETS",
    "EmbodiedTrainConfig",
    "EnvSpec",
    "GroupSpec",
    "PPOConfig",
    "PolicySpec",
    "choose_groups",
    "episode_specs",
    "load_train_config",
]
