"""Build the policy to train and its frozen reference from :class:`~wmrl.embodied.training.config.PolicySpec`.

* ``tiny``: the random tiny MiniVLA (seeded; rebuilt identically on resume).
* a folder with ``minivla.json`` (``MiniVLAPolicy.save``, e.g. an SFT checkpoint). If it carries LoRA
  adapters they are merged into the base weights first, so the RL adapters start from zero on top of
  the loaded policy and "adapters off" is exactly that policy.
* a Prismatic / openvla-mini run directory (``checkpoints/step-*.pt``).

The reference policy of the KL term is the policy as it was before RL. With fresh LoRA adapters it
is the same network with the adapters disabled (no second copy in memory); with full fine-tuning it
is a frozen copy.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.core.config import ConfigError
from wmrl.core.train_config import LoraConfig
from wmrl.embodied.training.config import PolicySpec
from wmrl.embodied.training.update import LogProbFn

__all__ = ["acting_settings", "build_policy", "make_reference", "resolve_observation"]


def acting_settings(spec: PolicySpec, image_key: str) -> dict[str, Any]:
    """The :class:`MiniVLAPolicyConfig` fields ``spec`` sets (``None`` = keep the checkpoint's)."""
    settings: dict[str, Any] = {
        "image_key": image_key,
        "temperature": spec.temperature,
        # RL samples among the 256 action tokens (every sample a valid action; ratio and KL on that
        # support), whatever a saved policy's evaluation setting is
        "constrain_to_actions": True,
        "device": spec.device,
        "dtype": spec.dtype,
        "seed": 0,  # re-seeded per episode by the rollout runner
    }
    for key in ("unnorm_key", "center_crop", "jpeg_quality"):
        if getattr(spec, key) is not None:
            settings[key] = getattr(spec, key)
    if spec.wrist_camera is not None:
        settings["wrist_image_key"] = f"{spec.wrist_camera}_image"
    return settings


def resolve_observation(
    recorded: dict[str, Any], orientation: str | None, image_size: int | None, allow_mismatch: bool
) -> tuple[str, int]:
    """The orientation and render size to train with: the config's, else the policy checkpoint's.

    Raises:
        ConfigError: a given value differs from the checkpoint's record and ``allow_mismatch`` is false.
    """
    out: list[Any] = []
    for key, name, given, default in (
        ("orientation", "env.orientation", orientation, "upright"),
        ("render_size", "env.image_size", image_size, 256),
    ):
        saved = recorded.get(key)
        if given is not None and saved is not None and given != saved and not allow_mismatch:
            raise ConfigError(
                f"{name}={given!r} but the policy was trained on {key} {saved!r} (its checkpoint records it); "
                f"leave {name} unset to use the policy's, or set env.allow_observation_mismatch=true"
            )
        out.append(given if given is not None else saved if saved is not None else default)
    return out[0], out[1]


def _merge_saved_adapters(policy: Any) -> Any:
    """A policy whose base weights hold the (merged) adapters of ``policy`` and that has no adapters."""
    from wmrl.embodied.policy.minivla import MiniVLA
    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy
    from wmrl.embodied.policy.prismatic_checkpoint import load_into

    merged = policy.merged_state_dict()
    fresh = MiniVLAPolicy(
        MiniVLA(policy.model.config), policy.tokenizer, policy.dataset_statistics, policy.config
    )
    tied = bool(policy.model.config.llm.get("tie_word_embeddings", False))
    load_into(fresh.base_state_dict(keep_vars=True), merged, tied=tied)
    return fresh


def build_policy(spec: PolicySpec, lora: LoraConfig, image_key: str, suite: str | None = None) -> Any:
    """The MiniVLA policy to train, with LoRA applied (or projector + LLM trainable without LoRA).

    Args:
        spec: where the weights come from and how the policy samples.
        lora: the adapters to add.
        image_key: observation key of the rendered camera (``f"{camera}_image"``).
        suite: the LIBERO suite trained on; its statistics un-normalise actions unless ``spec`` or
            the saved policy names others.

    Raises:
        FileNotFoundError: ``spec.source`` is neither ``tiny`` nor a policy folder.
    """
    from wmrl.embodied.policy.minivla_policy import (
        WRIST_IMAGE_KEY,
        MiniVLAPolicy,
        MiniVLAPolicyConfig,
        load_saved_policy,
    )

    settings = acting_settings(spec, image_key)
    if suite is not None and "unnorm_key" not in settings:
        settings["unnorm_key"] = suite
    if spec.is_tiny:
        policy = MiniVLAPolicy.tiny(seed=spec.tiny_seed, config=MiniVLAPolicyConfig(**settings))
    else:
        path = Path(spec.source).expanduser()
        if (path / "minivla.json").is_file():
            saved = json.loads((path / "minivla.json").read_text())["policy"]
            _check_wrist(spec, saved.get("wrist_image_key"), path)
            if spec.unnorm_key is None and saved.get("unnorm_key"):
                settings["unnorm_key"] = saved["unnorm_key"]  # the statistics it was trained with
            policy = load_saved_policy(path, **settings)
            if policy.lora is not None:
                policy = _merge_saved_adapters(policy)
        elif (path / "checkpoints").is_dir():
            from wmrl.embodied.policy.prismatic_checkpoint import images_per_step

            vla = json.loads((path / "config.json").read_text()).get("vla", {})
            wrist = WRIST_IMAGE_KEY if images_per_step(vla) == 2 else None
            _check_wrist(spec, wrist, path)
            settings["wrist_image_key"] = wrist
            policy = MiniVLAPolicy.from_prismatic(
                path,
                tokenizer_path=spec.tokenizer_path,
                config=MiniVLAPolicyConfig(**settings),
                step=spec.checkpoint_step,
            )
        else:
            raise FileNotFoundError(
                f"policy.source {str(path)!r} is neither 'tiny', a folder saved by MiniVLAPolicy.save "
                "(minivla.json) nor a Prismatic run directory (checkpoints/step-*.pt)"
            )
    if lora.enabled:
        policy.apply_lora(r=lora.r, alpha=lora.alpha, targets=lora.target_modules, dropout=lora.dropout)
    else:
        policy.set_trainable(vision=False, projector=True, llm=True)
    policy.eval()
    return policy


def _check_wrist(spec: PolicySpec, saved_key: str | None, path: Path) -> None:
    """Refuse a ``policy.wrist_camera`` other than the checkpoint's own."""
    if spec.wrist_camera is None:
        return
    if saved_key != f"{spec.wrist_camera}_image":
        saved = None if saved_key is None else saved_key.removesuffix("_image")
        raise ConfigError(
            f"policy.wrist_camera={spec.wrist_camera!r} but {path} reads wrist camera {saved!r}; "
            "leave policy.wrist_camera unset to use the checkpoint's"
        )


def make_reference(policy: Any, lora: LoraConfig) -> LogProbFn:
    """Log-probabilities under the policy as it was before training (see the module docstring)."""
    if lora.enabled:
        llm = policy.model.llm

        def adapters_off(observations, instructions, token_ids) -> torch.Tensor:
            with llm.disable_adapter():
                return policy.action_log_probs(observations, instructions, np.asarray(token_ids))

        return adapters_off
    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy

    frozen = MiniVLAPolicy(
        copy.deepcopy(policy.model), policy.tokenizer, policy.dataset_statistics, policy.config
    )
    frozen.model.requires_grad_(False)
    frozen.eval()
    return frozen.action_log_probs
