"""The reward-source contract: how WMRL asks anything for a score.

A *reward source* grades a batch of items (rollouts: an agent's script on a task, a robot episode)
and returns one score per item, in order. ``None`` means *unknown*: the source could not grade
that item (a harness crash, a parse failure, a dead server). Unknown is never zero; the
advantage functions exclude unknown entries and the debiaser never sees them.

Two roles exist. The *world model* is the cheap predictor that grades every group; the *anchor*
is real execution, expensive and trusted, graded on a thin stream of groups. A source declares
its role so that a swapped pair is caught before a run starts, not after a week of training.

A plain function becomes a source in one line::

    wm = as_source(lambda items: [predict(x) for x in items], role="world_model", name="my_wm")

A source may optionally implement ``grade(items) -> Sequence[Grade]`` to return, per item, a
status record and a variance alongside the score; :func:`collect_grades` uses it when present.

An anchor source may also *declare its execution noise* with an optional attribute ``noise``, a
:class:`NoiseModel`: ``deterministic`` (running the same rollout again gives the same score),
``bernoulli`` (the score is a 0/1 outcome drawn with an unknown success probability, e.g. an
episode in a stochastic environment) or ``gaussian`` (the score varies around its expectation with
a stated variance, e.g. an ML script's metric across seeds). :func:`declared_noise` reads it; the
corrector receives it as ``correct(..., anchor_noise=...)`` and uses it to keep the anchor's own
noise from being counted against the world model. A source that declares nothing is *assumed*
deterministic, and the corrector's metrics say so (``wmrl/exec_noise_route`` = 0).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "FunctionSource",
    "Grade",
    "NoiseModel",
    "RewardSource",
    "Role",
    "SourceError",
    "as_source",
    "check_pair",
    "check_source",
    "collect_grades",
    "declared_noise",
    "real_number",
]


class Role(StrEnum):
    """Which stream a source feeds: the cheap world model or the trusted anchor (real execution)."""

    WORLD_MODEL = "world_model"
    ANCHOR = "anchor"

    @classmethod
    def parse(cls, value: Role | str) -> Role:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(r.value) for r in cls)
            raise ValueError(f"role must be one of {allowed}; got {value!r}") from None


class SourceError(ValueError):
    """A reward source broke its contract (wrong length, non-finite score, wrong role...)."""


@runtime_checkable
class RewardSource(Protocol):
    """Anything with a ``name``, a ``role`` and a batch ``score``.

    ``score(items)`` returns a sequence of the same length as ``items``: a finite float per
    graded item, ``None`` per item that could not be graded.

    Optional, not part of the structural check: ``noise`` (a :class:`NoiseModel`), the source's
    declaration of how its scores vary when the same item is graded again (read by
    :func:`declared_noise`).
    """

    name: str

    @property
    def role(self) -> Role | str:
        """``world_model`` or ``anchor`` (read only: a source may declare it as a narrower type)."""
        ...

    def score(self, items: Sequence[Any]) -> Sequence[float | None]: ...


@dataclass(frozen=True)
class Grade:
    """One item's grade with optional extras.

    Attributes:
        value: the score, or ``None`` when unknown.
        status: a short outcome label (``"valid"``, ``"runtime_error"``, ``"timeout"``...), if the source has one.
        variance: the source's own estimate of the variance of ``value`` (score units²), if it has one.
        info: anything else worth logging (resources, reasons, raw text).
        feedback: what the policy observes about this outcome in its next turn (multi-turn episodes:
            an execution log, a predicted one), if the source produces one; see ``RolloutNeeds.feedback``.
    """

    value: float | None
    status: str | None = None
    variance: float | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    feedback: Any = None


NoiseKind = Literal["deterministic", "bernoulli", "gaussian"]


@dataclass(frozen=True)
class NoiseModel:
    """How a source's score varies when the same item is graded again (its *execution noise*).

    Attributes:
        kind: ``deterministic`` (variance 0), ``bernoulli`` (a 0/1 outcome; the variance of an
            item's score is ``p(1 - p)`` with ``p`` its unknown success probability) or
            ``gaussian`` (a constant ``variance``).
        variance: score units²; required for ``gaussian``, must be unset otherwise.
    """

    kind: NoiseKind = "deterministic"
    variance: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("deterministic", "bernoulli", "gaussian"):
            raise ValueError(f"noise kind must be deterministic, bernoulli or gaussian; got {self.kind!r}")
        if self.kind == "gaussian":
            variance = real_number(self.variance)
            if variance is None or not variance >= 0:
                raise ValueError(
                    f"a gaussian noise model needs a finite variance >= 0 (score units²); got {self.variance!r}"
                )
        elif self.variance is not None:
            raise ValueError(f"a {self.kind} noise model takes no variance; got {self.variance!r}")

    @classmethod
    def deterministic(cls) -> NoiseModel:
        return cls("deterministic")

    @classmethod
    def bernoulli(cls) -> NoiseModel:
        return cls("bernoulli")

    @classmethod
    def gaussian(cls, variance: float) -> NoiseModel:
        return cls("gaussian", float(variance))


def declared_noise(source: Any) -> NoiseModel | None:
    """The source's declared execution noise (its ``noise`` attribute), ``None`` when it declares none.

    Raises:
        SourceError: ``noise`` is set but is not a :class:`NoiseModel`.
    """
    noise = getattr(source, "noise", None)
    if noise is None or isinstance(noise, NoiseModel):
        return noise
    name = getattr(source, "name", type(source).__name__)
    raise SourceError(
        f"source {name!r} declares noise={noise!r} ({type(noise).__name__}): it must be a NoiseModel "
        "(NoiseModel.deterministic(), .bernoulli() or .gaussian(variance)) or None"
    )


def real_number(value: Any) -> float | None:
    """``value`` as a finite-or-not float if it is a real number (not a bool, str or array), else ``None``.

    ``numbers.Real`` covers Python and numpy ints and floats; numpy's ``bool_`` and ``str_`` are not
    real numbers (``float(np.str_("0.5"))`` would parse text), and neither is a 0-d array.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    return float(value)


@dataclass
class FunctionSource:
    """Wrap a plain batch function ``fn(items) -> list[float | None]`` as a :class:`RewardSource`."""

    fn: Callable[[Sequence[Any]], Sequence[float | None]]
    role: Role
    name: str

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"FunctionSource needs a callable; got {type(self.fn).__name__}")
        self.role = Role.parse(self.role)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a reward source needs a non-empty string name")

    def score(self, items: Sequence[Any]) -> Sequence[float | None]:
        return self.fn(items)


def as_source(
    fn: Callable[[Sequence[Any]], Sequence[float | None]],
    role: Role | str,
    name: str | None = None,
) -> FunctionSource:
    """Turn a batch scoring function into a reward source (name defaults to the function's name)."""
    return FunctionSource(
        fn=fn, role=Role.parse(role), name=getattr(fn, "__name__", "source") if name is None else name
    )


def _validate_value(source_name: str, index: int, value: Any) -> float | None:
    if value is None:
        return None
    number = real_number(value)
    if number is None:
        raise SourceError(
            f"source {source_name!r} returned {value!r} ({type(value).__name__}) for item {index}: "
            "scores must be real numbers (int or float, not bool, str or an array) or None (unknown)"
        )
    if not math.isfinite(number):
        raise SourceError(
            f"source {source_name!r} returned a non-finite score ({number}) for item {index}: "
            "return None for an item that could not be graded, never NaN or inf"
        )
    return number


def collect_grades(source: RewardSource, items: Sequence[Any]) -> list[Grade]:
    """Score ``items`` with ``source`` and check the reply against the contract.

    Uses the source's optional ``grade`` method when it has one (status and variance come
    through), otherwise its ``score``.

    Raises:
        SourceError: wrong number of scores, a non-finite or non-numeric score.
    """
    name = getattr(source, "name", type(source).__name__)
    grader = getattr(source, "grade", None)
    raw: Sequence[Any] = grader(items) if callable(grader) else source.score(items)
    if (
        raw is None
        or isinstance(raw, (str, bytes, Mapping, Set))
        or not hasattr(raw, "__len__")
        or not hasattr(raw, "__getitem__")
        or getattr(raw, "ndim", 1) != 1
    ):
        # A dict or a set has a length but no order: iterating it would score its keys.
        raise SourceError(
            f"source {name!r} must return an ordered sequence (list, tuple, 1-D array) of scores, one per "
            f"item; got {type(raw).__name__}"
        )
    if len(raw) != len(items):
        raise SourceError(
            f"source {name!r} returned {len(raw)} scores for {len(items)} items: one score (or None) per item"
        )
    grades = []
    for i, entry in enumerate(raw):
        if isinstance(entry, Grade):
            value = _validate_value(name, i, entry.value)
            variance = entry.variance
            if variance is not None:
                number = real_number(variance)
                if number is None or not math.isfinite(number) or number < 0:
                    raise SourceError(
                        f"source {name!r} gave item {i} a variance of {variance!r}: it must be a finite "
                        "real number >= 0 (score units²) or None"
                    )
                variance = number
            grades.append(Grade(value, entry.status, variance, entry.info, entry.feedback))
        else:
            grades.append(Grade(_validate_value(name, i, entry)))
    return grades


def check_source(
    source: Any, sample_items: Sequence[Any] | None = None, role: Role | str | None = None
) -> list[str]:
    """Validate a user's reward source; return a list of problems (empty when it is fine).

    Checks the attributes, the role (against ``role`` when given) and, when ``sample_items`` are
    given, a real call: one finite score or ``None`` per item.
    """
    problems: list[str] = []
    name = getattr(source, "name", None)
    if not isinstance(name, str) or not name:
        problems.append("it has no non-empty string attribute `name`")
    raw_role = getattr(source, "role", None)
    try:
        parsed = Role.parse(raw_role) if raw_role is not None else None
    except ValueError as err:
        parsed = None
        problems.append(f"its `role` is invalid: {err}")
    if raw_role is None:
        problems.append("it has no attribute `role` (world_model or anchor)")
    if role is not None and parsed is not None and parsed != Role.parse(role):
        problems.append(f"its role is {parsed.value!r} but it is used as {Role.parse(role).value!r}")
    if not callable(getattr(source, "score", None)):
        problems.append("it has no callable `score(items)` method")
    if sample_items is not None and not problems:
        try:
            collect_grades(source, sample_items)
        except SourceError as err:
            problems.append(str(err))
        except Exception as err:  # a user's source may raise anything; report it, do not hide it
            problems.append(f"calling it raised {type(err).__name__}: {err}")
    return problems


def check_pair(world_model: Any, anchor: Any) -> None:
    """Raise if the two sources do not form a valid (world model, anchor) pair.

    A swapped pair (the anchor passed as the world model) is the classic silent mistake: the
    run would calibrate real execution against the world model. It is rejected here.
    """
    problems = [f"world model: {p}" for p in check_source(world_model, role=Role.WORLD_MODEL)]
    problems += [f"anchor: {p}" for p in check_source(anchor, role=Role.ANCHOR)]
    if world_model is anchor:
        problems.append(
            "the world model and the anchor are the same object; the anchor must be real execution"
        )
    if problems:
        raise SourceError("invalid reward-source pair:\n  " + "\n  ".join(problems))
