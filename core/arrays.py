"""Typed names for the arrays the method passes around (shapes and meaning in the name's docstring).

Every per-rollout array of a step is a ``(n_groups, G)`` matrix; unknown is NaN (never 0) in a
:data:`RewardMatrix` and ``None`` in a :data:`KeyMatrix`.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = ["GroupMask", "KeyMatrix", "RewardMatrix", "RolloutMask"]

#: ``(n_groups, G)`` float64 scores or rewards; NaN = unknown (or no rollout in that cell).
RewardMatrix: TypeAlias = npt.NDArray[np.float64]
#: ``(n_groups, G)`` bool: which rollouts a statement holds for (executed, known, from memory...).
RolloutMask: TypeAlias = npt.NDArray[np.bool_]
#: ``(n_groups,)`` bool: which groups (whole anchor groups, contributing groups...).
GroupMask: TypeAlias = npt.NDArray[np.bool_]
#: ``(n_groups, G)`` object: solution keys (``str``) or ``None`` where a rollout has none.
KeyMatrix: TypeAlias = npt.NDArray[Any]
