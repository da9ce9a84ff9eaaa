"""The policy update of one training step: several PPO epochs over the collected samples.

1. With the policy exactly as it acted (eval mode, no gradient), recompute the log-probabilities of
   the sampled tokens once: these are the behaviour policy's ``log π_old``, fixed for every epoch.
   (Recomputing rather than reusing what ``act`` reported keeps one code path, teacher-forced and
   batched, for old and new; the gap between the two is logged as ``ppo/behaviour_logp_gap``.)
   The reference policy's log-probabilities (for the KL) are computed once as well.
2. ``epochs`` passes; each shuffles the samples (seeded by ``(seed, step, epoch)``) into minibatches
   of ``minibatch_size``; each minibatch accumulates gradients over microbatches and takes one AdamW
   step after clipping the global gradient norm. From the second minibatch on the policy differs
   from ``π_old``, so the ratio departs from 1 and the clip binds (``ppo/clip_fraction``).

On several processes (:class:`~wmrl.core.distributed.Processes`) each rank holds its own episodes'
samples; the step's samples are those of every rank in rank order, the shuffle permutes all of them
(the same generator on every rank), each minibatch is the same set of samples as on one process,
each rank computes the loss of its members of it (normalised by the whole minibatch's size) and the
gradients are summed over the ranks before clipping and the AdamW step: the update is the one a
single process makes on the whole batch (up to float summation order), and the parameters stay
identical on every rank. The metrics are the whole batch's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch

from wmrl.core.distributed import Processes
from wmrl.embodied.training.batch import SampleBatch
from wmrl.embodied.training.config import PPOConfig
from wmrl.embodied.training.ppo import ppo_token_loss

__all__ = ["LogProbFn", "PPOUpdater"]

LogProbFn = Callable[[Sequence[Any], Sequence[str], np.ndarray], torch.Tensor]
"""``(observations, instructions, token_ids (B, A)) -> (B, A)`` per-token log-probabilities."""

_STREAM = 0x70_70_6F_21  # the minibatch-shuffle random stream


class PPOUpdater:
    """Owns the AdamW optimiser of the trainable parameters and runs :meth:`update` once per step.

    Args:
        policy: a :class:`~wmrl.embodied.policy.base.TrainablePolicy` (``action_log_probs``,
            ``trainable_parameters``, ``train``/``eval``).
        config: the PPO settings.
        reference: log-probabilities under the frozen reference policy (needed when ``kl_beta > 0``).
        processes: the ranks of a data-parallel run (default: this process alone); rank 0's trainable
            parameters are copied to every rank here, and every rank must call :meth:`update` together.
    """

    def __init__(
        self,
        policy: Any,
        config: PPOConfig,
        reference: LogProbFn | None = None,
        learning_rate: float = 1e-4,
        processes: Processes | None = None,
    ) -> None:
        self.policy = policy
        self.processes = processes or Processes()
        self.config = config
        self.reference = reference
        if config.kl_beta > 0 and reference is None:
            raise ValueError("ppo.kl_beta > 0 needs a reference policy")
        self.params = list(policy.trainable_parameters())
        if not self.params:
            raise ValueError("the policy has no trainable parameters (apply LoRA or unfreeze a part of it)")
        self.processes.broadcast_(self.params)  # every rank starts from rank 0's parameters
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=learning_rate,
            betas=cast(tuple[float, float], tuple(config.betas)),  # two numbers (PPOConfig checks it)
            weight_decay=config.weight_decay,
        )

    def _log_probs(self, fn: LogProbFn, batch: SampleBatch, idx: np.ndarray) -> torch.Tensor:
        return fn(
            [batch.observations[i] for i in idx], [batch.instructions[i] for i in idx], batch.token_ids[idx]
        )

    @torch.no_grad()
    def _frozen_log_probs(self, fn: LogProbFn, batch: SampleBatch) -> torch.Tensor:
        chunks = []
        micro = self.config.microbatch_size
        for start in range(0, len(batch), micro):
            idx = np.arange(start, min(start + micro, len(batch)))
            chunks.append(self._log_probs(fn, batch, idx).float())
        return torch.cat(chunks)

    def update(self, batch: SampleBatch, step: int, seed: int) -> dict[str, float | None]:
        """Run the epochs over ``batch``; returns the ``ppo/*`` metrics (``None`` where not measurable)."""
        cfg = self.config
        ranks = self.processes
        n = len(batch)
        local_episodes = len(np.unique(batch.episode))
        if ranks.distributed:
            counts = ranks.all_gather_object((n, local_episodes))
            total = sum(c[0] for c in counts)
            offset = sum(c[0] for c in counts[: ranks.rank])  # this rank's samples among the step's
            episodes = sum(c[1] for c in counts)
        else:
            total, offset, episodes = n, 0, local_episodes
        metrics: dict[str, float | None] = {
            "ppo/samples": float(total),
            "ppo/episodes": float(episodes),
            "ppo/updates": 0.0,
        }
        empty = (
            "ppo/loss",
            "ppo/policy_loss",
            "ppo/kl_ref",
            "ppo/clip_fraction",
            "ppo/clip_fraction_last_epoch",
            "ppo/approx_kl",
            "ppo/ratio_min",
            "ppo/ratio_max",
            "ppo/grad_norm",
            "ppo/grad_norm_max",
            "ppo/behaviour_logp_gap",
            "ppo/advantage_abs_mean",
        )
        metrics.update(dict.fromkeys(empty))
        if total == 0:
            return metrics  # nothing carries a gradient this step (e.g. every group degenerate)

        self.policy.eval()
        old = ref = None
        gap = adv_abs = 0.0
        if n:
            old = self._frozen_log_probs(self.policy.action_log_probs, batch)
            if cfg.kl_beta > 0:
                assert self.reference is not None  # __init__ refuses kl_beta > 0 without a reference
                ref = self._frozen_log_probs(self.reference, batch)
            gap = float(np.max(np.abs(old.sum(dim=1).double().cpu().numpy() - batch.behaviour_logp)))
        adv = torch.as_tensor(batch.advantage, dtype=torch.float32)
        adv_abs = float(adv.abs().sum())
        if ranks.distributed:
            shared = ranks.all_gather_object((gap if n else None, adv_abs))
            gap = max(g for g, _ in shared if g is not None)
            adv_abs = sum(a for _, a in shared)
        metrics["ppo/behaviour_logp_gap"] = gap
        metrics["ppo/advantage_abs_mean"] = adv_abs / total

        self.policy.train()
        losses, norms = [], []
        tokens = clipped = 0
        pol_sum = kl_sum = 0.0
        ratio_min, ratio_max = float("inf"), float("-inf")
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        try:
            for epoch in range(cfg.epochs):
                order = np.random.default_rng([int(seed), int(step), epoch, _STREAM]).permutation(total)
                e_tokens = e_clipped = 0
                e_approx = 0.0
                for start in range(0, total, cfg.minibatch_size):
                    mb = order[start : start + cfg.minibatch_size]
                    own = mb[(mb >= offset) & (mb < offset + n)] - offset  # this rank's members
                    self.optimizer.zero_grad(set_to_none=True)
                    mb_loss = 0.0
                    for m0 in range(0, len(own), cfg.microbatch_size):
                        idx = own[m0 : m0 + cfg.microbatch_size]
                        assert old is not None  # own holds this rank's samples: there are some (n > 0)
                        logp = self._log_probs(self.policy.action_log_probs, batch, idx).float()
                        terms = ppo_token_loss(
                            logp,
                            old[idx],
                            adv[idx],
                            clip_low=cfg.clip_low,
                            clip_high=cfg.clip_high,
                            ref_logp=None if ref is None else ref[idx],
                            kl_beta=cfg.kl_beta,
                            normalizer=len(mb),
                        )
                        if not torch.isfinite(terms.loss.detach()):
                            raise FloatingPointError(
                                f"the PPO loss became {float(terms.loss.detach())} at step {step}, epoch {epoch}: "
                                "lower learning_rate or check the advantages"
                            )
                        terms.loss.backward()
                        mb_loss += float(terms.loss.detach())
                        tokens += terms.tokens
                        clipped += terms.clipped
                        pol_sum += terms.policy_loss_sum
                        kl_sum += terms.kl_ref_sum
                        e_tokens += terms.tokens
                        e_clipped += terms.clipped
                        e_approx += terms.approx_kl_sum
                        ratio_min = min(ratio_min, terms.ratio_min)
                        ratio_max = max(ratio_max, terms.ratio_max)
                    if ranks.distributed:  # the whole minibatch's gradient, on every rank
                        for p in self.params:
                            if p.grad is None:
                                p.grad = torch.zeros_like(p)
                        ranks.all_reduce_sum([p.grad for p in self.params])
                    norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
                    norms.append(float(norm))
                    self.optimizer.step()
                    losses.append(mb_loss)
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.policy.eval()
        if ranks.distributed:  # the sums over every rank's samples
            sums = torch.tensor(
                [tokens, clipped, pol_sum, kl_sum, e_tokens, e_clipped, e_approx, *losses],
                dtype=torch.float64,
                device=self.params[0].device,
            )
            ranks.all_reduce_sum([sums])
            tokens, clipped, e_tokens, e_clipped = (round(float(sums[i])) for i in (0, 1, 4, 5))
            pol_sum, kl_sum, e_approx = float(sums[2]), float(sums[3]), float(sums[6])
            losses = [float(v) for v in sums[7:]]
            extremes = ranks.all_gather_object((ratio_min, ratio_max))
            ratio_min = min(lo for lo, _ in extremes)
            ratio_max = max(hi for _, hi in extremes)
        metrics.update(
            {
                "ppo/updates": float(len(losses)),
                "ppo/loss": float(np.mean(losses)),
                "ppo/policy_loss": pol_sum / tokens,
                "ppo/kl_ref": kl_sum / tokens if ref is not None else None,
                "ppo/clip_fraction": clipped / tokens,
                "ppo/clip_fraction_last_epoch": e_clipped / e_tokens,
                "ppo/approx_kl": e_approx / e_tokens,
                "ppo/ratio_min": ratio_min,
                "ppo/ratio_max": ratio_max,
                "ppo/grad_norm": float(np.mean(norms)),
                "ppo/grad_norm_max": float(np.max(norms)),
            }
        )
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
