"""Discrete action tokens, dataset (un)normalisation and the LIBERO gripper convention of MiniVLA.

MiniVLA follows OpenVLA's ``ActionTokenizer`` with ``use_extra=True`` (Prismatic's
``extra_action_tokenizer`` for Qwen2.5): each of the 7 action dimensions, normalised to [-1, 1], is
cut into 256 uniform bins and written as one token. With ``L = len(tokenizer)`` (the Qwen2.5 vocabulary
*after* the 256 ``<|extra_i|>`` tokens were appended, 151 921 for Qwen2.5-0.5B):

* encode: ``b = digitize(clip(a, -1, 1), linspace(-1, 1, 256))`` in ``[1, 256]``, token ``L - b``;
  so the ids occupy ``[L - 256, L - 1]``, exactly the 256 extra tokens (``<|extra_255|>`` ... ``<|extra_0|>``).
* decode: ``i = clip(L - token - 1, 0, 254)``, value ``bin_centers[i]`` (255 centres of the 256 edges).

Un-normalisation uses the dataset's 1st/99th percentiles: ``a = 0.5 (x + 1)(q99 - q01) + q01`` where
``mask`` is true, ``a = x`` elsewhere (the gripper is not normalised). OpenVLA-family data store the
gripper as 0 = close, 1 = open; LIBERO's simulator wants -1 = open, +1 = close, so the LIBERO eval of
openvla-mini maps ``g -> sign(2g - 1)`` (``normalize_gripper_action(binarize=True)``) and then negates
it (``invert_gripper_action``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ActionNormalizer",
    "ActionTokenizer",
    "gripper_to_libero",
    "load_dataset_statistics",
]


@dataclass(frozen=True)
class ActionTokenizer:
    """Uniform binning of normalised actions onto the last ``n_bins`` ids of a vocabulary.

    Attributes:
        vocab_len: ``len(tokenizer)`` including the appended extra tokens (the ids ``< vocab_len``).
        n_bins: number of bin *edges* (256 in OpenVLA/MiniVLA); ``n_bins - 1`` centres.
        min_action, max_action: the normalised range; values outside are clipped.
    """

    vocab_len: int
    n_bins: int = 256
    min_action: float = -1.0
    max_action: float = 1.0

    def __post_init__(self) -> None:
        if self.n_bins < 2:
            raise ValueError(f"n_bins must be >= 2, got {self.n_bins}")
        if self.vocab_len <= self.n_bins:
            raise ValueError(f"vocab_len ({self.vocab_len}) must exceed n_bins ({self.n_bins})")
        if not self.min_action < self.max_action:
            raise ValueError("min_action must be < max_action")

    @property
    def bins(self) -> np.ndarray:
        """Bin edges ``(n_bins,)``, float64."""
        return np.linspace(self.min_action, self.max_action, self.n_bins)

    @property
    def bin_centers(self) -> np.ndarray:
        """``(n_bins - 1,)`` midpoints between consecutive edges."""
        edges = self.bins
        return (edges[:-1] + edges[1:]) / 2.0

    @property
    def first_token(self) -> int:
        """Smallest action token id (``vocab_len - n_bins``)."""
        return self.vocab_len - self.n_bins

    @property
    def token_range(self) -> tuple[int, int]:
        """``[first, last]`` inclusive range of ids the tokenizer can emit."""
        return self.first_token, self.vocab_len - 1

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """Normalised actions ``(..., D)`` -> token ids ``(..., D)`` (int64)."""
        clipped = np.clip(np.asarray(actions, dtype=np.float64), self.min_action, self.max_action)
        return (self.vocab_len - np.digitize(clipped, self.bins)).astype(np.int64)

    def decode(self, token_ids: np.ndarray) -> np.ndarray:
        """Token ids ``(..., D)`` -> normalised actions ``(..., D)`` (float64 bin centres).

        Ids outside the action range clip to the nearest end bin, as OpenVLA's decoder does.
        """
        index = np.clip(self.vocab_len - np.asarray(token_ids, dtype=np.int64) - 1, 0, self.n_bins - 2)
        return self.bin_centers[index]


def load_dataset_statistics(path: str | Path) -> dict[str, Any]:
    """Read a Prismatic ``dataset_statistics.json`` (``{dataset: {"action": {"q01", "q99", "mask", ...}}}``)."""
    with open(path) as f:
        stats = json.load(f)
    if not isinstance(stats, dict) or not stats:
        raise ValueError(f"{path}: dataset statistics must be a non-empty mapping of dataset name -> stats")
    return stats


@dataclass(frozen=True)
class ActionNormalizer:
    """Maps normalised actions in [-1, 1] back to the dataset's units with the q01/q99 bounds.

    Attributes:
        q01, q99: per-dimension 1st and 99th percentiles, tuples of length D.
        mask: per-dimension flag; ``False`` dims (the gripper) are passed through unchanged.
    """

    q01: tuple[float, ...]
    q99: tuple[float, ...]
    mask: tuple[bool, ...]

    def __post_init__(self) -> None:
        if not (len(self.q01) == len(self.q99) == len(self.mask)) or not self.q01:
            raise ValueError(
                f"q01, q99 and mask must have the same non-zero length; got {len(self.q01)}, {len(self.q99)}, {len(self.mask)}"
            )
        if any(hi < lo for lo, hi in zip(self.q01, self.q99, strict=True)):
            raise ValueError("every q99 must be >= its q01")

    @property
    def action_dim(self) -> int:
        return len(self.q01)

    @classmethod
    def from_statistics(cls, stats: Mapping[str, Any], unnorm_key: str | None = None) -> ActionNormalizer:
        """Pick one dataset's action statistics (the only one when ``unnorm_key`` is None).

        Like openvla-mini's LIBERO eval, ``libero_10`` falls back to ``libero_10_no_noops`` when only
        the latter exists.
        """
        if unnorm_key is None:
            if len(stats) != 1:
                raise ValueError(
                    f"the checkpoint has statistics for {sorted(stats)}; choose one with unnorm_key"
                )
            unnorm_key = next(iter(stats))
        if unnorm_key not in stats and f"{unnorm_key}_no_noops" in stats:
            unnorm_key = f"{unnorm_key}_no_noops"
        if unnorm_key not in stats:
            raise KeyError(f"unnorm_key {unnorm_key!r} not in dataset statistics; available: {sorted(stats)}")
        action = stats[unnorm_key]["action"]
        q01 = tuple(float(v) for v in action["q01"])
        q99 = tuple(float(v) for v in action["q99"])
        mask = tuple(bool(v) for v in action.get("mask", [True] * len(q01)))
        return cls(q01=q01, q99=q99, mask=mask)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        """``(..., D)`` in [-1, 1] -> dataset units (float64)."""
        x = np.asarray(normalized, dtype=np.float64)
        if x.shape[-1] != self.action_dim:
            raise ValueError(f"expected actions with last dim {self.action_dim}, got shape {x.shape}")
        lo, hi, mask = np.array(self.q01), np.array(self.q99), np.array(self.mask)
        return np.where(mask, 0.5 * (x + 1.0) * (hi - lo) + lo, x)

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`unnormalize` on masked dims, clipped to [-1, 1] (how the training data were made)."""
        a = np.asarray(actions, dtype=np.float64)
        lo, hi, mask = np.array(self.q01), np.array(self.q99), np.array(self.mask)
        span = np.where(hi > lo, hi - lo, 1.0)
        return np.where(mask, np.clip(2.0 * (a - lo) / span - 1.0, -1.0, 1.0), a)


def gripper_to_libero(actions: np.ndarray) -> np.ndarray:
    """OpenVLA gripper (0 = close, 1 = open) -> LIBERO/robosuite gripper (-1 = open, +1 = close).

    ``g -> -sign(2g - 1)`` on the last dimension, as openvla-mini's LIBERO eval does with
    ``normalize_gripper_action(binarize=True)`` followed by ``invert_gripper_action``. A value of
    exactly 0.5 maps to 0 (no bin centre of the 256-bin tokenizer is exactly 0.5).

    Args:
        actions: ``(..., 7)``; not modified.

    Returns:
        A copy with the last dimension in {-1, 0, +1}.
    """
    out = np.array(actions, dtype=np.float64, copy=True)
    out[..., -1] = -np.sign(2.0 * out[..., -1] - 1.0)
    return out
