"""Generation with a local ``transformers`` causal LM: batched, left-padded, seeded, on any device.

Prompts are rendered with the tokenizer's chat template, grouped into micro-batches of
``batch_size`` prompts (each expanded to ``n`` sequences) and sampled with ``model.generate``.

Determinism: a call seeds torch's generator once (in a forked RNG state, so the caller's global
RNG is untouched) and walks its micro-batches in order, so the same prompts, sampling settings
and ``batch_size`` give the same completions. A prompt's samples depend on which prompts share
its micro-batch (they share one random stream), unlike vLLM's per-request seeds.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from typing import Any

from wmrl.autoresearch.llm.backend import (
    BackendBase,
    Completion,
    Conversation,
    SamplingConfig,
    validate_conversations,
)

__all__ = ["TransformersBackend"]


class TransformersBackend(BackendBase):
    """A :class:`~wmrl.autoresearch.llm.backend.GenerationBackend` over an in-process model.

    Args:
        model: a ``transformers`` causal LM (put in ``eval()`` mode here).
        tokenizer: its tokenizer; it must have a chat template.
        model_id: a stable name for caches and logs.
        batch_size: prompts per ``generate`` call (each expanded to ``n`` sequences).

    Thread safety: calls are serialised with a lock (one model, one forward pass at a time).
    """

    def __init__(
        self, model: Any, tokenizer: Any, model_id: str = "transformers", batch_size: int = 8
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1; got {batch_size!r}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; chat backends need one to render messages")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model_id = model_id
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._stop_ids = self._end_token_ids()
        # The last scored prompt's token ids and key/value cache: the next prompt re-encodes only
        # what follows their common prefix (the world model's prompts of one task share the
        # instructions and the task overview, ~2/3 of each prompt).
        self._last_prompt: tuple[list[int], Any] | None = None

    @classmethod
    def from_spec(
        cls, spec: str = "smollm2", batch_size: int = 8, device: str = "cpu", dtype: str = "float32"
    ):
        """Load a model spec (see :func:`wmrl.autoresearch.llm.models.load_model`) into a backend."""
        from wmrl.autoresearch.llm.models import load_model

        loaded = load_model(spec, device=device, dtype=dtype)
        return cls(loaded.model, loaded.tokenizer, model_id=loaded.model_id, batch_size=batch_size)

    def _end_token_ids(self) -> list[int]:
        ids: list[int] = []
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        for value in (configured, self.tokenizer.eos_token_id):
            if value is None:
                continue
            ids.extend(value if isinstance(value, (list, tuple)) else [value])
        if not ids:
            raise ValueError(
                "neither the model's generation config nor the tokenizer defines an end-of-turn token"
            )
        return sorted(set(ids))

    def render(self, conversation: Conversation, assistant_prefix: str | None = None) -> str:
        """The exact prompt text the model sees: chat template + generation prompt + prefix."""
        messages = validate_conversations([conversation])[0]
        if messages[-1]["role"] == "assistant":
            raise ValueError(
                "the conversation ends with an assistant message; pass its text as assistant_prefix to continue it"
            )
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + (assistant_prefix or "")

    def complete(
        self,
        prompts: Sequence[Conversation],
        sampling: SamplingConfig,
        assistant_prefix: str | None = None,
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions per prompt; shape ``(len(prompts), n)``."""
        import torch

        texts = [self.render(c, assistant_prefix) for c in validate_conversations(prompts)]
        results: list[list[Completion]] = []
        with self._lock, torch.random.fork_rng(devices=[]), torch.inference_mode():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(texts), self.batch_size):
                results.extend(self._generate_batch(texts[start : start + self.batch_size], sampling))
        return results

    def _generate_batch(self, texts: list[str], sampling: SamplingConfig) -> list[list[Completion]]:
        import torch

        device = next(self.model.parameters()).device
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "num_return_sequences": sampling.n,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self._stop_ids,
            "return_dict_in_generate": True,
            "output_logits": sampling.logprobs,
        }
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            # top_k=0 switches off transformers' default top-k of 50: only temperature and top_p apply.
            kwargs.update(
                do_sample=True, temperature=float(sampling.temperature), top_p=float(sampling.top_p), top_k=0
            )
        if sampling.n > 1 and enc["input_ids"].shape[1] > 1:
            out = self._generate_shared_prefix(enc, sampling.n, kwargs)
        else:
            out = self.model.generate(**enc, **kwargs)
        new_tokens = out.sequences[:, enc["input_ids"].shape[1] :]
        logprobs = None
        if sampling.logprobs:
            # logits: one (rows, vocab) tensor per generated position, raw (before temperature/top-p).
            steps = torch.stack(out.logits, dim=1).float().log_softmax(dim=-1)
            logprobs = steps.gather(-1, new_tokens[:, : steps.shape[1]].unsqueeze(-1)).squeeze(-1)
        stop = torch.tensor(self._stop_ids, device=new_tokens.device)
        rows: list[Completion] = []
        for r in range(new_tokens.shape[0]):
            ids = new_tokens[r]
            hits = torch.isin(ids, stop).nonzero()
            if len(hits):
                end, reason = int(hits[0]) + 1, "stop"  # keep the end token's log-prob, drop its text
            else:
                end, reason = ids.shape[0], "length"
            text = self.tokenizer.decode(
                ids[: end if reason == "length" else end - 1], skip_special_tokens=True
            )
            lp = tuple(float(x) for x in logprobs[r, :end]) if logprobs is not None else None
            token_ids = tuple(int(x) for x in ids[:end])
            rows.append(Completion(text=text, token_logprobs=lp, finish_reason=reason, token_ids=token_ids))
        n = sampling.n
        return [rows[i * n : (i + 1) * n] for i in range(len(texts))]

    def _cache_kw(self) -> str:
        # transformers 5.2x renamed past_key_values -> cache (the old name warns); accept both.
        return "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def _generate_shared_prefix(self, enc: Any, n: int, kwargs: dict[str, Any]) -> Any:
        """Sample ``n`` continuations per prompt with ONE prefill per prompt.

        ``num_return_sequences=n`` would copy each prompt ``n`` times before the forward pass,
        so the prompt (most of the compute for long world-model prompts) would be encoded ``n``
        times. Instead the prompt minus its last token is encoded once, its key/value cache is
        repeated ``n`` times, and ``generate`` continues from there (the documented cache-reuse
        pattern); the samples follow the same distribution.
        """

        ids, mask = enc["input_ids"], enc["attention_mask"]
        # Position ids as generate derives them under left padding: count real tokens only.
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
        cache_kw = self._cache_kw()
        first = self.model(
            input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True
        )
        cache = first["cache"] if "cache" in first else first["past_key_values"]
        cache.batch_repeat_interleave(n)
        del first
        expanded = {
            "input_ids": ids.repeat_interleave(n, dim=0),
            "attention_mask": mask.repeat_interleave(n, dim=0),
            cache_kw: cache,
        }
        return self.model.generate(**expanded, **{**kwargs, "num_return_sequences": 1})

    #: Shortest common prefix (tokens) worth reusing the previous prompt's cache for.
    MIN_SHARED_PREFIX = 32

    def _prefill(self, prompt_ids: Any) -> Any:
        """The forward pass over ``prompt_ids`` (shape ``(1, T)``) with its key/value cache, reusing the
        previous prompt's cache for their common prefix; the result is that of one full pass
        (the same keys and values at the same positions), up to float rounding."""
        import copy

        ids = prompt_ids[0].tolist()
        shared = 0
        if self._last_prompt is not None:
            previous, _ = self._last_prompt
            limit = min(len(previous), len(ids) - 1)  # at least one new token gives the last logits
            while shared < limit and previous[shared] == ids[shared]:
                shared += 1
        if shared >= self.MIN_SHARED_PREFIX:
            assert self._last_prompt is not None  # shared (>= 32 > 0) grows only from a kept previous prompt
            previous, stored = self._last_prompt
            cache = copy.deepcopy(stored)
            if len(previous) > shared:
                cache.crop(shared - len(previous))  # a negative count: drop that many tokens from the end
            positions = _positions(shared, len(ids), prompt_ids.device)
            out = self.model(
                input_ids=prompt_ids[:, shared:],
                position_ids=positions,
                use_cache=True,
                **{self._cache_kw(): cache},
            )
        else:
            out = self.model(input_ids=prompt_ids, use_cache=True)
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        self._last_prompt = (ids, copy.deepcopy(cache))  # the caller extends its copy with candidates
        return out

    def score_continuations(
        self,
        conversation: Conversation,
        assistant_prefix: str,
        candidates: Sequence[str | Sequence[str]],
    ):
        """Log-probability of each candidate text right after ``assistant_prefix``.

        One forward pass over the prompt, whose key/value cache is then shared by all the
        candidates (scored together in one right-padded batch). A candidate given as a list of
        pieces is tokenised piece by piece, so ``[stem, tail]`` and ``[stem]`` share the stem's
        tokens exactly and ``score([stem, tail]) - score([stem])`` is ``log p(tail | stem)``.

        Returns:
            numpy array, shape ``(len(candidates),)``: ``sum_t log p(token_t | prompt, prefix, earlier tokens)``
            per candidate, natural log, under the raw model (temperature 1).
        """
        import numpy as np
        import torch

        pieces = [[c] if isinstance(c, str) else list(c) for c in candidates]
        if not pieces or any(not p or not all(isinstance(x, str) and x for x in p) for p in pieces):
            raise ValueError("candidates must be a non-empty list of non-empty strings (or lists of them)")
        prompt = self.render(conversation, assistant_prefix)
        device = next(self.model.parameters()).device
        with self._lock, torch.inference_mode():
            prompt_ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)[
                "input_ids"
            ].to(device)
            first = self._prefill(prompt_ids)
            cand_ids = [
                [t for x in p for t in self.tokenizer(x, add_special_tokens=False)["input_ids"]]
                for p in pieces
            ]
            width = max(len(ids) for ids in cand_ids)
            pad = self.tokenizer.pad_token_id
            batch = torch.tensor([ids + [pad] * (width - len(ids)) for ids in cand_ids], device=device)
            mask = torch.tensor(
                [[1] * len(ids) + [0] * (width - len(ids)) for ids in cand_ids], device=device
            )
            cache = first["cache"] if "cache" in first else first["past_key_values"]
            cache.batch_repeat_interleave(len(candidates))
            cache_kw = self._cache_kw()
            full_mask = torch.cat(
                [torch.ones(len(candidates), prompt_ids.shape[1], dtype=mask.dtype, device=device), mask], 1
            )
            positions = torch.arange(prompt_ids.shape[1], prompt_ids.shape[1] + width, device=device).expand(
                len(candidates), -1
            )
            rest = self.model(
                input_ids=batch, attention_mask=full_mask, position_ids=positions, **{cache_kw: cache}
            )
            # The prompt's last logits predict each candidate's first token; the candidate's own
            # logits at t predict its token t+1.
            logits = torch.cat(
                [first.logits[:, -1:, :].expand(len(candidates), -1, -1), rest.logits[:, :-1, :]], 1
            )
            token_lp = logits.float().log_softmax(-1).gather(-1, batch.unsqueeze(-1)).squeeze(-1)
            totals = (token_lp * mask).sum(dim=1)
        return np.asarray(totals.cpu(), dtype=np.float64)


def _positions(start: int, stop: int, device: Any) -> Any:
    """Position ids ``start .. stop - 1``, shape ``(1, stop - start)``."""
    import torch

    return torch.arange(start, stop, device=device).unsqueeze(0)
