"""The interface a vision-language-action policy implements to be evaluated and trained by WMRL.

Evaluation needs only ``reset`` and ``act``. RL additionally needs the log-probabilities of the
actions the policy took (``TrainablePolicy``), so that a PPO-style ratio can be formed.

Conventions (shared with the LIBERO environment, see ``docs/embodied.md``):

* ``observation`` is a mapping of numpy arrays. Images are ``uint8`` arrays of shape
  ``(H, W, 3)`` already in *upright* orientation (the environment flips MuJoCo's bottom-up
  frames); proprioception is ``float32``.
* ``action`` is a ``float32`` array of shape ``(7,)``: end-effector delta position (3),
  delta rotation as axis-angle (3), gripper (1) with **-1 = open, +1 = close** (robosuite's
  convention, the one LIBERO's simulator consumes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass
class ActionStep:
    """What a policy returns for one observation.

    Attributes:
        action: ``float32`` array of shape ``(7,)`` in the environment's action space.
        token_ids: the discrete action tokens the policy sampled, shape ``(7,)`` (token policies only).
        log_prob: the summed log-probability of ``token_ids`` under the policy that sampled them (nats).
        info: anything else worth keeping with the step.
    """

    action: np.ndarray
    token_ids: np.ndarray | None = None
    log_prob: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class VLAPolicy(Protocol):
    """Act from an observation and a language instruction."""

    def reset(self) -> None:
        """Forget any per-episode state (called at the start of every episode)."""

    def act(self, observation: Mapping[str, np.ndarray], instruction: str) -> ActionStep:
        """Choose the next action."""
