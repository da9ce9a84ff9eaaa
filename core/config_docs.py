"""Documentation of config dataclasses, read from their docstrings: ``--print-config`` and ``--help``.

Every config class documents its fields in a Google-style ``Attributes:`` section
(``name: text``, several names sharing one entry as ``a / b / c: text`` or ``a, b: text``). From
that, :func:`annotated_yaml` renders a *resolved* config as YAML with each key's documentation and,
where it differs, its default, as a comment: the text ``--print-config`` prints. It is valid YAML
that loads back to the same settings (``--config`` takes it), so what is printed is what runs.
:func:`key_listing` lists every dotted key with its type, default and documentation for
``wmrl train DOMAIN --help``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import re
import textwrap
import typing
from enum import Enum
from pathlib import Path
from typing import Any, get_type_hints

from wmrl.core.config import is_dataclass_hint

__all__ = ["annotated_yaml", "field_docs", "key_listing", "yaml_scalar"]

_ENTRY = re.compile(r"^(?P<names>[A-Za-z_][\w]*(?:\s*(?:,|/)\s*[A-Za-z_][\w]*)*)\s*:\s*(?P<text>.*)$")
_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``field name -> documentation`` from the ``Attributes:`` sections of ``cls`` and its bases.

    A subclass's entry wins over its base's (a domain config re-documents a shared field's default).
    """
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and "__doc__" in vars(klass):
            out.update(_own_field_docs(klass.__doc__))
    return out


def _own_field_docs(docstring: str | None) -> dict[str, str]:
    doc = inspect.cleandoc(docstring or "")
    lines = doc.splitlines()
    out: dict[str, str] = {}
    inside, base_indent, current = False, None, None
    for line in lines:
        stripped = line.strip()
        if not inside:
            head, _, rest = stripped.partition("Attributes:")
            if head == "" and stripped.startswith("Attributes:"):
                inside = True
                if rest.strip():  # "Attributes: name: text" on one line
                    line, stripped = rest, rest.strip()
                else:
                    continue
            else:
                continue
        if not stripped:
            current = None
            continue
        indent = len(line) - len(line.lstrip())
        if _SECTION.match(stripped) and (base_indent is None or indent <= base_indent):
            break  # the next section (Raises:, Example:)
        match = _ENTRY.match(stripped)
        if match and (base_indent is None or indent <= base_indent):
            base_indent = indent if base_indent is None else base_indent
            names = re.split(r"\s*(?:,|/)\s*", match["names"])
            current = names
            for name in names:
                out[name] = match["text"].strip()
        elif current is not None:  # a continuation line of the current entry
            for name in current:
                out[name] = f"{out[name]} {stripped}".strip()
    return out


def yaml_scalar(value: Any) -> str:
    """``value`` as a YAML flow scalar or sequence that PyYAML (YAML 1.1) loads back exactly."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        if "e" in text:
            mantissa, exponent = text.split("e")
            if "." not in mantissa:
                mantissa += ".0"  # YAML 1.1 reads 1e-05 as a string, 1.0e-05 as a float
            if exponent[0] not in "+-":
                exponent = "+" + exponent
            text = f"{mantissa}e{exponent}"
        return text
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {yaml_scalar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot render {type(value).__name__} in a config")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list[{_type_name(args[0])}]" if args else "list"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return " | ".join(str(m.value) for m in tp)
    return getattr(tp, "__name__", str(tp))


def _comment(doc: str, default: Any, value: Any, indent: str, width: int = 100) -> list[str]:
    text = doc
    if default is not dataclasses.MISSING and default != value:
        text = f"{text} [default: {yaml_scalar(default)}]".strip()
    if not text:
        return []
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width=max(40, width - len(indent) - 2))]


def _default_of(parent_default: Any, name: str, klass: type | None = None) -> Any:
    """The default of field ``name``: from the parent's default instance, else the field's own default."""
    if parent_default is not dataclasses.MISSING:
        return getattr(parent_default, name)
    return _field_default(klass, name)


def _field_default(klass: type | None, name: str) -> Any:
    """The default of ``klass``'s field ``name`` (its own or its factory's), else ``dataclasses.MISSING``."""
    if klass is None:
        return dataclasses.MISSING
    f = next((f for f in dataclasses.fields(klass) if f.name == name), None)
    if f is None:
        return dataclasses.MISSING
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def annotated_yaml(config: Any, defaults: Any = None, header: str | None = None) -> str:
    """The config as YAML, each key preceded by its documentation (and default where it differs).

    Args:
        config: a (resolved) config dataclass instance.
        defaults: the instance to compare against for ``[default: ...]`` (default: ``type(config)()``).
        header: comment lines printed first.
    """
    if defaults is None:
        try:
            defaults = type(config)()
        except Exception:  # a config with required settings has no default instance
            defaults = dataclasses.MISSING
    lines = [f"# {h}" for h in (header or "").splitlines()]

    def walk(obj: Any, default: Any, depth: int) -> None:
        indent = "  " * depth
        klass: type = type(obj)
        docs = field_docs(klass)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            sub_default = _default_of(default, f.name, klass)
            if dataclasses.is_dataclass(value):
                lines.extend(_comment(docs.get(f.name, ""), dataclasses.MISSING, None, indent))
                lines.append(f"{indent}{f.name}:")
                walk(value, sub_default, depth + 1)
            else:
                lines.extend(_comment(docs.get(f.name, ""), sub_default, value, indent))
                lines.append(f"{indent}{f.name}: {yaml_scalar(value)}")

    walk(config, defaults, 0)
    return "\n".join(lines) + "\n"


def key_listing(cls: type, width: int = 100) -> str:
    """Every dotted key of the config class ``cls``: type, default and documentation, one block each."""
    lines: list[str] = []

    def walk(klass: type, prefix: str, default: Any) -> None:
        hints = get_type_hints(klass)
        docs = field_docs(klass)
        for f in dataclasses.fields(klass):
            key = f"{prefix}{f.name}"
            sub_default = _default_of(default, f.name, klass)
            tp = hints[f.name]
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            klass_of = tp if dataclasses.is_dataclass(tp) else (inner[0] if len(inner) == 1 else None)
            if klass_of is not None and is_dataclass_hint(klass_of):
                walk(klass_of, f"{key}.", sub_default)
                continue
            shown = "" if sub_default is dataclasses.MISSING else f" = {yaml_scalar(sub_default)}"
            lines.append(f"  {key} ({_type_name(tp)}){shown}")
            doc = docs.get(f.name, "")
            if doc:
                lines.extend(
                    textwrap.wrap(doc, width=width, initial_indent="      ", subsequent_indent="      ")
                )

    try:
        default = cls()
    except Exception:  # a config with required settings has no default instance: per-field defaults
        default = dataclasses.MISSING
    walk(cls, "", default)
    return "\n".join(lines)
