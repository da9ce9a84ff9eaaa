"""The world model's structured prediction and the robust parser of its JSON output.

A prediction is one JSON object::

    {"status": "runtime_error", "error_type": "KeyError", "error_line": 12,
     "position": null, "output": "Traceback (most recent call last): ..."}

Parsing (:func:`parse_prediction`) is forgiving about the wrapping and strict about the content:

1. ``<think>...</think>`` blocks are removed (an unclosed ``<think>`` swallows the rest: a model
   that never stopped thinking gave no answer);
2. every balanced ``{...}`` (string-aware) is a candidate, the last one first; a candidate is
   read as JSON, then with trailing commas removed, then as a Python literal (single quotes,
   True/None), and the first that reads as an object *with a valid schema* wins;
3. if none does, a truncated final object (the model hit its token cap inside ``"output"``) is
   closed (open string and brackets) and tried once more;
4. schema: ``status`` must name a known outcome (a few aliases such as ``runtime_err`` are
   accepted); a ``valid`` outcome needs ``position`` in [0, 1]; ``error_line`` and
   ``error_type`` are kept when well-formed and dropped otherwise (they do not enter the reward).

Anything else raises :class:`PredictionParseError` with the reason; the caller treats the sample
as unknown, never as a fixed score.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STATUS_ALIASES",
    "WM_STATUSES",
    "Prediction",
    "PredictionParseError",
    "candidate_objects",
    "parse_prediction",
]

#: Outcomes the world model predicts (the grading ladder's statuses minus ``killed`` and
#: ``harness_error``, which are not properties of a script a reader could foresee).
WM_STATUSES = ("syntax_error", "runtime_error", "timeout", "no_submission", "invalid_submission", "valid")

#: Spellings accepted for a status (the official release's names among them).
STATUS_ALIASES = {
    "syntax_err": "syntax_error",
    "syntaxerror": "syntax_error",
    "runtime_err": "runtime_error",
    "runtimeerror": "runtime_error",
    "error": "runtime_error",
    "crash": "runtime_error",
    "ran_no_sub": "no_submission",
    "ran_no_submission": "no_submission",
    "no_sub": "no_submission",
    "invalid": "invalid_submission",
    "killed": "timeout",  # a resource kill reads like a timeout from the outside; same rung by default
    "success": "valid",
}

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_FENCE = re.compile(r"```[a-zA-Z]*")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


class PredictionParseError(ValueError):
    """The model's text holds no prediction that reads and validates; ``reason`` says why."""


@dataclass(frozen=True)
class Prediction:
    """One predicted outcome.

    Attributes:
        status: one of :data:`WM_STATUSES` (or ``malformed`` from the deterministic gate).
        error_type: predicted exception class for failures (``"KeyError"``), if any.
        error_line: predicted 1-based line of the failure, if any.
        position: predicted leaderboard position in [0, 1] for ``valid``; ``None`` otherwise.
        output: the text the run would print (a traceback for failures).
        repaired: the JSON was truncated and had to be closed to be read.
    """

    status: str
    error_type: str | None = None
    error_line: int | None = None
    position: float | None = None
    output: str = ""
    repaired: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error_type": self.error_type,
            "error_line": self.error_line,
            "position": self.position,
            "output": self.output,
            "repaired": self.repaired,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prediction:
        # what to_dict wrote (the prediction cache's file); a record without a status is not one
        status = data["status"]
        if not isinstance(status, str):
            raise TypeError(f"a prediction's status must be a string; got {status!r}")
        fields: dict[str, Any] = {k: data.get(k) for k in ("error_type", "error_line", "position")}
        return cls(
            status,
            **fields,
            output=data.get("output") or "",
            repaired=bool(data.get("repaired", False)),
        )


def _strip_wrapping(text: str) -> str:
    text = _THINK.sub("", text)
    opened = text.lower().find("<think>")
    if opened != -1:
        text = text[:opened]
    return _FENCE.sub("", text)


def candidate_objects(text: str) -> list[str]:
    """Every balanced ``{...}`` substring (string-aware), ordered last-ending first, outer first."""
    spans = []
    starts = [i for i, ch in enumerate(text) if ch == "{"]
    for start in starts:
        depth, in_string, escaped = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    spans.append((start, i + 1))
                    break
    spans.sort(key=lambda s: (-s[1], s[0]))
    return [text[a:b] for a, b in spans]


def _read_object(candidate: str) -> dict[str, Any] | None:
    for attempt in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
        try:
            value = json.loads(attempt, strict=False)  # raw newlines inside strings are common
        except (json.JSONDecodeError, RecursionError):
            continue
        return value if isinstance(value, dict) else None
    try:  # a Python-literal dict: single quotes, True/False/None
        fixed = re.sub(
            r"\bnull\b", "None", re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", candidate))
        )
        value = ast.literal_eval(_TRAILING_COMMA.sub(r"\1", fixed))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _close_truncated(text: str) -> str | None:
    """Close the last top-level object left open at the end of ``text`` (strings, then brackets)."""
    start = None
    stack: list[str] = []
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            if not stack and ch == "{":
                start = i
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    if start is None or not stack:
        return None
    body = text[start:]
    if escaped:
        body = body[:-1]
    if in_string:
        body += '"'
    body = body.rstrip().rstrip(",")
    if body.endswith(":"):
        body += " null"
    return body + "".join(reversed(stack))


def _status(value: Any) -> str:
    if not isinstance(value, str):
        raise PredictionParseError(f"'status' must be a string; got {value!r}")
    key = value.strip().lower().replace("-", "_").replace(" ", "_")
    key = STATUS_ALIASES.get(key, key)
    if key not in WM_STATUSES:
        raise PredictionParseError(f"'status' {value[:40]!r} is not one of {WM_STATUSES}")
    return key


def _position(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip().rstrip("%")) / (100 if value.strip().endswith("%") else 1)
        except ValueError:
            raise PredictionParseError(f"'position' {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PredictionParseError(f"a valid prediction needs a numeric 'position' in [0, 1]; got {value!r}")
    if not 0 <= value <= 1:
        raise PredictionParseError(f"'position' must be in [0, 1]; got {value!r}")
    return float(value)


def _validate(data: dict[str, Any], repaired: bool) -> Prediction:
    if "status" not in data:
        raise PredictionParseError("the JSON object has no 'status'")
    status = _status(data["status"])
    position = _position(data.get("position")) if status == "valid" else None
    error_type = data.get("error_type")
    error_type = error_type.strip()[:80] or None if isinstance(error_type, str) else None
    line = data.get("error_line")
    if isinstance(line, str) and line.strip().isdigit():
        line = int(line)
    error_line = line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else None
    output = data.get("output", data.get("feedback", ""))
    output = output if isinstance(output, str) else json.dumps(output) if output is not None else ""
    if status == "valid":
        error_type = error_line = None
    return Prediction(status, error_type, error_line, position, output, repaired)


def parse_prediction(text: str) -> Prediction:
    """Read one prediction from the model's text (see the module docstring).

    Raises:
        PredictionParseError: no candidate object reads and validates; the message says why.
    """
    if not isinstance(text, str):
        raise PredictionParseError(f"expected text; got {type(text).__name__}")
    body = _strip_wrapping(text)
    first_error: PredictionParseError | None = None
    for candidate in candidate_objects(body):
        data = _read_object(candidate)
        if data is None:
            continue
        try:
            return _validate(data, repaired=False)
        except PredictionParseError as err:
            first_error = first_error or err
    closed = _close_truncated(body)
    if closed is not None:
        data = _read_object(closed)
        if data is not None:
            try:
                return _validate(data, repaired=True)
            except PredictionParseError as err:
                first_error = first_error or err
    if first_error is not None:
        raise first_error
    if "{" not in body:
        raise PredictionParseError("no JSON object in the output")
    raise PredictionParseError("no JSON object in the output could be read (malformed JSON)")
