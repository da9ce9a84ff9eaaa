"""A tiny policy that writes real scripts, for tests: the tiny random model taught four replies.

A random tiny model never writes a fenced script, so every rollout would be ``malformed`` and every
GRPO group degenerate (all rewards equal). :func:`train_tiny_coder` fits the tiny model
(:mod:`wmrl.autoresearch.llm.tiny`) for a few dozen steps on four short replies to the given
prompts, so that sampling at temperature 1 yields a *mixture* of outcomes on a toy task (see
:func:`wmrl.autoresearch.tasks.toy.make_toy_task`): a valid submission, a runtime error, a run
without a submission and a syntax error, plus occasional corruptions of them. Groups then carry
real, varied rewards from the real sandbox. Deterministic for a seed; a few seconds on a CPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["TINY_CODER_REPLIES", "train_tiny_coder"]

_VALID = """Predict a constant.
```python
import os
import pandas as pd
t = pd.read_csv(os.environ["DATA_DIR"] + "/test.csv")
t["y"] = 0.5
t[["id", "y"]].to_csv(os.environ["SUBMISSION_PATH"], index=False)
```"""

_CRASH = """Print the target.
```python
import os
import pandas as pd
t = pd.read_csv(os.environ["DATA_DIR"] + "/test.csv")
print(t["y"].mean())
```"""

_NO_SUBMISSION = """Look at the data.
```python
import os
print(os.listdir(os.environ["DATA_DIR"]))
```"""

_SYNTAX = """Fit a model.
```python
def fit(:
    pass
```"""

#: The replies the tiny coder learns (in this order: valid, runtime error, no submission, syntax error).
TINY_CODER_REPLIES: tuple[str, ...] = (_VALID, _CRASH, _NO_SUBMISSION, _SYNTAX)


def train_tiny_coder(
    prompts: Sequence[Sequence[dict[str, str]]],
    replies: Sequence[str] = TINY_CODER_REPLIES,
    steps: int = 120,
    seed: int = 0,
    hidden_size: int = 64,
    save_to: str | os.PathLike | None = None,
) -> tuple[Any, Any]:
    """Teach the tiny model to answer each of ``prompts`` with one of ``replies`` (uniformly).

    Args:
        prompts: the chat prompts it will be sampled with (the training dataset's).
        replies: assistant replies to learn.
        steps: AdamW steps on the full (prompt x reply) batch.
        seed: weights and data order.
        hidden_size: width of the tiny model.
        save_to: also save the model and tokenizer there (a folder ``load_model`` accepts).

    Returns:
        ``(model, tokenizer)``, model in ``eval()`` mode.
    """
    import torch

    from wmrl.autoresearch.llm.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=seed, hidden_size=hidden_size)
    pairs = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for reply in replies:
            reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            pairs.append((prompt_ids, reply_ids))
    width = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (p, r) in enumerate(pairs):
        # left-padded, as at generation time, so the reply's positions match sampling
        start = width - len(p) - len(r)
        ids[row, start:] = torch.tensor(p + r)
        labels[row, start + len(p) :] = torch.tensor(r)
        mask[row, start:] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(steps):
            loss = model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels).loss
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    model.eval()
    if save_to is not None:
        out = Path(save_to)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return model, tokenizer
