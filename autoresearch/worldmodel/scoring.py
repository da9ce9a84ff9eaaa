"""From predictions to a score: the expected reward on the grading ladder.

Sampling mode: ``m`` parsed samples with rewards ``r_1..r_m`` (each ``ladder.reward(status,
position)``) give

* score ``mean(r)`` (the Monte-Carlo estimate of the expected reward under the model);
* per-call noise variance ``var(r, ddof=1) / m`` (``Grade.variance``: how much the score would
  move if the call were repeated with other seeds; what the core's fusion calls the world
  model's per-call noise). Unknown (``None``) when ``m < 2``.

Probability mode: status probabilities ``p_s`` (the model's next-token probabilities of each
status, renormalised over the enum) and an expected position ``E[pos]`` given ``valid`` give the
exact expectation ``Σ_s p_s r(s) + p_valid (floor + span·E[pos])`` with noise variance 0 (a
deterministic function of the input).

The ladder is the grading package's :class:`~wmrl.autoresearch.grading.ladder.RewardLadder`, so
predicted and real rewards share one scale. ``malformed`` (the gate: no code) earns the
syntax-error rung, as the ladder defines.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wmrl.autoresearch.grading.ladder import RewardLadder
from wmrl.autoresearch.worldmodel.prediction import WM_STATUSES, Prediction

__all__ = ["SampleSummary", "expected_reward_from_probs", "prediction_reward", "summarise_samples"]


def prediction_reward(prediction: Prediction, ladder: RewardLadder) -> float:
    """The ladder reward of one predicted outcome."""
    status = "syntax_error" if prediction.status == "malformed" else prediction.status
    value = ladder.reward(status, prediction.position)
    if value is None:  # pragma: no cover - the world model never predicts a harness error
        raise ValueError(f"status {prediction.status!r} has no reward")
    return value


@dataclass(frozen=True)
class SampleSummary:
    """The score of one item from its parsed samples.

    Attributes:
        value: mean reward of the parsed samples.
        variance: per-call noise variance of ``value`` (sample variance / m), ``None`` if m < 2.
        spread: sample variance of the rewards (ddof=1), the model's predictive spread; ``None`` if m < 2.
        status: the most frequent predicted status (ties: the first one sampled).
        status_counts: predicted status -> number of samples.
        position: mean predicted position over the ``valid`` samples, ``None`` if there are none.
        rewards: the per-sample rewards, in sample order.
    """

    value: float
    variance: float | None
    spread: float | None
    status: str
    status_counts: dict[str, int]
    position: float | None
    rewards: tuple[float, ...]


def summarise_samples(predictions: Sequence[Prediction], ladder: RewardLadder) -> SampleSummary:
    """Expected reward and its noise from ``m >= 1`` parsed samples (see the module docstring)."""
    if not predictions:
        raise ValueError(
            "summarise_samples needs at least one parsed prediction; no samples means unknown (None)"
        )
    rewards = [prediction_reward(p, ladder) for p in predictions]
    m = len(rewards)
    mean = math.fsum(rewards) / m
    spread = math.fsum((r - mean) ** 2 for r in rewards) / (m - 1) if m >= 2 else None
    counts = Counter(p.status for p in predictions)
    top = max(counts.values())
    status = next(p.status for p in predictions if counts[p.status] == top)
    positions = [p.position for p in predictions if p.status == "valid" and p.position is not None]
    return SampleSummary(
        value=mean,
        variance=None if spread is None else spread / m,
        spread=spread,
        status=status,
        status_counts=dict(counts),
        position=math.fsum(positions) / len(positions) if positions else None,
        rewards=tuple(rewards),
    )


def expected_reward_from_probs(
    status_probs: Mapping[str, float], expected_position: float, ladder: RewardLadder
) -> tuple[float, float]:
    """``(expected reward, predictive variance of the reward)`` under a status distribution.

    Args:
        status_probs: probability of each status in :data:`WM_STATUSES` (renormalised here;
            every status must be present, each >= 0, total > 0).
        expected_position: ``E[position | valid]`` in [0, 1].
        ladder: the reward ladder.

    The variance treats the valid reward as ``floor + span·E[pos]`` (the position's own spread
    is not modelled), so it is the spread across statuses only.
    """
    missing = set(WM_STATUSES) - set(status_probs)
    if missing:
        raise ValueError(
            f"status_probs lacks {sorted(missing)}: give a probability for every status in {WM_STATUSES}"
        )
    total = math.fsum(status_probs[s] for s in WM_STATUSES)
    if any(status_probs[s] < 0 or not math.isfinite(status_probs[s]) for s in WM_STATUSES) or total <= 0:
        raise ValueError(f"status probabilities must be finite, >= 0 and not all 0; got {dict(status_probs)}")
    if not 0 <= expected_position <= 1:
        raise ValueError(f"expected_position must be in [0, 1]; got {expected_position}")
    rewards: dict[str, float] = {}
    for s in WM_STATUSES:
        reward = ladder.reward(s, expected_position if s == "valid" else None)
        assert reward is not None  # only harness_error has no reward, and it is not a WM status
        rewards[s] = reward
    mean = math.fsum(status_probs[s] / total * rewards[s] for s in WM_STATUSES)
    second = math.fsum(status_probs[s] / total * rewards[s] ** 2 for s in WM_STATUSES)
    return mean, max(second - mean**2, 0.0)
