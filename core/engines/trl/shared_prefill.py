"""GRPO generation with one prefill per group: a group's G rollouts share their prompt's key/value cache.

TRL's transformers path (no vLLM) hands ``generate`` each prompt G times, so the prompt is encoded
G times. On a CPU, with prompts several times longer than the replies, that prefill is most of
generation. Here each distinct prompt minus its last token is encoded once, its cache is repeated
for its G rollouts, and ``generate`` continues from there (the documented cache-reuse pattern of
``transformers``): the samples follow the same distribution. Prefilling draws no random numbers, so
with the same generator state the samples are those of TRL's path, up to float rounding of the logits.

:func:`equal_runs` finds the groups (TRL's sampler puts a prompt's G copies next to each other);
:func:`generate_shared` generates. vLLM has prefix caching of its own and does not come here.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

__all__ = ["equal_runs", "generate_shared"]


def equal_runs(prompt_ids: Sequence[Sequence[int]]) -> list[int] | None:
    """The length of each run of equal consecutive prompts, or ``None`` when the runs differ in length
    (then there is no one G to repeat by) or there are no repeats at all."""
    runs: list[int] = []
    for k, ids in enumerate(prompt_ids):
        if k and list(ids) == list(prompt_ids[k - 1]):
            runs[-1] += 1
        else:
            runs.append(1)
    if not runs or len(set(runs)) != 1 or runs[0] == 1:
        return None
    return runs


def generate_shared(model: Any, prompts: Sequence[Sequence[int]], n: int, pad_id: int, **kwargs: Any) -> Any:
    """``n`` samples per prompt with ONE prefill per prompt.

    Args:
        model: a ``transformers`` causal LM.
        prompts: the distinct prompts' token ids (each at least 2 tokens).
        n: samples per prompt.
        pad_id: the left-padding token.
        kwargs: ``generate``'s settings (``generation_config=...``).

    Returns:
        ``generate``'s output, shape ``(len(prompts) * n, width + new tokens)``: prompt ``i``'s
        samples are rows ``i * n .. i * n + n - 1``; the first ``width`` columns are the left-padded
        prompts (``width`` = the longest prompt).
    """
    import torch

    if any(len(p) < 2 for p in prompts):
        raise ValueError("shared prefill needs prompts of at least 2 tokens")
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), device=device)
        mask[row, width - len(prompt) :] = 1
    # position ids as generate derives them under left padding: real tokens only
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    first = model(
        input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True
    )
    cache = first["cache"] if "cache" in first else first["past_key_values"]
    cache.batch_repeat_interleave(n)
    del first
    # transformers 5.2x renamed past_key_values -> cache (the old name warns); accept both. A PEFT
    # wrapper's forward takes **kwargs: ask the model it wraps.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    return model.generate(
        input_ids=ids.repeat_interleave(n, dim=0),
        attention_mask=mask.repeat_interleave(n, dim=0),
        **{cache_kw: cache},
        **kwargs,
    )
