"""Typed configuration: frozen dataclasses built from dicts, files and ``key=value`` overrides.

Every config in WMRL is a frozen dataclass that validates itself in ``__post_init__``. This
module turns plain data into those dataclasses *strictly*: an unknown key, a value of the wrong
type or a malformed override raises :class:`ConfigError` naming the key, never a silent default.
A resolved config round-trips through :func:`to_dict` / :func:`from_dict`, which is what every run
writes next to its outputs.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeGuard, TypeVar, Union, cast, get_args, get_origin, get_type_hints

T = TypeVar("T")

__all__ = [
    "ConfigError",
    "apply_overrides",
    "from_dict",
    "is_dataclass_hint",
    "load_config",
    "parse_value",
    "read_config_file",
    "require",
    "to_dict",
]


class ConfigError(ValueError):
    """A configuration value broke a rule; the message names the key and the rule."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds (for ``__post_init__``)."""
    if not condition:
        raise ConfigError(message)


def require_int(value: object, name: str, low: int = 1) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an int (not a bool) ``>= low``."""
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= low,
        f"{name} must be an integer >= {low}; got {value!r}",
    )


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

    return cast("dict[str, Any]", convert(config))


def is_dataclass_hint(tp: object) -> TypeGuard[type[Any]]:
    """:func:`dataclasses.is_dataclass` on a type hint (a class, not an instance), typed as a class."""
    return dataclasses.is_dataclass(tp)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)) and len(args) == 1:
            return True, args[0]
    return False, tp


def _coerce(value: Any, tp: Any, where: str) -> Any:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    optional, inner = _is_optional(tp)
    if value is None:
        if optional or tp is Any or type(None) in get_args(tp):
            return None
        if get_origin(tp) is typing.Literal and "none" in get_args(tp):
            # `fusion.mode=none` on a command line reads as YAML's null: the choice named "none"
            return "none"
        if tp is str or str in get_args(tp):
            # a setting that cannot be None but takes text (`cameras=none`): the word the user typed
            return "none"
        raise ConfigError(f"{where}: None is not allowed here (expected {getattr(tp, '__name__', tp)})")
    tp = inner
    if tp is Any:
        return value
    origin = get_origin(tp)
    if is_dataclass_hint(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table of settings, got {type(value).__name__}")
        return _from_dict(tp, value, _where=where)
    if origin is typing.Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (tuple, list, Sequence):
        if isinstance(value, (bytes, Mapping)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        if isinstance(value, str) or not isinstance(value, Sequence):
            value = [value]  # one value where a list is expected: a list of one (tasks.ids=iris)
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
            if arm is type(None):  # a value is never None here (handled above)
                continue
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


class UnknownKeyError(ConfigError):
    """Keys that no field of the config has; the message suggests the nearest known ones."""

    def __init__(self, keys: list[str], owner: str, known: list[str], hints: list[str] | None = None) -> None:
        self.keys, self.owner, self.known = keys, owner, known
        hint = f" ({'; '.join(hints)})" if hints else ""
        super().__init__(f"unknown config key(s) {keys} for {owner}{hint}; known keys: {known}")


def dotted_keys(cls: type) -> list[str]:
    """Every setting of the config class ``cls`` as a dotted key (``corrector.scheduler.fraction``)."""
    out: list[str] = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        _, inner = _is_optional(hints[f.name])
        if is_dataclass_hint(inner):
            out.extend(f"{f.name}.{k}" for k in dotted_keys(inner))
        else:
            out.append(f.name)
    return out


def from_dict(cls: type[T], data: Mapping[str, Any], _where: str = "") -> T:
    """Build the dataclass ``cls`` from ``data``, rejecting unknown keys (with a "did you mean" over
    every dotted key of ``cls``) and wrong types."""
    if _where:
        return _from_dict(cls, data, _where)
    try:
        return _from_dict(cls, data, _where)
    except UnknownKeyError as err:
        candidates = dotted_keys(cls)
        hints = []
        for key in err.keys:
            last = key.rsplit(".", 1)[-1]
            # a misplaced key (the same name under another section) first, then a misspelt one
            close = [c for c in candidates if c.rsplit(".", 1)[-1] == last][:1]
            # a misplaced section (model.lora -> lora.*)
            close = close or [f"{last}.*" for c in candidates if c.startswith(f"{last}.")][:1]
            close = close or difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
            close = (
                close
                or [
                    c
                    for c in candidates
                    if difflib.get_close_matches(last, [c.rsplit(".", 1)[-1]], cutoff=0.8)
                ][:1]
            )
            if close:
                hints.append(f"{key} -> did you mean {close[0]}?")
        raise UnknownKeyError(err.keys, err.owner, err.known, hints) from None


def _is_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _section_default(f: dataclasses.Field[Any]) -> Any | None:
    """The default of the field ``f`` when it is a section of settings (a dataclass instance), else ``None``."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return None
    return value if _is_instance(value) else None


def _over_section(default: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """The settings ``given`` for a section, over its field's default instance ``default``.

    A section named in a config or an override keeps the defaults its *parent* gives it for the keys
    it does not set, not the section class's own: ``wmrl train autoresearch-sft model.device=cuda``
    keeps that stage's ``model.path`` (``smollm2``, where ``ModelSection`` says ``smollm2-warm``), and
    ``corrector.scheduler.fraction=0.25`` keeps the domain's calibration defaults. Keys that are not
    settings stay in, so that they are refused by name.
    """
    merged: dict[str, Any] = {}
    for f in dataclasses.fields(default):
        if not f.init:
            continue
        current = getattr(default, f.name)
        if f.name in given:
            value = given[f.name]
            if _is_instance(current) and isinstance(value, Mapping):
                value = _over_section(current, value)
        else:
            value = _over_section(current, {}) if _is_instance(current) else to_dict(current)
        merged[f.name] = value
    merged.update({k: v for k, v in given.items() if k not in merged})
    return merged


def _from_dict(cls: type[T], data: Mapping[str, Any], _where: str = "") -> T:
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
        raise UnknownKeyError([prefix + str(k) for k in unknown], cls.__name__, sorted(fields))
    hints = get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        where = f"{_where}.{name}" if _where else name
        default = _section_default(fields[name])
        if default is not None and isinstance(value, Mapping):
            value = _over_section(default, value)
        kwargs[name] = _coerce(value, hints[name], where)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:  # a component's own validation: a config error here
        raise ConfigError(f"{_where or cls.__name__}: {err}") from None


def _split_top_level(text: str) -> list[str]:
    """Split ``a, [b, c], "d,e"`` at the commas that are not inside brackets or quotes."""
    parts, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            current.append(char)
            if char == quote:
                quote = ""
            continue
        if char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def parse_value(text: str) -> Any:
    """An override's value: JSON where it parses, ``[a, b]`` lists of bare words, else the text itself.

    ``true``/``false``/``none``/``null`` in any case are booleans and ``None``; ``tasks.ids=[iris,wine]``
    needs no JSON quoting (each element is parsed by the same rule: ``[0, 1]`` are integers).
    """
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    if stripped.startswith("[") and stripped.endswith("]"):
        inner = stripped[1:-1].strip()
        if not inner:
            return []
        return [parse_value(part) for part in _split_top_level(inner)]
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        return stripped[1:-1]
    return text


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (values parsed by :func:`parse_value`)."""
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
        node[parts[-1]] = parse_value(raw)
    return result


_FORMATS = {".json": "JSON", ".toml": "TOML", ".yaml": "YAML", ".yml": "YAML"}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings in a ``.json``, ``.toml`` or ``.yaml``/``.yml`` file, as a dict.

    Raises:
        ConfigError: the file does not exist, is a directory, has another suffix, does not parse
            (the parser's message, with its line), or does not hold a table of settings at the top.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory, not a .json/.toml/.yaml file")
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(f"config file {path} must end in .json, .toml, .yaml or .yml")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} cannot be read: {err}") from None
    try:
        if fmt == "JSON":
            data = json.loads(text)
        elif fmt == "TOML":
            import tomllib

            data = tomllib.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                raise ConfigError(
                    f"config file {path} is YAML, which needs PyYAML: pip install pyyaml"
                ) from None
            data = yaml.safe_load(text)
    except ConfigError:
        raise
    except Exception as err:  # each parser raises its own error type; all mean "malformed"
        message = " ".join(str(err).split())
        raise ConfigError(f"config file {path} is not valid {fmt}: {message}") from None
    if data is None and fmt == "YAML":
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path} must hold a table of settings, not {type(data).__name__}")
    return dict(data)


def load_config(
    cls: type[T],
    source: str | Path | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    presets: Mapping[str, Mapping[str, Any]] | None = None,
) -> T:
    """Build the config dataclass ``cls`` from a source, then ``key=value`` overrides, in ONE validation.

    Args:
        cls: the config dataclass.
        source: ``None`` (the defaults), a mapping, the name of one of ``presets``, or a
            ``.json``/``.toml``/``.yaml`` file (for example a run's ``config.json``).
        overrides: ``a.b=value`` strings applied to the source's settings *before* validation, so that
            rules that depend on several keys (a mode and the corrector it presets) see the final values.
        presets: named configurations (plain data over the defaults).

    Raises:
        ConfigError: unknown preset or file, malformed file, unknown key (with a "did you mean"),
            wrong type or a broken rule, each naming the key.
    """
    data: dict[str, Any]
    if source is None:
        data = {}
    elif isinstance(source, Mapping):
        data = dict(source)
    elif presets is not None and str(source) in presets:
        data = json.loads(json.dumps(presets[str(source)]))
    else:
        path = Path(source)
        if not path.suffix and not path.exists() and presets:
            raise ConfigError(
                f"--config {source!r} is neither a preset ({sorted(presets)}) nor a .json/.toml/.yaml file"
            )
        data = read_config_file(path)
    source_data = data
    if overrides:
        data = apply_overrides(data, overrides)
    baseline = getattr(cls, "baseline", None)
    if source is not None and callable(
        baseline
    ):  # a preset or a file is a starting point (see TrainConfigBase)
        with baseline(source_data):
            return from_dict(cls, data)
    return from_dict(cls, data)
