"""Typed configuration: frozen dataclasses built from dicts, files and ``key=value`` overrides.

Every config in WMRL is a frozen dataclass that validates itself in ``__post_init__``. This
module turns plain data into those dataclasses *strictly*: an unknown key, a value of the wrong
type or a malformed override raises :class:`ConfigError` naming the key, never a silent default.
A resolved config round-trips through :func:`to_dict` / :func:`from_dict`, which is what every run
writes next to its outputs.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

__all__ = ["ConfigError", "apply_overrides", "from_dict", "load_config", "require", "to_dict"]


class ConfigError(ValueError):
    """A configuration value broke a rule; the message names the key and the rule."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds (for ``__post_init__``)."""
    if not condition:
        raise ConfigError(message)


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config dataclass."""

    def convert(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Enum):
            return value.value
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        return value

    return convert(config)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)) and len(args) == 1:
            return True, args[0]
    return False, tp


def _coerce(value: Any, tp: Any, where: str) -> Any:
    optional, inner = _is_optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise ConfigError(f"{where}: None is not allowed here (expected {getattr(tp, '__name__', tp)})")
    tp = inner
    if tp is Any:
        return value
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table of settings, got {type(value).__name__}")
        return from_dict(tp, value, _where=where)
    if origin is typing.Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (tuple, list, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if origin in (Union, types.UnionType):
        for arm in get_args(tp):
            try:
                return _coerce(value, arm, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} matches none of {tp}")
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{where}: must be one of {[e.value for e in tp]}, got {value!r}") from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError(f"{where}: expected a path, got {value!r}")
        return Path(value)
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], _where: str = "") -> T:
    """Build the dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{_where or cls.__name__}: expected a table of settings, got {type(data).__name__}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{_where}." if _where else ""
        raise ConfigError(
            f"unknown config key(s) {[prefix + k for k in unknown]} for {cls.__name__}; "
            f"known keys: {sorted(fields)}"
        )
    hints = get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        where = f"{_where}.{name}" if _where else name
        kwargs[name] = _coerce(value, hints[name], where)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ConfigError(f"{_where or cls.__name__}: {err}") from None


def _parse_scalar(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (values parsed as JSON where they parse)."""
    result: dict[str, Any] = json.loads(json.dumps(dict(data), default=str))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r} has an empty key")
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a table of settings")
            node = child
        node[parts[-1]] = _parse_scalar(raw)
    return result


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Load ``cls`` from a JSON or TOML file (or its defaults), then apply ``key=value`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        text = path.read_text()
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {path} must be .json or .toml")
    if overrides:
        base = to_dict(from_dict(cls, data)) if data else to_dict(cls())
        data = apply_overrides(base, overrides)
    return from_dict(cls, data)
