"""What a script executes, without what cannot change it: the text two rollouts are compared by."""

from __future__ import annotations

import ast
import functools
import hashlib
from typing import Any

from wmrl.autoresearch.tasks.model import Solution

__all__ = ["normalised_code", "solution_key"]


# A step asks for the same script's form several times (the execution memory's key, a surrogate's
# features and its key when grading and again when learning): parse it once.
@functools.lru_cache(maxsize=4096)
def normalised_code(code: str) -> str:
    """What a script executes, without what cannot change it: its syntax tree (comments, blank lines,
    spacing and quote styles dropped). A script that does not parse keeps its text with each line's
    trailing spaces and the blank lines removed (it fails the same way whatever its comments say)."""
    try:
        return ast.dump(ast.parse(code), annotate_fields=False, include_attributes=False)
    except (SyntaxError, ValueError, RecursionError):
        return "\n".join(line.rstrip() for line in code.splitlines() if line.strip())


def solution_key(item: Any) -> str | None:
    """Which rollouts are the same solution: the task and the normalised script (:func:`normalised_code`),
    hashed (``None``: not a script). The execution memory grades a known key from its first execution."""
    if not isinstance(item, Solution):
        return None
    return hashlib.sha256(f"{item.task_id}\0{normalised_code(item.code)}".encode()).hexdigest()[:16]
