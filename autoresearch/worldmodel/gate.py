"""The deterministic gate: outcomes that need no model.

Before any model call, a script is checked the way the real grader checks it first:

* empty (or whitespace-only) code -> ``malformed`` (the syntax-error rung, 0 by default);
* code that does not compile -> ``syntax_error``, with the same one-line message the real
  grader produces (``wmrl.autoresearch.grading.grader.check_syntax``).

These predictions are exact, so they carry variance 0 and cost no generation.
"""

from __future__ import annotations

import re

from wmrl.autoresearch.grading.grader import check_syntax
from wmrl.autoresearch.worldmodel.prediction import Prediction

__all__ = ["gate"]

_LINE = re.compile(r"\(line (\d+)\)")


def gate(code: str | None) -> Prediction | None:
    """The exact outcome of ``code`` when it is decidable without a model, else ``None``."""
    if code is None or not isinstance(code, str) or not code.strip():
        return Prediction(status="malformed", output="no code to run")
    problem = check_syntax(code)
    if problem is None:
        return None
    line = _LINE.search(problem)
    error_type = problem.split(":", 1)[0].strip() or "SyntaxError"
    return Prediction(
        status="syntax_error",
        error_type=error_type,
        error_line=int(line.group(1)) if line else None,
        output=problem,
    )
