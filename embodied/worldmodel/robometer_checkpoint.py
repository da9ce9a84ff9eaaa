"""Read and write Robometer checkpoints (the layout ``robometer/Robometer-4B`` ships) by an explicit key mapping.

A Robometer checkpoint folder holds ``config.json`` (the ``Qwen3VLConfig`` of the backbone, text
vocabulary resized to the tokenizer), ``config.yaml`` (Robometer's experiment config: progress loss
type and bin count, input mode), the weights as ``model.safetensors`` or shards listed in
``model.safetensors.index.json``, and possibly the tokenizer files. The weights are the state dict of
Robometer's ``RBM`` module, whose ``model`` attribute is a ``transformers.Qwen3VLModel``.

Key mapping (theirs -> ours), applied to every tensor; any other key is an error:

=====================================================  ==========================================
Robometer checkpoint key                               :class:`RobometerModel` key
=====================================================  ==========================================
``model.visual.<rest>``                                ``backbone.visual.<rest>``
``model.language_model.<rest>``                        ``backbone.language_model.<rest>``
``model.model.visual.<rest>`` / ``.language_model.``   same as above (lerobot's re-export, which wraps
                                                       a ``Qwen3VLForConditionalGeneration``)
``model.lm_head.weight``                               dropped (lerobot's tied, unused LM head)
``{progress,success,preference}_head.0.{weight,bias}`` ``<head>.fc_in.{weight,bias}``
``{progress,success,preference}_head.1.{weight,bias}`` ``<head>.norm.{weight,bias}``
``{progress,success,preference}_head.4.{weight,bias}`` ``<head>.fc_out.{weight,bias}``
``frame_pool_attn.weight``                             ``frame_pool_attn.weight``
=====================================================  ==========================================

Indices 2 (GELU) and 3 (Dropout) of Robometer's ``nn.Sequential`` heads hold no weights. Loading is
strict: a missing or unexpected tensor raises :class:`CheckpointKeyError` listing the keys. PEFT
adapter checkpoints (``adapter_config.json``) are rejected with a clear error: merge them first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from wmrl.embodied.worldmodel.robometer_config import ImageConfig, RobometerConfig

__all__ = [
    "CheckpointKeyError",
    "load_robometer_state",
    "ours_to_robometer",
    "read_robometer_config",
    "read_safetensors_dir",
    "robometer_to_ours",
    "write_robometer_dir",
]

HEADS = ("progress_head", "success_head", "preference_head")
_THEIR_TO_OUR_LAYER = {"0": "fc_in", "1": "norm", "4": "fc_out"}
_OUR_TO_THEIR_LAYER = {v: k for k, v in _THEIR_TO_OUR_LAYER.items()}
_DROPPED = ("model.lm_head.weight",)
_BACKBONE_PARTS = ("visual.", "language_model.")


class CheckpointKeyError(KeyError):
    """Checkpoint tensors that do not map onto the model (or model tensors the checkpoint lacks)."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0]) if self.args else ""


def _fmt(keys: list[str], limit: int = 20) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def robometer_to_ours(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a Robometer checkpoint's tensors to :class:`RobometerModel` keys (see the module table).

    Raises:
        CheckpointKeyError: a key matches no rule (all such keys are listed).
    """
    out: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    for key, value in state.items():
        if key in _DROPPED:
            continue
        name = key[len("model.") :] if key.startswith("model.model.") else key
        if name.startswith("model.") and name[len("model.") :].startswith(_BACKBONE_PARTS):
            out["backbone." + name[len("model.") :]] = value
            continue
        head, _, rest = name.partition(".")
        layer, _, param = rest.partition(".")
        if head in HEADS and layer in _THEIR_TO_OUR_LAYER and param in ("weight", "bias"):
            out[f"{head}.{_THEIR_TO_OUR_LAYER[layer]}.{param}"] = value
        elif name == "frame_pool_attn.weight":
            out[name] = value
        else:
            unmapped.append(key)
    if unmapped:
        raise CheckpointKeyError(
            f"{len(unmapped)} checkpoint tensors match no Robometer key rule: {_fmt(sorted(unmapped))}"
        )
    return out


def ours_to_robometer(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`robometer_to_ours` (Robometer's own ``RBM`` layout, no lerobot prefixes)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith("backbone."):
            out["model." + key[len("backbone.") :]] = value
            continue
        head, _, rest = key.partition(".")
        layer, _, param = rest.partition(".")
        if head in HEADS and layer in _OUR_TO_THEIR_LAYER:
            out[f"{head}.{_OUR_TO_THEIR_LAYER[layer]}.{param}"] = value
        elif key == "frame_pool_attn.weight":
            out[key] = value
        else:
            raise CheckpointKeyError(f"model tensor {key!r} has no Robometer checkpoint name")
    return out


def read_safetensors_dir(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder: the shards of ``model.safetensors.index.json``, else ``model*.safetensors``."""
    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({path / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that are not there: {missing}")
    else:
        files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no model*.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file), device=device))
    return state


def _read_experiment_yaml(path: Path) -> dict[str, Any]:
    import yaml

    class _Loader(yaml.SafeLoader):
        """A safe loader that reads Python-object tags (Robometer saves some dataclasses) as plain mappings."""

    def _as_mapping(loader: Any, suffix: str, node: Any) -> Any:
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", _as_mapping)
    data = yaml.load(path.read_text(), Loader=_Loader)
    return data if isinstance(data, dict) else {}


def read_robometer_config(path: str | Path, vocab_rows: int | None = None) -> RobometerConfig:
    """The :class:`RobometerConfig` of a checkpoint folder (``config.json`` + optional ``config.yaml``).

    Args:
        vocab_rows: the embedding rows found in the weights; when given and different from
            ``config.json``'s text vocabulary, the weights win (an unresized base config is a known
            slip when checkpoints are re-saved).

    Raises:
        ValueError: a Robometer variant this implementation does not run (continuous progress head,
            video input mode, no per-frame progress tokens, non-Qwen3-VL backbone).
    """
    path = Path(path)
    config_json = path / "config.json"
    if not config_json.is_file():
        raise FileNotFoundError(f"{path} has no config.json (the backbone's Qwen3VLConfig)")
    if (path / "adapter_config.json").is_file():
        raise ValueError(f"{path} is a PEFT adapter checkpoint; merge the adapters into the weights first")
    backbone = json.loads(config_json.read_text())
    if backbone.get("model_type") != "qwen3_vl":
        raise ValueError(
            f"{config_json}: model_type must be 'qwen3_vl' (Robometer-4B's backbone); got {backbone.get('model_type')!r}"
        )
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        backbone.pop(key, None)
    n_bins = 10
    resized = None
    experiment = path / "config.yaml"
    if experiment.is_file():
        exp = _read_experiment_yaml(experiment)
        model, loss = exp.get("model", {}) or {}, exp.get("loss", {}) or {}
        loss_type = str(loss.get("progress_loss_type", model.get("progress_loss_type", "discrete"))).lower()
        if loss_type != "discrete":
            raise ValueError(
                f"{experiment}: progress_loss_type {loss_type!r} is not supported (only the discrete-bin head)"
            )
        n_bins = int(loss.get("progress_discrete_bins", model.get("progress_discrete_bins", n_bins)))
        if model.get("use_per_frame_progress_token") is False:
            raise ValueError(
                f"{experiment}: only checkpoints trained with use_per_frame_progress_token=True are supported"
            )
        if model.get("use_multi_image") is False:
            raise ValueError(
                f"{experiment}: only multi-image input checkpoints are supported (not video mode)"
            )
        data = exp.get("data", {}) or {}
        h, w = data.get("resized_height"), data.get("resized_width")
        if (h is None) != (w is None):
            raise ValueError(f"{experiment}: data.resized_height and data.resized_width must be set together")
        resized = None if h is None or w is None else (int(h), int(w))  # both or neither (checked above)
        base = str(model.get("base_model_id", "Qwen3-VL"))
        if "Qwen3" not in base:
            raise ValueError(f"{experiment}: base model {base!r} is not a Qwen3-VL model")
    # Frames are cut into the vision tower's own patches (16 px, 2x2 merge, 2 frames for Robometer-4B;
    # a model trained here may use smaller patches), so the preprocessing follows its config.
    vision = backbone.get("vision_config") or {}
    image = ImageConfig(
        patch_size=int(vision.get("patch_size", 16)),
        merge_size=int(vision.get("spatial_merge_size", 2)),
        temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
    )
    config = RobometerConfig(
        backbone=backbone, n_bins=n_bins, name=path.name, data_resized=resized, image=image
    )
    if vocab_rows is not None and vocab_rows != config.vocab_size:
        config = config.with_vocab(vocab_rows)
    return config


def load_robometer_state(
    path: str | Path, device: str = "cpu"
) -> tuple[RobometerConfig, dict[str, torch.Tensor]]:
    """Config and our-key tensors of a Robometer checkpoint folder (nothing is instantiated)."""
    raw = read_safetensors_dir(path, device=device)
    state = robometer_to_ours(raw)
    embed = state.get("backbone.language_model.embed_tokens.weight")
    if embed is None:
        raise CheckpointKeyError(
            f"{path}: the checkpoint has no text embedding (model.language_model.embed_tokens.weight)"
        )
    return read_robometer_config(path, vocab_rows=int(embed.shape[0])), state


def write_robometer_dir(
    path: str | Path,
    state: Mapping[str, torch.Tensor],
    config: RobometerConfig,
    tokenizer: Any | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write ``state`` (our keys) as a Robometer checkpoint folder; shards + index when ``max_shard_bytes`` is set."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    theirs = {k: v.detach().cpu().contiguous() for k, v in ours_to_robometer(state).items()}
    if max_shard_bytes is None:
        save_file(theirs, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        for key in sorted(theirs):
            nbytes = theirs[key].numel() * theirs[key].element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][key] = theirs[key]
            size += nbytes
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(path / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in theirs.values())},
            "weight_map": weight_map,
        }
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    backbone = {**config.backbone, "architectures": ["RBM"]}
    (path / "config.json").write_text(json.dumps(backbone, indent=2))
    experiment = (
        "# Robometer experiment config (the fields WMRL reads; written by wmrl)\n"
        "model:\n"
        "  base_model_id: Qwen/Qwen3-VL-4B-Instruct\n"
        "  use_multi_image: true\n"
        "  use_per_frame_progress_token: true\n"
        "loss:\n"
        "  progress_loss_type: discrete\n"
        f"  progress_discrete_bins: {config.n_bins}\n"
        "data:\n"
        f"  resized_height: {'null' if config.data_resized is None else config.data_resized[0]}\n"
        f"  resized_width: {'null' if config.data_resized is None else config.data_resized[1]}\n"
    )
    (path / "config.yaml").write_text(experiment)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path
