"""Token counting and head/tail truncation for prompt budgets.

Budgets in the agent (overview, feedback) are in tokens of the agent's own tokenizer when one is
given (:class:`HFTokens`), else in an approximate count (:class:`ApproxTokens`: words, runs of
spaces and single punctuation marks, which tracks BPE counts of English and code within ~30 %)
so that overviews can be built without loading a model.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, runtime_checkable

__all__ = ["ApproxTokens", "HFTokens", "TokenCounter", "as_token_counter", "truncate_middle"]

_PIECES = re.compile(r"\w+|\s+|[^\w\s]", re.UNICODE)


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens and cuts text to a number of tokens from the start or the end."""

    def count(self, text: str) -> int: ...

    def head(self, text: str, n: int) -> str: ...

    def tail(self, text: str, n: int) -> str: ...


class ApproxTokens:
    """Approximate tokens: words, whitespace runs and punctuation marks (exact round trip)."""

    def _pieces(self, text: str) -> list[str]:
        return _PIECES.findall(text)

    def count(self, text: str) -> int:
        return len(self._pieces(text))

    def head(self, text: str, n: int) -> str:
        return "".join(self._pieces(text)[: max(n, 0)])

    def tail(self, text: str, n: int) -> str:
        return "".join(self._pieces(text)[-n:]) if n > 0 else ""


class HFTokens:
    """Exact counts with a Hugging Face tokenizer (no special tokens added)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count(self, text: str) -> int:
        return len(self._ids(text)) if text else 0

    def head(self, text: str, n: int) -> str:
        return self.tokenizer.decode(self._ids(text)[: max(n, 0)]) if n > 0 else ""

    def tail(self, text: str, n: int) -> str:
        return self.tokenizer.decode(self._ids(text)[-n:]) if n > 0 else ""


def as_token_counter(tokens: Any = None) -> TokenCounter:
    """``None`` -> :class:`ApproxTokens`; a counter -> itself; a HF tokenizer -> :class:`HFTokens`."""
    if tokens is None:
        return ApproxTokens()
    if isinstance(tokens, TokenCounter):
        return tokens
    if callable(tokens) and hasattr(tokens, "decode"):
        return HFTokens(tokens)
    raise TypeError(f"expected None, a TokenCounter or a Hugging Face tokenizer; got {type(tokens).__name__}")


def truncate_middle(
    text: str, max_tokens: int, tokens: TokenCounter | None = None, head_fraction: float = 2 / 3
) -> str:
    """Keep ``head_fraction`` of the budget from the start and the rest from the end.

    A marker line ``[... N tokens omitted ...]`` replaces the middle (its own tokens are paid from
    the budget), so the result never exceeds ``max_tokens`` tokens by more than the tokenizer's
    merge effects at the two cut points (a token or two). Text within budget is returned unchanged.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1; got {max_tokens}")
    if not 0 < head_fraction < 1:
        raise ValueError(f"head_fraction must be in (0, 1); got {head_fraction}")
    counter = as_token_counter(tokens)
    total = counter.count(text)
    if total <= max_tokens:
        return text
    marker = f"\n[... {total} tokens omitted ...]\n"
    room = max_tokens - counter.count(marker)
    if room < 2:
        return counter.head(text, max_tokens)
    head_n = int(room * head_fraction)
    tail_n = room - head_n
    marker = f"\n[... {total - head_n - tail_n} tokens omitted ...]\n"
    return counter.head(text, head_n) + marker + counter.tail(text, tail_n)
