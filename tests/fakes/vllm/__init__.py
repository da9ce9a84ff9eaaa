"""A fake of the part of vLLM's *offline* interface that TRL 1.16 and WMRL use, for CPU tests.

TRL's colocate mode needs vLLM importable in the training environment, and the vLLM that runs
here (its CPU build, in ``.venv-vllm``) pins ``transformers<5.20``, older than ours; so the TRL
colocate tests put this folder (and its ``vllm-0.30.0.dist-info``, which
makes ``importlib.metadata`` and TRL's ``is_vllm_available`` see a vLLM in TRL's supported range)
first on ``sys.path`` **in a subprocess** only. It is vLLM's interface, not vLLM: ``LLM`` loads the
model folder with transformers and samples with it (so outputs are real samples of the policy,
with their processed log-probs, as ``logprobs_mode="processed_logprobs"`` gives), and weight
updates go into that model. What it does not reproduce (paged attention, continuous batching,
CUDA graphs, tensor parallelism, sleep mode) is what ``benchmarks/gpu_check.py`` runs for real.

Interface reproduced: ``LLM(model, **engine_kwargs)``, ``LLM.generate(prompts, sampling_params,
use_tqdm)`` with prompts ``{"prompt_token_ids": [...]}`` (or strings), ``LLM.get_tokenizer()``,
``LLM.reset_prefix_cache()``, ``LLM.sleep()/wake_up()``,
``LLM.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(pairs)``,
``SamplingParams(n, temperature, top_p, top_k, min_p, max_tokens, logprobs, seed,
repetition_penalty, prompt_logprobs)``, ``RequestOutput(prompt_token_ids, outputs,
prompt_logprobs)``, ``CompletionOutput(index, text, token_ids, cumulative_logprob, logprobs,
finish_reason)``, ``Logprob(logprob, rank, decoded_token)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__version__ = "0.30.0"

#: every LLM built in this process (tests read what they were given)
INSTANCES: list[LLM] = []


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


class SamplingParams:
    def __init__(
        self,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        max_tokens: int | None = 16,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        seed: int | None = None,
        repetition_penalty: float = 1.0,
        **extra: Any,
    ) -> None:
        self.n, self.temperature, self.top_p, self.top_k, self.min_p = n, temperature, top_p, top_k, min_p
        self.max_tokens, self.logprobs, self.prompt_logprobs, self.seed = (
            max_tokens,
            logprobs,
            prompt_logprobs,
            seed,
        )
        self.repetition_penalty = repetition_penalty
        self.extra = extra


class _Weights:
    def __init__(self, model: Any) -> None:
        self._model = model

    def load_weights(self, weights) -> None:
        import torch

        state = self._model.state_dict()
        with torch.no_grad():
            for name, tensor in weights:
                if name not in state:
                    raise KeyError(f"fake vLLM: no parameter {name!r} in the served model")
                state[name].copy_(tensor.detach().to(state[name].dtype))


class _Chain:
    """``llm_engine.model_executor.driver_worker.model_runner.model`` (where TRL pushes weights)."""

    def __init__(self, model: Any) -> None:
        self.model_executor = self
        self.driver_worker = self
        self.model_runner = self
        self.model = _Weights(model)


class LLM:
    def __init__(self, model: str, **engine_kwargs: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = model
        self.engine_kwargs = engine_kwargs
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.llm_engine = _Chain(self.model)
        self.generated: list[list[int]] = []
        seed = engine_kwargs.get("seed") or 0
        self._generator = torch.Generator().manual_seed(int(seed))
        INSTANCES.append(self)

    def get_tokenizer(self):
        return self.tokenizer

    def reset_prefix_cache(self) -> bool:
        return True

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    def _ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, dict):
            return list(prompt["prompt_token_ids"])
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def _stop_ids(self) -> set[int]:
        ids = set()
        for value in (
            getattr(self.model.generation_config, "eos_token_id", None),
            self.tokenizer.eos_token_id,
        ):
            if value is None:
                continue
            ids.update(value if isinstance(value, (list, tuple)) else [value])
        return ids

    def _prompt_logprobs(self, ids: list[int]) -> list[dict[int, Logprob] | None]:
        import torch

        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        lp = logits.log_softmax(-1)
        out: list[dict[int, Logprob] | None] = [None]  # vLLM: no log-prob for the first prompt token
        for t in range(1, len(ids)):
            out.append({ids[t]: Logprob(float(lp[t - 1, ids[t]]), rank=None)})
        return out

    def generate(
        self, prompts, sampling_params: SamplingParams | None = None, use_tqdm: bool = True, **_: Any
    ):
        import torch

        params = sampling_params or SamplingParams()
        if not isinstance(prompts, (list, tuple)):
            prompts = [prompts]
        stops = self._stop_ids()
        results = []
        for r, prompt in enumerate(prompts):
            ids = self._ids(prompt)
            outputs = []
            for k in range(params.n):
                generator = self._generator
                if params.seed is not None:  # vLLM's per-request seed: the same samples whatever the batch
                    generator = torch.Generator().manual_seed(int(params.seed) + k)
                tokens, logps = [], []
                context = list(ids)
                finish = "length"
                with torch.inference_mode():
                    for _ in range(params.max_tokens or 16):
                        logits = self.model(input_ids=torch.tensor([context])).logits[0, -1].float()
                        if params.temperature == 0:
                            token = int(logits.argmax())
                            processed = logits.log_softmax(-1)
                        else:
                            scaled = logits / params.temperature
                            processed = scaled.log_softmax(-1)
                            probs = processed.exp()
                            if params.top_p < 1.0:
                                order = probs.argsort(descending=True)
                                cumulative = probs[order].cumsum(0)
                                drop = order[cumulative - probs[order] > params.top_p]
                                probs[drop] = 0
                                probs = probs / probs.sum()
                                processed = probs.clamp_min(1e-30).log()
                            token = int(torch.multinomial(probs, 1, generator=generator))
                        tokens.append(token)
                        logps.append(float(processed[token]))
                        context.append(token)
                        if token in stops:
                            finish = "stop"
                            break
                logprobs = (
                    [{t: Logprob(lp, rank=1)} for t, lp in zip(tokens, logps, strict=True)]
                    if params.logprobs is not None
                    else None
                )
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                outputs.append(CompletionOutput(k, text, tokens, float(sum(logps)), logprobs, finish))
                self.generated.append(tokens)
            prompt_lps = self._prompt_logprobs(ids) if params.prompt_logprobs is not None else None
            results.append(RequestOutput(str(r), None, ids, prompt_lps, outputs))
        return results
