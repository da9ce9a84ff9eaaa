"""A random token policy: the floor every LIBERO policy must beat, and a stand-in for plumbing tests.

It behaves like a VLA that discretises each of the 7 action dimensions into ``n_bins`` uniform
bins over [-1, 1] and samples every bin uniformly: ``token_ids`` are the sampled bins and
``log_prob`` is their exact joint log-probability, ``-7 * log(n_bins)``. The gripper follows the
VLA convention of a binary command: bins in the lower half open (-1), the upper half close (+1).
Arm dimensions are scaled by ``arm_scale`` (1.0 = the full controller range).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.embodied.policy.base import ActionStep

__all__ = ["RandomPolicy", "load_random_policy"]

ACTION_DIM = 7


class RandomPolicy:
    """Uniform random actions, reproducible from a seed.

    Args:
        seed: seed of the generator; ``reset(seed=s)`` re-seeds it for one episode.
        n_bins: bins per action dimension (256 like OpenVLA/MiniVLA).
        arm_scale: multiplies the 6 arm dimensions, in (0, 1].
    """

    def __init__(self, seed: int = 0, n_bins: int = 256, arm_scale: float = 1.0) -> None:
        if not isinstance(n_bins, int) or isinstance(n_bins, bool) or n_bins < 2:
            raise ValueError(f"n_bins must be an integer >= 2; got {n_bins!r}")
        if not (isinstance(arm_scale, (int, float)) and 0.0 < float(arm_scale) <= 1.0):
            raise ValueError(f"arm_scale must be in (0, 1]; got {arm_scale!r}")
        self.seed = int(seed)
        self.n_bins = n_bins
        self.arm_scale = float(arm_scale)
        self._rng = np.random.default_rng(self.seed)
        # Bin centres over [-1, 1].
        self._centres = -1.0 + (2.0 * np.arange(n_bins) + 1.0) / n_bins

    def reset(self, seed: int | None = None) -> None:
        """Start an episode; with ``seed``, the episode's actions depend on that seed alone."""
        if seed is not None:
            self._rng = np.random.default_rng(int(seed))

    def act(self, observation: Mapping[str, np.ndarray], instruction: str) -> ActionStep:
        """Sample one action; ignores the observation and the instruction."""
        bins = self._rng.integers(0, self.n_bins, size=ACTION_DIM)
        action = self._centres[bins].astype(np.float32)
        action[:6] *= self.arm_scale
        action[6] = 1.0 if bins[6] >= self.n_bins // 2 else -1.0
        return ActionStep(
            action=action,
            token_ids=bins.astype(np.int64),
            log_prob=-ACTION_DIM * math.log(self.n_bins),
        )

    def save(self, path: str | Path) -> Path:
        """Write ``policy.json`` into the folder ``path`` (created); :func:`load_random_policy` reads it."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        spec = {
            "type": "random",
            "kwargs": {"seed": self.seed, "n_bins": self.n_bins, "arm_scale": self.arm_scale},
        }
        (folder / "policy.json").write_text(json.dumps(spec, indent=2) + "\n")
        return folder

    def __repr__(self) -> str:
        return f"RandomPolicy(seed={self.seed}, n_bins={self.n_bins}, arm_scale={self.arm_scale})"


def load_random_policy(path: str | Path | None = None, **kwargs: Any) -> RandomPolicy:
    """Policy-loader factory for ``{"type": "random"}`` folders (kwargs come from ``policy.json``)."""
    allowed = set(inspect.signature(RandomPolicy.__init__).parameters) - {"self"}
    unknown = set(kwargs) - allowed
    if unknown:
        raise ValueError(f"unknown RandomPolicy arguments {sorted(unknown)}; allowed: {sorted(allowed)}")
    return RandomPolicy(**kwargs)
