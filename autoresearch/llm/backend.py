"""The generation-backend interface shared by transformers, vLLM and OpenAI-compatible servers.

A backend turns a batch of chat conversations into ``n`` sampled completions each::

    backend.generate(prompts, n=4, temperature=0.7, top_p=0.9, max_new_tokens=256, seed=0)
    # -> list[list[str]], shape (len(prompts), n)

``complete(prompts, sampling, assistant_prefix=None)`` is the full form: it returns
:class:`Completion` records (text, per-token log-probs when asked, finish reason). An
``assistant_prefix`` starts the assistant's reply with fixed text (for example ``{"status": "``
to force JSON); the returned text is only what the model generated *after* the prefix.

A backend that fails raises :class:`BackendError`; ``partial`` then holds the completions of the
prompts that did succeed (``None`` for the others), so a caller can keep what it got.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "ROLES",
    "BackendBase",
    "BackendError",
    "Completion",
    "Conversation",
    "GenerationBackend",
    "SamplingConfig",
    "validate_conversations",
]

#: Chat roles a conversation may use.
ROLES = ("system", "user", "assistant")

Conversation = Sequence[Mapping[str, str]]


class BackendError(RuntimeError):
    """Generation failed for some or all prompts.

    Attributes:
        partial: one entry per prompt: its completions, or ``None`` where that prompt failed.
            ``None`` (the attribute itself) when nothing is known about which prompts failed.
    """

    def __init__(self, message: str, partial: list[list[Completion] | None] | None = None) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample.

    Attributes:
        n: completions per prompt (>= 1).
        temperature: softmax temperature (>= 0; 0 means greedy decoding).
        top_p: nucleus mass in (0, 1].
        max_new_tokens: cap on generated tokens per completion (>= 1).
        seed: base seed for reproducible sampling, or ``None`` for fresh randomness.
        logprobs: also return the log-probability of every generated token.
    """

    n: int = 1
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = 0
    logprobs: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingConfig.n must be an int >= 1; got {self.n!r}")
        if (
            not isinstance(self.temperature, (int, float))
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(
                f"SamplingConfig.temperature must be a finite number >= 0; got {self.temperature!r}"
            )
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1]; got {self.top_p!r}")
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or self.max_new_tokens < 1
        ):
            raise ValueError(
                f"SamplingConfig.max_new_tokens must be an int >= 1; got {self.max_new_tokens!r}"
            )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0
        ):
            raise ValueError(f"SamplingConfig.seed must be None or an int >= 0; got {self.seed!r}")
        if not isinstance(self.logprobs, bool):
            raise ValueError(f"SamplingConfig.logprobs must be a bool; got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Completion:
    """One generated continuation.

    Attributes:
        text: the generated text (after any assistant prefix, without the end-of-turn token).
        token_logprobs: natural-log probability of each generated token under the model
            (temperature 1, no truncation), shape ``(generated_tokens,)``; ``None`` unless asked.
        finish_reason: ``"stop"`` (end-of-turn token) or ``"length"`` (hit ``max_new_tokens``).
        token_ids: the generated token ids (including a final end-of-turn token), when the
            backend knows them (in-process backends; not the HTTP client).
    """

    text: str
    token_logprobs: tuple[float, ...] | None = None
    finish_reason: str | None = None
    token_ids: tuple[int, ...] | None = None


def validate_conversations(prompts: Sequence[Conversation]) -> list[list[dict[str, str]]]:
    """Check and copy a batch of chat conversations (``[{"role", "content"}, ...]`` each)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(
            "prompts must be a list of conversations (each a list of {'role', 'content'} messages)"
        )
    out = []
    for i, conversation in enumerate(prompts):
        if (
            isinstance(conversation, (str, bytes))
            or not isinstance(conversation, Sequence)
            or not conversation
        ):
            raise TypeError(f"prompt {i} must be a non-empty list of {{'role', 'content'}} messages")
        messages = []
        for j, message in enumerate(conversation):
            if (
                not isinstance(message, Mapping)
                or set(message) - {"role", "content"}
                or "role" not in message
            ):
                raise TypeError(f"prompt {i}, message {j} must be a mapping with keys 'role' and 'content'")
            role, content = message["role"], message.get("content", "")
            if role not in ROLES:
                raise ValueError(f"prompt {i}, message {j}: role must be one of {ROLES}; got {role!r}")
            if not isinstance(content, str):
                raise TypeError(f"prompt {i}, message {j}: content must be a string")
            messages.append({"role": role, "content": content})
        out.append(messages)
    return out


@runtime_checkable
class GenerationBackend(Protocol):
    """Anything that can sample chat completions in batches."""

    model_id: str

    def complete(
        self,
        prompts: Sequence[Conversation],
        sampling: SamplingConfig,
        assistant_prefix: str | None = None,
    ) -> list[list[Completion]]: ...

    def generate(
        self,
        prompts: Sequence[Conversation],
        n: int = 1,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        seed: int | None = 0,
        assistant_prefix: str | None = None,
    ) -> list[list[str]]: ...


class BackendBase:
    """Supplies :meth:`generate` on top of a subclass's :meth:`complete`."""

    model_id: str = "unknown"

    def complete(
        self,
        prompts: Sequence[Conversation],
        sampling: SamplingConfig,
        assistant_prefix: str | None = None,
    ) -> list[list[Completion]]:
        raise NotImplementedError

    def generate(
        self,
        prompts: Sequence[Conversation],
        n: int = 1,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        seed: int | None = 0,
        assistant_prefix: str | None = None,
    ) -> list[list[str]]:
        """Sample ``n`` completions per prompt; returns texts, shape ``(len(prompts), n)``."""
        sampling = SamplingConfig(
            n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
        )
        return [[c.text for c in row] for row in self.complete(prompts, sampling, assistant_prefix)]
