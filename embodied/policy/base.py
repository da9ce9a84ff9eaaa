"""The interface a vision-language-action policy implements to be evaluated and trained by WMRL.

Evaluation needs only ``reset`` and ``act``. RL additionally needs the log-probabilities of the
actions the policy took (``TrainablePolicy``), so that a PPO-style ratio can be formed.

Conventions (shared with the LIBERO environment, see ``docs/embodied-env.md``; the policies are
described in ``docs/embodied-models.md``):

* ``observation`` is a mapping of numpy arrays. Images are ``uint8`` arrays of shape
  ``(H, W, 3)`` already in *upright* orientation (the environment flips MuJoCo's bottom-up
  frames); proprioception is ``float32``.
* ``action`` is a ``float32`` array of shape ``(7,)``: end-effector delta position (3),
  delta rotation as axis-angle (3), gripper (1) with **-1 = open, +1 = close** (robosuite's
  convention, the one LIBERO's simulator consumes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch


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


@runtime_checkable
class TrainablePolicy(VLAPolicy, Protocol):
    """A token policy that RL can train: re-score stored action tokens, update, checkpoint.

    ``action_log_probs`` must agree with the ``log_prob`` that ``act`` reported for the same
    observation, instruction and tokens (up to float round-off), so that a PPO ratio
    ``exp(new - old)`` is exactly 1 before the first update.
    """

    def action_log_probs(
        self,
        observations: Sequence[Mapping[str, np.ndarray]],
        instructions: Sequence[str],
        token_ids: np.ndarray | torch.Tensor,
    ) -> torch.Tensor:
        """Per-token log-probabilities of ``token_ids``.

        Args:
            observations: B observations (as given to ``act``).
            instructions: B instructions.
            token_ids: ``(B, A)`` action tokens (``ActionStep.token_ids`` stacked).

        Returns:
            A differentiable float32 tensor of shape ``(B, A)`` (nats).
        """

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters an optimiser should update (only the adapters once LoRA is applied)."""

    def save(self, path: str | Path) -> None:
        """Write everything needed to rebuild this policy (weights, adapters, tokenizer, statistics) to ``path``."""

    def load(self, path: str | Path) -> None:
        """Load weights (and adapters) saved by ``save`` into this policy, in place."""
