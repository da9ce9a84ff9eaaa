"""Robometer's network: a Qwen3-VL backbone and the heads read at the per-frame progress tokens.

* ``backbone``: ``transformers.Qwen3VLModel`` (vision tower with deepstack + Qwen3 LLM, no LM head),
  exactly the class Robometer wraps. Its final hidden states (after the last RMSNorm; Robometer reads
  ``hidden_states[-1]``, the same tensor) are gathered at every ``<|prog_token|>`` position, one per
  frame, in frame order.
* ``progress_head``: ``Linear(d, d/2) -> LayerNorm -> GELU -> Dropout -> Linear(d/2, n_bins)``; the
  progress of a frame is the softmax-weighted mean of the bin centres ``linspace(0, 1, n_bins)``
  (:func:`bins_to_progress`).
* ``success_head``: the same MLP with one output, a logit; success probability = sigmoid.
* ``preference_head`` and ``frame_pool_attn`` exist in every Robometer checkpoint (trajectory
  preference and an alternative pooling used in training); they are kept so checkpoints load strictly
  and are never used for progress scoring.

Our head layers are named ``fc_in``/``norm``/``fc_out``; :mod:`robometer_checkpoint` maps them from
the ``nn.Sequential`` indices (0/1/4) of Robometer's checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wmrl.embodied.worldmodel.robometer_config import RobometerConfig

__all__ = ["PredictionHead", "RobometerLogits", "RobometerModel", "bins_to_progress", "progress_std"]


def bins_to_progress(logits: torch.Tensor) -> torch.Tensor:
    """Expected progress of a ``(..., n_bins)`` logit tensor: ``Σ_i softmax(logits)_i · i/(n_bins-1)``.

    Computed in float32 whatever the input dtype; returns ``(...)`` values in ``[0, 1]``.
    """
    n_bins = logits.shape[-1]
    centres = torch.linspace(0.0, 1.0, n_bins, device=logits.device, dtype=torch.float32)
    return (torch.softmax(logits.float(), dim=-1) * centres).sum(dim=-1)


def progress_std(logits: torch.Tensor) -> torch.Tensor:
    """Standard deviation of the progress distribution of ``(..., n_bins)`` logits (diagnostics only)."""
    n_bins = logits.shape[-1]
    centres = torch.linspace(0.0, 1.0, n_bins, device=logits.device, dtype=torch.float32)
    probs = torch.softmax(logits.float(), dim=-1)
    mean = (probs * centres).sum(dim=-1, keepdim=True)
    return (probs * (centres - mean) ** 2).sum(dim=-1).clamp_min(0).sqrt()


class PredictionHead(nn.Module):
    """``Linear(d, d/2) -> LayerNorm -> GELU -> Dropout -> Linear(d/2, out)`` (Robometer's head MLP)."""

    def __init__(self, hidden_size: int, out_features: int, dropout: float) -> None:
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, hidden_size // 2)
        self.norm = nn.LayerNorm(hidden_size // 2)
        self.act = nn.GELU()
        self.dropout = nn.Dropout(dropout)
        self.fc_out = nn.Linear(hidden_size // 2, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.dropout(self.act(self.norm(self.fc_in(x)))))


@dataclass
class RobometerLogits:
    """Per-trajectory head outputs (lists, because trajectories may hold different frame counts).

    Attributes:
        progress: B tensors ``(K_b, n_bins)`` of progress-bin logits.
        success: B tensors ``(K_b,)`` of success logits.
    """

    progress: list[torch.Tensor]
    success: list[torch.Tensor]


class RobometerModel(nn.Module):
    """Backbone + heads (see the module docstring)."""

    def __init__(self, config: RobometerConfig) -> None:
        super().__init__()
        from transformers import Qwen3VLModel

        self.config = config
        self.backbone = Qwen3VLModel(config.qwen3_vl_config())
        d = config.hidden_size
        self.progress_head = PredictionHead(d, config.n_bins, config.head_dropout)
        self.success_head = PredictionHead(d, 1, config.head_dropout)
        self.preference_head = PredictionHead(d, 1, config.head_dropout)
        self.frame_pool_attn = nn.Linear(d, 1, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mm_token_type_ids: torch.Tensor,
        prog_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        image_grid_thw: torch.Tensor,
    ) -> RobometerLogits:
        """Head logits at the progress tokens of each row (inputs as built by ``RobometerProcessor.encode``)."""
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=pixel_values,
            image_grid_thw=image_grid_thw,
            mm_token_type_ids=mm_token_type_ids,
            use_cache=False,
        )
        hidden = out.last_hidden_state
        counts = prog_mask.sum(dim=1)
        if bool((counts == 0).any()):
            raise ValueError("a trajectory has no <|prog_token|>: it cannot be scored")
        # Boolean indexing walks rows in order and positions left to right: frame order per row.
        at_tokens = hidden[prog_mask]
        progress = self.progress_head(at_tokens)
        success = self.success_head(at_tokens).squeeze(-1)
        sizes = counts.tolist()
        return RobometerLogits(list(progress.split(sizes)), list(success.split(sizes)))
