"""A task's own grading function, for metrics the registry has no equivalent of (MLE-bench's ``grade_fn``).

MLE-bench grades a competition with ``grader.grade_fn`` from its ``config.yaml``: a ``module:function``
string whose function takes ``(submission, answers)`` as pandas DataFrames and returns a float, raising
``InvalidSubmissionError`` when the submission is malformed. A :class:`~wmrl.autoresearch.tasks.model.Task`
carries such a spec in ``grade_fn``; grading then calls it instead of the registry metric, after the
same structural checks every submission gets (size cap, columns, one row per test id), so a hostile
submission never reaches the task's code unbounded.

The spec is ``package.module:function`` (imported; MLE-bench's own specs need the ``mlebench`` package)
or ``path/to/file.py:function`` (loaded from the file; a relative path is relative to the task's
folder). The function runs in the trusted parent process, as the registry metrics do: it is the
benchmark's code, never the agent's.

Outcomes: a finite float is the score; an exception whose class is named ``InvalidSubmissionError``
(MLE-bench's, or a task's own of that name) makes the submission invalid, as in MLE-bench; any other
exception, or a result that is not a finite number, is a failure of the grader (the grade is unknown,
never 0).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["GradeFnError", "call_grade_fn", "load_grade_fn", "parse_grade_fn_spec"]

#: The exception class name MLE-bench's graders raise for a malformed submission.
INVALID_SUBMISSION = "InvalidSubmissionError"


class GradeFnError(ValueError):
    """The task's grading function could not be loaded, failed, or returned no usable score."""


def parse_grade_fn_spec(spec: str) -> tuple[str, str]:
    """Split ``"module_or_file:function"``; raises ``ValueError`` on a malformed spec."""
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise ValueError(f"grade_fn must be 'module:function' or 'file.py:function'; got {spec!r}")
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        raise ValueError(f"grade_fn must be 'module:function' or 'file.py:function'; got {spec!r}")
    return target, name


@functools.lru_cache(maxsize=64)
def load_grade_fn(spec: str, base_dir: str | None = None) -> Callable[[Any, Any], Any]:
    """The function ``spec`` names (cached: one import per spec and folder).

    Args:
        spec: ``package.module:function`` or ``file.py:function``.
        base_dir: folder a relative file path is resolved against (the task's folder).

    Raises:
        GradeFnError: the module or file cannot be imported, or has no such function.
    """
    target, name = parse_grade_fn_spec(spec)
    try:
        if target.endswith(".py"):
            path = Path(target).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            if not path.is_file():
                raise GradeFnError(f"grade_fn {spec!r}: no file {path}")
            module_spec = importlib.util.spec_from_file_location(
                f"wmrl_grade_fn_{abs(hash(str(path)))}", path
            )
            if module_spec is None or module_spec.loader is None:
                raise GradeFnError(f"grade_fn {spec!r}: {path} is not a loadable Python file")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except GradeFnError:
        raise
    except Exception as err:
        hint = " (MLE-bench's graders need its package: pip install the mle-bench repository)"
        raise GradeFnError(
            f"grade_fn {spec!r} cannot be imported: {type(err).__name__}: {err}"
            + (hint if target.startswith("mlebench") else "")
        ) from err
    fn = getattr(module, name, None)
    if not callable(fn):
        raise GradeFnError(f"grade_fn {spec!r}: {target} has no function {name!r}")
    return fn


def call_grade_fn(
    spec: str, submission: Any, answers: Any, base_dir: str | os.PathLike | None = None
) -> float:
    """Score ``submission`` against ``answers`` (DataFrames) with the function ``spec`` names.

    Returns:
        the score, a finite float in the task's metric units.

    Raises:
        SubmissionError: the function raised ``InvalidSubmissionError`` (code ``invalid_submission``).
        GradeFnError: it could not be loaded, raised anything else, or returned a non-finite or
            non-numeric value.
    """
    from wmrl.autoresearch.grading.validation import SubmissionError

    fn = load_grade_fn(spec, None if base_dir is None else os.fspath(base_dir))
    try:
        value = fn(submission, answers)
    except Exception as err:
        if any(cls.__name__ == INVALID_SUBMISSION for cls in type(err).__mro__):
            raise SubmissionError("invalid_submission", f"the task's grader refused it: {err}") from None
        raise GradeFnError(f"grade_fn {spec!r} failed: {type(err).__name__}: {err}") from err
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise GradeFnError(f"grade_fn {spec!r} returned {value!r}, not a number") from None
    if not math.isfinite(score):
        raise GradeFnError(f"grade_fn {spec!r} returned {score}, not a finite score")
    return score
