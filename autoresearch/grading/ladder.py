"""The reward ladder: how an execution outcome becomes a scalar reward.

Default rungs (issue 3): a syntax error (or a malformed script) 0, a runtime error 0.1, a run that
ended without a valid submission 0.2, a valid submission ``0.5 + 0.5 · position`` where position is
the leaderboard position score in [0, 1]. The order rewards progress an RL policy can climb: parse,
then run, then write the right file, then write a good one.

A ``timeout`` (the solution ran past its own time limit) and ``killed`` (it hit the memory, process
or file-size limit) are failures *of the solution*. By default they sit on the runtime-error rung
(0.1): like a crash, the script did not finish, and ranking them above a crash would teach the
policy that hanging is safer than failing fast; ranking them below would punish ambitious
solutions more than broken ones. Both are configurable.

A failure of the *harness* (the sandbox could not start, the answers file vanished) says nothing
about the solution: its reward is ``None`` (unknown), never 0. That rung is not configurable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["FAILURE_STATUSES", "STATUSES", "RewardLadder"]

#: Every status a grade can have, best first.
STATUSES = (
    "valid",
    "invalid_submission",
    "no_submission",
    "timeout",
    "killed",
    "runtime_error",
    "syntax_error",
    "harness_error",
)
#: Statuses that are failures of the solution (graded, reward from the ladder).
FAILURE_STATUSES = (
    "invalid_submission",
    "no_submission",
    "timeout",
    "killed",
    "runtime_error",
    "syntax_error",
)


@dataclass(frozen=True)
class RewardLadder:
    """Rewards per outcome (reward units, usually in [0, 1]).

    Attributes:
        syntax_error: the script does not compile (or is not a script).
        runtime_error: it exited with an error (non-zero status or an uncaught exception).
        timeout: it ran past its time limit and was killed.
        killed: it was killed for exceeding a memory / process / file-size limit.
        no_submission: it ran to completion but wrote no submission file.
        invalid_submission: it wrote a submission that fails validation.
        valid_floor: reward of a valid submission at position 0 (worse than every reference).
        valid_span: extra reward at position 1 (``valid_floor + valid_span · position``).

    Rules (checked at construction): every rung is a finite number; ``valid_span > 0``; and
    ``syntax_error ≤ runtime_error, timeout, killed ≤ no_submission, invalid_submission ≤ valid_floor``
    so that a better outcome never earns less.
    """

    syntax_error: float = 0.0
    runtime_error: float = 0.1
    timeout: float = 0.1
    killed: float = 0.1
    no_submission: float = 0.2
    invalid_submission: float = 0.2
    valid_floor: float = 0.5
    valid_span: float = 0.5

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"RewardLadder.{f.name} must be a finite number; got {value!r}")
            object.__setattr__(self, f.name, float(value))
        if self.valid_span <= 0:
            raise ValueError(f"RewardLadder.valid_span must be > 0; got {self.valid_span}")
        crashes = {"runtime_error": self.runtime_error, "timeout": self.timeout, "killed": self.killed}
        no_file = {"no_submission": self.no_submission, "invalid_submission": self.invalid_submission}
        for name, value in crashes.items():
            if value < self.syntax_error:
                raise ValueError(
                    f"RewardLadder: {name} ({value}) must be >= syntax_error ({self.syntax_error})"
                )
            for other, bound in no_file.items():
                if value > bound:
                    raise ValueError(f"RewardLadder: {name} ({value}) must be <= {other} ({bound})")
        for name, value in no_file.items():
            if value > self.valid_floor:
                raise ValueError(
                    f"RewardLadder: {name} ({value}) must be <= valid_floor ({self.valid_floor})"
                )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RewardLadder:
        """Build from a mapping (a config file section); unknown keys are rejected by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"RewardLadder: unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**dict(values))

    def reward(self, status: str, position: float | None = None) -> float | None:
        """Reward for an outcome.

        Args:
            status: one of :data:`STATUSES`.
            position: the position score in [0, 1]; required when ``status == "valid"``.

        Returns:
            The reward, or None for ``harness_error`` (unknown).
        """
        if status == "harness_error":
            return None
        if status == "valid":
            if position is None or not math.isfinite(position) or not 0.0 <= position <= 1.0:
                raise ValueError(f"a valid submission needs a position score in [0, 1]; got {position!r}")
            return self.valid_floor + self.valid_span * float(position)
        if status not in FAILURE_STATUSES:
            raise ValueError(f"unknown grade status {status!r}; expected one of {STATUSES}")
        return float(getattr(self, status))
