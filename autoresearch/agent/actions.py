"""The agent's action format and its parser.

A reply is a short plan followed by ONE complete Python script in a fenced code block::

    Plan: load train.csv, fit a gradient-boosting model, predict test.csv.

    ```python
    import os, pandas as pd
    ...
    ```

Parsing is forgiving about fences, strict about code. Among the reply's code blocks it takes, in
this priority order (the official agent's order, minus its ``request_info`` action):

1. a closed block tagged ``python`` (also ``py``, ``python3``);
2. a closed untagged block;
3. an unclosed ``python`` fence (the reply was cut off: code runs to the end of the text);
4. an unclosed untagged fence.

Blocks tagged with another language (``bash``, ``json``, ...) are never code. Within one level
the longest block wins (ties: the later one), because the script is the complete program and
other blocks are usually snippets. A reply with no such non-empty block is ``malformed``
(reward 0 on the ladder), even if it looks like Python: the format is part of the task.

``request_info`` (ask the environment for a data listing) is deliberately not an action here: the
task overview already contains the data inventory, so the action would only spend a turn.

A fence is three or more backticks ending a line, with an optional language tag after them (text
before them on the line is plan text); it is closed by a line ending in at least as many backticks
with no other backticks on it, so a closing fence glued to the last code line still counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["FENCE_KINDS", "Action", "parse_action"]

#: How the chosen code was fenced, in priority order.
FENCE_KINDS = ("closed_python", "closed_generic", "unclosed_python", "unclosed_generic")

_PYTHON_TAGS = {"python", "py", "python3", "py3"}
# An opening fence: three or more backticks and an optional tag, ending the line. Text before the
# ticks on the same line is allowed (small models write "Here is the code: ```python").
_OPEN = re.compile(r"^([^`]*?)(`{3,})[ \t]*([^`\s]*)[^`]*$")
# A closing fence: backticks alone on a line, or at the end of a code line ("df.to_csv(p)```"),
# when the line has no other backticks (so a fence inside a string literal does not close).
_CLOSE = re.compile(r"^([^`]*?)(`{3,})[ \t]*$")


@dataclass(frozen=True)
class Action:
    """A parsed reply.

    Attributes:
        kind: ``"code"`` or ``"malformed"``.
        code: the script (``None`` when malformed); leading blank lines and trailing whitespace removed.
        plan: the reply's text before the chosen block, stripped (the whole reply when malformed).
        fence: which rule found the code (one of :data:`FENCE_KINDS`), ``None`` when malformed.
        reason: why the reply is malformed (``None`` otherwise).
    """

    kind: str
    code: str | None
    plan: str
    fence: str | None = None
    reason: str | None = None

    @property
    def malformed(self) -> bool:
        return self.kind == "malformed"


@dataclass(frozen=True)
class _Block:
    tag: str  # "python", "generic" or "other"
    closed: bool
    body: str
    start: int  # line index of the opening fence


def _tag(info: str) -> str:
    word = info.strip().lower()
    if not word:
        return "generic"
    return "python" if word in _PYTHON_TAGS else "other"


def _blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        opener = _OPEN.match(lines[i])
        if not opener:
            i += 1
            continue
        ticks, tag, start = len(opener.group(2)), _tag(opener.group(3)), i
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            closer = _CLOSE.match(lines[i])
            if closer and len(closer.group(2)) >= ticks:
                if closer.group(1).strip():
                    body.append(closer.group(1).rstrip())
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        blocks.append(_Block(tag, closed, "\n".join(body), start))
    return blocks


def _clean(body: str) -> str:
    # Leading blank lines and trailing whitespace are noise; leading spaces of the first code
    # line are kept (they are the author's indentation, and Python will judge them).
    lines = body.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines).rstrip()


def parse_action(text: str) -> Action:
    """Parse one reply into an :class:`Action`; never raises on any string."""
    if not isinstance(text, str):
        raise TypeError(f"parse_action expects the reply text as a string; got {type(text).__name__}")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks = [b for b in _blocks(lines) if b.tag != "other" and _clean(b.body)]
    for kind in FENCE_KINDS:
        closed = kind.startswith("closed")
        tag = "python" if kind.endswith("python") else "generic"
        candidates = [b for b in blocks if b.closed == closed and b.tag == tag]
        if candidates:
            best = max(candidates, key=lambda b: (len(_clean(b.body)), b.start))
            opener = _OPEN.match(lines[best.start])
            assert opener is not None  # _blocks starts a block only on a line _OPEN matches
            before = opener.group(1)  # text before the ticks on the fence line
            plan = "\n".join([*lines[: best.start], before]).strip()
            return Action(kind="code", code=_clean(best.body), plan=plan, fence=kind)
    reason = "no code block: the reply must contain one complete Python script in a ```python fenced block"
    if any(_OPEN.match(line) for line in lines):
        reason = "the reply's fenced blocks are empty or in another language; one ```python block with the script is required"
    return Action(kind="malformed", code=None, plan=text.strip(), reason=reason)
