"""Prismatic/openvla-mini checkpoint directories: an explicit key mapping, reading and writing.

A Prismatic VLA run directory (e.g. ``Stanford-ILIAD/minivla-libero90-prismatic``) holds::

    config.json                     {"vla": {"base_vlm": ..., "action_tokenizer": ..., ...}, ...}
    dataset_statistics.json         {dataset: {"action": {"q01", "q99", "mask", ...}, ...}}
    checkpoints/step-XXXXXX-epoch-XX-loss=X.XXXX.pt
                                    torch.save({"model": {"vision_backbone": sd, "projector": sd,
                                                          "llm_backbone": sd}})

The three state dicts use Prismatic's module names. :data:`KEY_MAP` is the whole correspondence with
our :class:`~wmrl.embodied.policy.minivla.MiniVLA` (``vision_backbone`` may be absent when the vision
tower was frozen in training; then its weights must come from elsewhere and loading says so). Keys of
either side that no rule covers are an error that lists them, never silently dropped.

``tokenizer/`` is our addition: Prismatic loads the Qwen2.5 tokenizer from the hub, so the writer
stores the base tokenizer next to the checkpoint and the reader accepts an explicit local path.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from wmrl.embodied.policy.minivla import MINIVLA_1B, MiniVLA, MiniVLAConfig

__all__ = [
    "BASE_VLMS",
    "KEY_MAP",
    "CheckpointKeyError",
    "PrismaticRun",
    "find_checkpoint",
    "images_per_step",
    "load_checkpoint_groups",
    "load_into",
    "load_mapped_state",
    "ours_to_prismatic",
    "prismatic_to_ours",
    "read_run",
    "resolve_base_vlm",
    "write_run",
]

# (Prismatic module group, key prefix inside that group, our key prefix). Exactly one rule matches a key.
KEY_MAP: tuple[tuple[str, str, str], ...] = (
    ("vision_backbone", "dino_featurizer.", "vision.dino."),
    ("vision_backbone", "siglip_featurizer.", "vision.siglip."),
    ("projector", "projector.0.", "projector.fc1."),
    ("projector", "projector.2.", "projector.fc2."),
    ("projector", "projector.4.", "projector.fc3."),
    ("llm_backbone", "llm.", "llm."),
)
GROUPS = ("vision_backbone", "projector", "llm_backbone")

# Base VLMs (``vla.base_vlm`` in config.json) this loader knows, with Prismatic's settings:
# vision "dinosiglip-vit-so-224px", image_resize_strategy "resize-naive", LLM "qwen25-0_5b-extra",
# arch "no-align+fused-gelu-mlp".
BASE_VLMS: dict[str, MiniVLAConfig] = {
    "prism-qwen25-extra-dinosiglip-224px+0_5b": MINIVLA_1B,
}
SUPPORTED_ACTION_TOKENIZERS = ("extra_action_tokenizer",)
_TIED_HEAD = "llm.lm_head.weight"
_EMBED = "llm.model.embed_tokens.weight"


class CheckpointKeyError(KeyError):
    """A checkpoint's keys do not match the model: lists the unmapped, missing and unexpected keys."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0]) if self.args else ""


def _fmt(keys: list[str], limit: int = 20) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def prismatic_to_ours(groups: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Rename Prismatic's grouped state dicts to our flat key space with :data:`KEY_MAP`.

    Raises:
        CheckpointKeyError: an unknown group or a key no rule covers (all of them are listed).
    """
    unknown_groups = sorted(set(groups) - set(GROUPS))
    unmapped: list[str] = [f"{g}/*" for g in unknown_groups]
    out: dict[str, torch.Tensor] = {}
    for group, state in groups.items():
        if group in unknown_groups:
            continue
        for key, value in state.items():
            rules = [(pp, op) for g, pp, op in KEY_MAP if g == group and key.startswith(pp)]
            if len(rules) != 1:
                unmapped.append(f"{group}/{key}")
                continue
            prefix, ours = rules[0]
            out[ours + key[len(prefix) :]] = value
    if unmapped:
        raise CheckpointKeyError(f"{len(unmapped)} checkpoint keys have no mapping rule: {_fmt(unmapped)}")
    return out


def ours_to_prismatic(state: Mapping[str, torch.Tensor]) -> dict[str, OrderedDict[str, torch.Tensor]]:
    """Inverse of :func:`prismatic_to_ours`: our flat state dict -> Prismatic's three groups."""
    groups: dict[str, OrderedDict[str, torch.Tensor]] = {g: OrderedDict() for g in GROUPS}
    unmapped = []
    for key, value in state.items():
        rules = [(g, pp, op) for g, pp, op in KEY_MAP if key.startswith(op)]
        if len(rules) != 1:
            unmapped.append(key)
            continue
        group, prefix, ours = rules[0]
        groups[group][prefix + key[len(ours) :]] = value
    if unmapped:
        raise CheckpointKeyError(f"{len(unmapped)} model keys have no mapping rule: {_fmt(unmapped)}")
    return groups


def load_mapped_state(
    model: MiniVLA, state: Mapping[str, torch.Tensor], allow_missing_vision: bool = False
) -> None:
    """Load a mapped state dict into ``model`` strictly (see :func:`load_into`)."""
    targets = dict(model.state_dict(keep_vars=True))
    load_into(
        targets,
        state,
        tied=bool(model.config.llm.get("tie_word_embeddings", False)),
        allow_missing_vision=allow_missing_vision,
    )


@torch.no_grad()
def load_into(
    targets: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    tied: bool,
    allow_missing_vision: bool = False,
) -> None:
    """Copy ``state`` into the ``targets`` tensors (our key space) after checking the key sets match exactly.

    A tied LM head may be present in ``state`` (it must equal the input embedding) or absent.
    ``allow_missing_vision`` accepts a checkpoint without any ``vision.*`` key (Prismatic omits the
    vision tower when it was frozen in training) and keeps the current vision weights, which the caller
    must have loaded from timm-format files (:meth:`VisionTransformer.load_timm_state_dict`).

    Raises:
        CheckpointKeyError: missing or unexpected keys (all listed).
        ValueError: a shape mismatch, or a tied LM head that differs from the input embedding.
    """
    state = dict(state)
    if tied and _TIED_HEAD in state and _EMBED in state and not torch.equal(state[_TIED_HEAD], state[_EMBED]):
        raise ValueError(
            "the LLM ties its head to its embedding, but the checkpoint's lm_head differs from it"
        )
    if tied:
        state.pop(_TIED_HEAD, None)
    expected_keys = set(targets) - ({_TIED_HEAD} if tied else set())
    missing = sorted(expected_keys - set(state))
    unexpected = sorted(set(state) - expected_keys)
    vision_only_missing = bool(missing) and all(k.startswith("vision.") for k in missing)
    if allow_missing_vision and vision_only_missing and not any(k.startswith("vision.") for k in state):
        missing = []
    if missing or unexpected:
        parts = []
        if missing:
            hint = (
                " (the checkpoint has no vision_backbone: it was trained with a frozen vision tower; "
                "load timm weights into model.vision.dino / model.vision.siglip first and pass "
                "allow_missing_vision=True)"
                if vision_only_missing
                else ""
            )
            parts.append(f"missing {len(missing)}: {_fmt(missing)}{hint}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)}: {_fmt(unexpected)}")
        raise CheckpointKeyError("checkpoint does not match the model; " + "; ".join(parts))
    for key, value in state.items():
        if tuple(value.shape) != tuple(targets[key].shape):
            raise ValueError(
                f"{key}: checkpoint shape {tuple(value.shape)} != model shape {tuple(targets[key].shape)}"
            )
    for key, value in state.items():
        targets[key].copy_(value)


_STEP = re.compile(r"^step-(\d+)")


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """The ``checkpoints/step-*.pt`` file to load: the given step, else the highest step.

    Falls back to ``checkpoints/latest-checkpoint.pt`` when no step file exists.
    """
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} has no checkpoints/ directory")
    found: dict[int, Path] = {}
    for path in ckpt_dir.glob("step-*.pt"):
        match = _STEP.match(path.name)
        if match:
            found.setdefault(int(match.group(1)), path)
    if step is not None:
        if step not in found:
            raise FileNotFoundError(
                f"no checkpoint for step {step} in {ckpt_dir}; have steps {sorted(found)}"
            )
        return found[step]
    if found:
        return found[max(found)]
    latest = ckpt_dir / "latest-checkpoint.pt"
    if latest.exists():
        return latest
    raise FileNotFoundError(f"no step-*.pt or latest-checkpoint.pt in {ckpt_dir}")


@dataclass(frozen=True)
class PrismaticRun:
    """What a run directory says about the model (config.json + dataset_statistics.json).

    Attributes:
        model_config: the architecture (from the base-VLM registry, or our own ``wmrl_model`` entry).
        dataset_statistics: per-dataset action statistics for un-normalisation.
        checkpoint: the ``.pt`` file holding the weights.
        vla: the raw ``vla`` section of config.json.
    """

    model_config: MiniVLAConfig
    dataset_statistics: dict[str, Any]
    checkpoint: Path
    vla: dict[str, Any]


def resolve_base_vlm(base: Any, override: str | None = None) -> str:
    """The base-VLM model id of a run's ``vla.base_vlm``, as openvla-mini's ``load_vla`` resolves it.

    Public fine-tuning scripts pass ``--vla.base_vlm <local snapshot folder>``; upstream then reads
    ``<folder>/config.json["model"]["model_id"]``. We do the same when that folder exists here; a
    path that does not exist on this machine is accepted when its last component is a known id,
    otherwise ``override`` (the model id) must be given.

    Raises:
        ValueError: the id is unknown, or the path cannot be resolved (the message says how to fix it).
    """
    if override is not None:
        base = override
    elif isinstance(base, str) and ("/" in base or Path(base).is_dir()):
        folder = Path(base).expanduser()
        if (folder / "config.json").is_file():
            data = json.loads((folder / "config.json").read_text())
            model_id = data.get("model", {}).get("model_id") if isinstance(data.get("model"), dict) else None
            if not isinstance(model_id, str):
                raise ValueError(f"base_vlm folder {folder} has no config.json['model']['model_id']")
            base = model_id
        elif folder.name in BASE_VLMS:
            base = folder.name
        else:
            raise ValueError(
                f"vla.base_vlm is the folder {str(folder)!r}, which is not on this machine (or has no "
                f"config.json); give the base VLM's model id instead (one of {sorted(BASE_VLMS)})"
            )
    if base not in BASE_VLMS:
        raise ValueError(f"unknown base_vlm {base!r}; this loader knows {sorted(BASE_VLMS)}")
    return base


def images_per_step(vla: Mapping[str, Any]) -> int:
    """The images a step reads under a run's ``vla`` section: 1, or 2 for the wrist-camera variant.

    openvla-mini feeds ``obs_history`` frames of the third-person camera, interleaved with as many wrist
    frames when ``use_wrist_image``; ``image_sequence_len`` counts them all. The wrist variant without
    history (``-wrist``: 2 images, third-person then wrist) is implemented; history (``-t2``) is not.

    Raises:
        NotImplementedError: an image history.
    """
    length = int(vla.get("image_sequence_len", 1))
    wrist = bool(vla.get("use_wrist_image", False))
    if length != (2 if wrist else 1):
        raise NotImplementedError(
            f"image_sequence_len={length} with use_wrist_image={wrist} is an image-history MiniVLA "
            "variant (-t2), which is not supported; one frame a step (optionally with the wrist image) is"
        )
    return length


def read_run(run_dir: str | Path, step: int | None = None, base_vlm: str | None = None) -> PrismaticRun:
    """Parse a Prismatic VLA run directory (without loading weights).

    ``base_vlm`` overrides ``config.json``'s ``vla.base_vlm`` (a model id; see :func:`resolve_base_vlm`).

    Raises:
        FileNotFoundError: a required file is missing.
        NotImplementedError: a variant this loader does not implement (VQ action chunking, image history).
        ValueError: an unknown base VLM.
    """
    run_dir = Path(run_dir)
    config_path, stats_path = run_dir / "config.json", run_dir / "dataset_statistics.json"
    for path in (config_path, stats_path):
        if not path.is_file():
            raise FileNotFoundError(f"Prismatic run directory {run_dir} lacks {path.name}")
    config = json.loads(config_path.read_text())
    if "vla" not in config:
        raise ValueError(f"{config_path} has no 'vla' section: not a Prismatic VLA run directory")
    vla = dict(config["vla"])
    action_tokenizer = vla.get("action_tokenizer", "action_tokenizer")
    if action_tokenizer not in SUPPORTED_ACTION_TOKENIZERS:
        raise NotImplementedError(
            f"action_tokenizer {action_tokenizer!r} is not supported (only {SUPPORTED_ACTION_TOKENIZERS}); "
            "VQ action chunking (minivla-vq-*) needs the external vqvae package"
        )
    images = images_per_step(vla)
    if "wmrl_model" in config:
        model_config = MiniVLAConfig.from_json(config["wmrl_model"])
    else:
        model_config = BASE_VLMS[resolve_base_vlm(vla.get("base_vlm"), base_vlm)]
    model_config = replace(model_config, image_sequence_len=images)
    stats = json.loads(stats_path.read_text())
    return PrismaticRun(model_config, stats, find_checkpoint(run_dir, step), vla)


def load_checkpoint_groups(path: str | Path) -> dict[str, Mapping[str, torch.Tensor]]:
    """``torch.load(path)["model"]`` with ``weights_only=True`` (tensors and dicts only) and mmap."""
    payload = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(payload, Mapping) or "model" not in payload:
        raise ValueError(f"{path}: expected a dict with a 'model' entry (a Prismatic checkpoint)")
    groups = payload["model"]
    for required in ("projector", "llm_backbone"):
        if required not in groups:
            raise CheckpointKeyError(f"{path}: the checkpoint has no {required!r} state dict")
    return dict(groups)


def write_run(
    run_dir: str | Path,
    state: Mapping[str, torch.Tensor],
    model_config: MiniVLAConfig,
    dataset_statistics: Mapping[str, Any],
    tokenizer: Any | None = None,
    step: int = 0,
    vla: Mapping[str, Any] | None = None,
) -> Path:
    """Write a Prismatic-format run directory from our-key-space ``state`` (architecture saved as ``wmrl_model``).

    A tied LM head is written like Prismatic's (FSDP) checkpoints do, under both names.

    Returns:
        The checkpoint path.
    """
    run_dir = Path(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    flat = {k: v.detach().cpu().clone() for k, v in state.items()}
    if model_config.llm.get("tie_word_embeddings", False) and _EMBED in flat:
        flat[_TIED_HEAD] = flat[_EMBED]
    groups = ours_to_prismatic(flat)
    ckpt = run_dir / "checkpoints" / f"step-{step:06d}-epoch-00-loss=inf.pt"
    torch.save({"model": groups}, ckpt)
    vla_section = {
        "vla_id": model_config.name,
        "base_vlm": model_config.name,
        "action_tokenizer": "extra_action_tokenizer",
        "image_sequence_len": model_config.image_sequence_len,
        "use_wrist_image": model_config.image_sequence_len == 2,
        **(vla or {}),
    }
    config = {"vla": vla_section, "wmrl_model": model_config.to_json()}
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))
    (run_dir / "dataset_statistics.json").write_text(json.dumps(dataset_statistics, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(run_dir / "tokenizer"))
    return ckpt
