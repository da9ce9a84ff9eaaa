"""What a script executes, without what cannot change it: the text two rollouts are compared by."""

from __future__ import annotations

import ast

__all__ = ["normalised_code"]


def normalised_code(code: str) -> str:
    """What a script executes, without what cannot change it: its syntax tree (comments, blank lines,
    spacing and quote styles dropped). A script that does not parse keeps its text with each line's
    trailing spaces and the blank lines removed (it fails the same way whatever its comments say)."""
    try:
        return ast.dump(ast.parse(code), annotate_fields=False, include_attributes=False)
    except (SyntaxError, ValueError, RecursionError):
        return "\n".join(line.rstrip() for line in code.splitlines() if line.strip())
