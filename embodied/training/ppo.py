"""PPO-clip on action tokens, with an optional KL penalty to a reference policy: the pure maths.

A VLA step emits ``A`` action tokens (7 for MiniVLA); each token is one decision of the token-level
MDP, so the ratio and the clip act per token. One sample is one (episode, timestep); the episode's
advantage (from the corrector: group-normalised, fusion weights already applied) is broadcast to
every token of every timestep of that episode. Per token, with ``r = exp(log π − log π_old)``::

    ℓ = −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A) + β · KL_k3(π ‖ π_ref)
    KL_k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1        (≥ 0, unbiased, Schulman's k3)

A sample's loss is the mean of ``ℓ`` over its ``A`` tokens, and a minibatch's loss is the sum of its
samples' losses divided by ``normalizer`` (the minibatch size: gradient accumulation over microbatches
then gives exactly the gradient of the minibatch mean). A NaN advantage means *no advantage* (an
unknown reward, or a group the corrector skipped): its sample contributes neither loss nor statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PPOTerms", "kl_k3", "ppo_token_loss"]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of ``KL(π ‖ π_ref)`` from samples of ``π``: ``e^{d} − d − 1``, ``d = ref − logp``."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


@dataclass
class PPOTerms:
    """A minibatch's (or microbatch's) loss and what to log about it.

    Attributes:
        loss: differentiable scalar (see the module docstring for the normalisation).
        tokens: valid tokens the statistics below are taken over (``Σ`` valid samples × A).
        policy_loss_sum, kl_ref_sum: sums over valid tokens of the clipped surrogate and of the k3 KL.
        clipped: valid tokens whose clipped term is active (zero gradient from the surrogate).
        approx_kl_sum: Σ over valid tokens of ``(r − 1) − log r`` (k3 estimate of ``KL(π_old ‖ π)``).
        ratio_min, ratio_max: extreme ratios over valid tokens (``nan`` when there is none).
    """

    loss: torch.Tensor
    tokens: int
    policy_loss_sum: float
    kl_ref_sum: float
    clipped: int
    approx_kl_sum: float
    ratio_min: float
    ratio_max: float


def ppo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    normalizer: float | None = None,
) -> PPOTerms:
    """The PPO-clip loss of ``B`` samples of ``A`` tokens each.

    Args:
        logp: ``(B, A)`` log-probabilities of the taken tokens under the current policy (differentiable).
        old_logp: ``(B, A)`` the same under the behaviour policy (constant across epochs).
        advantages: ``(B,)`` per-sample advantage; NaN = masked out.
        clip_low, clip_high: ``ε_low``, ``ε_high``.
        ref_logp: ``(B, A)`` under the reference policy; needed when ``kl_beta > 0``.
        kl_beta: KL weight ``β``.
        normalizer: divide the summed per-sample losses by this (default: the number of valid samples).

    Returns:
        :class:`PPOTerms`; ``loss`` is 0 (still differentiable) when no sample is valid.
    """
    if logp.ndim != 2 or logp.shape != old_logp.shape:
        raise ValueError(
            f"logp and old_logp must both be (B, A); got {tuple(logp.shape)} and {tuple(old_logp.shape)}"
        )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},); got {tuple(advantages.shape)}")
    if kl_beta > 0 and ref_logp is None:
        raise ValueError("kl_beta > 0 needs ref_logp (the reference policy's log-probabilities)")
    if ref_logp is not None and ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp must be {tuple(logp.shape)}; got {tuple(ref_logp.shape)}")
    old_logp = old_logp.detach().to(logp.device, logp.dtype)
    adv = advantages.detach().to(logp.device, logp.dtype)
    valid = torch.isfinite(adv)
    # Zero the masked advantages (NaN·0 would still be NaN in the backward pass), then drop their rows.
    adv = torch.where(valid, adv, torch.zeros_like(adv))[:, None]
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv)
    token_loss = -surrogate
    kl = None
    if ref_logp is not None:  # logged even when it is not penalised
        kl = kl_k3(logp, ref_logp.detach().to(logp.device, logp.dtype))
        if kl_beta > 0:
            token_loss = token_loss + kl_beta * kl
    per_sample = token_loss.mean(dim=1)
    n_valid = int(valid.sum())
    denom = float(normalizer) if normalizer is not None else float(max(n_valid, 1))
    loss = torch.where(valid, per_sample, torch.zeros_like(per_sample)).sum() / denom

    with torch.no_grad():
        a = logp.shape[1]
        rows = valid
        r = ratio[rows]
        adv_v = adv[rows]
        clipped = ((adv_v > 0) & (r > 1.0 + clip_high)) | ((adv_v < 0) & (r < 1.0 - clip_low))
        lr = log_ratio[rows]
        return PPOTerms(
            loss=loss,
            tokens=n_valid * a,
            policy_loss_sum=float((-surrogate[rows]).sum()),
            kl_ref_sum=float(kl[rows].sum()) if kl is not None else 0.0,
            clipped=int(clipped.sum()),
            approx_kl_sum=float(((torch.exp(lr) - 1.0) - lr).sum()),
            ratio_min=float(r.min()) if r.numel() else float("nan"),
            ratio_max=float(r.max()) if r.numel() else float("nan"),
        )
