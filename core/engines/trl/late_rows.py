"""Late anchor rows in a TRL generation batch (asynchronous anchors, :mod:`wmrl.core.late`).

A generation batch's rows are kept (CPU copies of the per-row tensors TRL's loss reads: prompt and
completion tokens and masks, the behaviour and reference log-probabilities) while their executions
run. When the executions land, :func:`append_rows` adds those rows, with their late advantages, to
the batch being trained (only the rows with a late advantage: with ``late_update=executed`` the
executed ones): padded to its widths (prompts on the left, completions on the right, as TRL pads them),
and topped up with empty (fully masked) rows to a multiple of
TRL's ``steps_per_generation`` (its splitter drops a remainder), and on several processes to the
row count of the rank with the most: TRL gathers per-row metrics across ranks (``clip_ratio/low_min``),
which needs every rank's batch to have as many rows. ``num_items_in_batch`` is left as
the batch's own: with a token-sum loss (``dapo``, ``cispo``, ``vespo``) the late rows add to the
step's update without diluting its own rows.

Where TRL carries ``old_per_token_logps`` the late rows carry theirs from generation, so TRL's clipped
ratio is taken against the behaviour policy (decoupled PPO); without them the late gradient is a
plain stale gradient at the current policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["LEFT_PADDED", "RIGHT_PADDED", "append_rows", "keep_rows", "live_rows", "padded_rows"]

#: Per-row tensors padded on the left (prompts) and on the right (completions and their per-token values).
LEFT_PADDED = ("prompt_ids", "prompt_mask")
RIGHT_PADDED = (
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)
_BATCH_SCALARS = ("num_items_in_batch",)


def keep_rows(output: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """CPU copies of a batch's per-row tensors, to be trained on when its executions land.

    Raises:
        ValueError: the batch carries inputs late rows cannot be padded with (images, other
            multimodal inputs): asynchronous anchors support text batches.
    """
    kept: dict[str, torch.Tensor] = {}
    for key, value in output.items():
        if key == "advantages" or key in _BATCH_SCALARS or value is None:
            continue
        if key not in LEFT_PADDED + RIGHT_PADDED:
            raise ValueError(
                f"asynchronous anchors keep a batch's rows for a later update, but TRL's batch carries {key!r}, "
                "which they cannot pad (text batches only); set corrector.asynchrony.max_anchor_lag=0"
            )
        kept[key] = value.detach().to("cpu", copy=True)
    return kept


def _pad(tensors: Sequence[torch.Tensor], value: float, left: bool) -> torch.Tensor:
    """Stack ``(n_i, T_i)`` tensors to ``(sum n_i, max T_i)``; 1-D or ``(n, 1)`` ones are concatenated."""
    if all(t.ndim == 1 or t.shape[1] == 1 for t in tensors):
        return torch.cat(list(tensors), dim=0)
    width = max(t.shape[1] for t in tensors)
    out = []
    for t in tensors:
        fill = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
        out.append(torch.cat([fill, t] if left else [t, fill], dim=1))
    return torch.cat(out, dim=0)


def live_rows(late: Sequence[tuple[Mapping[str, torch.Tensor], npt.NDArray[Any]]]) -> int:
    """How many late rows :func:`append_rows` trains (those with a late advantage)."""
    return int(sum(np.count_nonzero(~np.isnan(np.asarray(adv, dtype=np.float64))) for _, adv in late))


def padded_rows(rows: int, multiple: int) -> int:
    """``rows`` rounded up to a multiple of ``multiple`` (TRL's ``steps_per_generation``)."""
    return rows + (-rows) % multiple


def append_rows(
    output: dict[str, Any],
    late: Sequence[tuple[Mapping[str, torch.Tensor], npt.NDArray[Any]]],
    pad_token_id: int,
    multiple: int,
    total_rows: int | None = None,
) -> dict[str, Any]:
    """The batch ``output`` with the late rows appended (see the module docstring).

    Args:
        output: TRL's batch (``advantages`` already the corrector's, this rank's rows).
        late: per landed step, its kept rows (:func:`keep_rows`) and their late advantages ``(n,)``
            (NaN: nothing to apply to that row, which is left out).
        pad_token_id: the tokenizer's padding id.
        multiple: TRL's ``steps_per_generation`` (the batch is split in that many equal parts).
        total_rows: the row count to reach with empty rows (the most any rank has, padded to ``multiple``);
            ``None``: this batch's own and late rows, padded to ``multiple``.

    Raises:
        ValueError: ``total_rows`` is fewer than the batch's rows or not a multiple of ``multiple``.
    """
    own = output["advantages"].shape[0]
    needed = padded_rows(own + live_rows(late), multiple)
    target = needed if total_rows is None else total_rows
    if target < needed or target % multiple:
        raise ValueError(f"total_rows={total_rows} must be a multiple of {multiple} and at least {needed}")
    kept = []
    for rows, adv in late:  # only the rows with something to apply are trained again
        adv = np.asarray(adv, dtype=np.float64)
        live = np.flatnonzero(~np.isnan(adv))
        if live.size:
            index = torch.as_tensor(live)
            kept.append(({k: v.index_select(0, index) for k, v in rows.items()}, adv[live]))
    late = kept
    if target == own:
        return output
    device = output["advantages"].device
    parts: list[tuple[Mapping[str, torch.Tensor], npt.NDArray[Any]]] = list(late)
    extra = target - own - sum(len(adv) for _, adv in parts)
    if extra:  # empty rows (everything masked): TRL's splitter drops nothing, every rank has as many rows
        rows0 = parts[0][0] if parts else keep_rows(output)
        empty = {k: torch.zeros_like(v[:1]).repeat(extra, *([1] * (v.ndim - 1))) for k, v in rows0.items()}
        if "prompt_ids" in empty:
            empty["prompt_ids"].fill_(pad_token_id)
        if "completion_ids" in empty:
            empty["completion_ids"].fill_(pad_token_id)
        parts.append((empty, np.full(extra, np.nan)))
    if "tool_mask" not in output:
        output["tool_mask"] = torch.ones_like(output["completion_mask"])
    merged = dict(output)
    for key, value in output.items():
        if key == "advantages" or key in _BATCH_SCALARS or value is None:
            continue
        pieces = [value]
        for rows, adv in parts:
            if key == "tool_mask":
                base = rows.get("tool_mask", torch.ones_like(rows["completion_mask"]))
                keep = torch.as_tensor(~np.isnan(adv), dtype=base.dtype).unsqueeze(1)
                pieces.append((base * keep).to(device))
                continue
            if key not in rows:
                raise ValueError(
                    f"a late batch lacks {key!r}, which this batch carries: the runs' settings differ"
                )
            pieces.append(rows[key].to(device))
        if key in LEFT_PADDED:
            merged[key] = _pad(pieces, pad_token_id if key == "prompt_ids" else 0, left=True)
        else:
            merged[key] = _pad(pieces, pad_token_id if key == "completion_ids" else 0, left=False)
    advantages = [output["advantages"]] + [
        torch.as_tensor(np.nan_to_num(adv, nan=0.0), dtype=output["advantages"].dtype, device=device)
        for _, adv in parts
    ]
    merged["advantages"] = torch.cat(advantages, dim=0)
    return merged
