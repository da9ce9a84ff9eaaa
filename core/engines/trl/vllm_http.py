"""GRPO generation through a stock vLLM server, the policy's weights pushed to it by file each step.

TRL's two vLLM modes cannot run on a CPU or across environments (TRL 1.16): ``server`` pushes
weights with NCCL (``trl/generation/vllm_client.py``: ``NotImplementedError`` on a CPU device, and
``trl vllm-serve`` starts the server through vLLM's console entry, which the CPU build cannot run),
and ``colocate`` needs vLLM importable in the trainer's environment. :class:`VLLMHTTPGeneration`
takes the place of TRL's ``VLLMGeneration`` in the trainer (the same ``sync_weights()`` and
``generate(prompts, images, num_generations)``), over plain HTTP to a vLLM OpenAI-compatible server
(``vllm serve`` or ``python -m vllm.entrypoints.openai.api_server``), anywhere the server can read
the trainer's files:

* **Weights.** A full policy: saved as a Hugging Face folder (safetensors) under ``weights_dir``,
  then ``POST /collective_rpc`` ``reload_weights`` (the server runs with ``VLLM_SERVER_DEV_MODE=1``)
  reloads them in place. A LoRA policy (peft): its adapter is saved there and
  ``POST /v1/load_lora_adapter`` with ``load_inplace`` swaps it (the server runs with
  ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); generation names the adapter.
* **Generation.** ``POST /v1/completions``, one request per run of identical prompts (a group)
  with ``n`` completions, all in flight together, the prompts as token ids, the policy's sampling
  settings, seeds of its own per request (``seed``, the step, the call, the place in the batch:
  vLLM gives a request's prompts one seed, and child ``j`` of ``n`` that seed + ``j``), the sampled
  tokens' ids and log-probabilities (``logprobs: 0``, ``return_token_ids``). The log-probabilities
  go to TRL's importance-sampling correction as from TRL's own vLLM modes; the server must then
  run with ``--logprobs-mode processed_logprobs`` (checked at start).

One training process (several ranks would each push weights): refused otherwise.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.core.config import ConfigError

__all__ = ["VLLMHTTPConfig", "VLLMHTTPGeneration"]


@dataclass(frozen=True)
class VLLMHTTPConfig:
    """Where the server is and where it reads the policy's weights.

    Attributes:
        base_url: the server's root (``http://host:8000``; a trailing ``/v1`` is accepted).
        weights_dir: a folder the trainer writes the weights to and the server reads them from
            (the same machine, or a shared file system).
        timeout_s: seconds one request may take (a generation call or a weight reload).
        seed: the base of the per-call sampling seeds.
    """

    base_url: str
    weights_dir: str
    timeout_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"the vLLM server's base_url must be an http(s) URL; got {self.base_url!r}")
        if not isinstance(self.weights_dir, str) or not self.weights_dir.strip():
            raise ConfigError("the vLLM server needs a weights_dir it can read")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise ConfigError(f"timeout_s must be > 0; got {self.timeout_s!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an int >= 0; got {self.seed!r}")

    @property
    def root(self) -> str:
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _check_tied_embeddings(model: Any) -> None:
    """Refuse a full policy whose trained embedding matrix is tied to its output layer.

    vLLM 0.32's in-place reload (``reload_weights``) loses the tie: measured on SmolLM2 (CPU build),
    after a reload whose only change was a 0.01-scale perturbation of the tied matrix, the served
    log-probs matched neither the new weights nor the old ones (1.9 nats off); with the embedding
    unchanged, every other weight reloads exactly (3e-5 nats)."""
    base = getattr(model, "module", model)
    config = getattr(base, "config", None)
    embeddings = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied and embeddings is not None and embeddings.weight.requires_grad:
        raise ConfigError(
            "the policy's embedding matrix is tied to its output layer and trained: vLLM's in-place weight reload "
            "loses the tie (the served log-probs match neither the new nor the old weights). Train a LoRA adapter "
            "(peft_config), or freeze the embeddings (model.get_input_embeddings().weight.requires_grad_(False))"
        )


class VLLMHTTPGeneration:
    """TRL's ``VLLMGeneration`` interface over a stock vLLM server (see the module docstring).

    Args:
        config: the server and the weights folder.
        model: the policy (a transformers model, or a peft model with one LoRA adapter).
        temperature / top_p / top_k / min_p / repetition_penalty: the policy's sampling settings
            (TRL's names; ``None`` where unset).
        max_completion_length: tokens per completion (per turn in K-turn episodes).
        step: returns the trainer's global step (the seeds and the adapter's name follow it).
        importance_sampling: TRL's importance-sampling correction is on (the server must return
            processed log-probs).
    """

    def __init__(
        self,
        config: VLLMHTTPConfig,
        model: Any,
        *,
        temperature: float,
        top_p: float,
        top_k: int | None,
        min_p: float | None,
        repetition_penalty: float | None,
        max_completion_length: int,
        step: Any,
        importance_sampling: bool,
    ) -> None:
        from wmrl.core.http import retrying_session

        self.config = config
        self.model = model
        self.sampling = {
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": -1 if top_k in (None, 0) else int(top_k),
            "min_p": 0.0 if min_p is None else float(min_p),
            "repetition_penalty": 1.0 if repetition_penalty is None else float(repetition_penalty),
            "max_tokens": int(max_completion_length),
        }
        self.step = step
        self.lora = _is_peft(model)
        # connection errors and busy replies are retried; a read timeout is not (it would only recur)
        self.session = retrying_session(retries=2, backoff_s=0.5, pool=32, read_retries=0)
        self.weights_dir = Path(config.weights_dir)
        self._calls = 0
        self._call_step = -1
        #: seconds spent writing weights and in the server's reload, per sync (for the logs)
        self.sync_seconds: list[float] = []
        if not self.lora:
            _check_tied_embeddings(model)
        models = self._get("/v1/models")
        self.served = models["data"][0]["id"]
        self.generation_model = self.served
        self._check_server(importance_sampling)

    # -- HTTP ---------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import requests

        url = self.config.root + path
        try:
            reply = self.session.request(method, url, json=body, timeout=self.config.timeout_s)
        except requests.RequestException as err:
            raise RuntimeError(f"the vLLM server at {self.config.root} did not answer {path}: {err}") from err
        if reply.status_code == 404 and path.split("?")[0] in ("/collective_rpc", "/server_info"):
            raise ConfigError(
                f"the vLLM server at {self.config.root} has no {path}: start it with VLLM_SERVER_DEV_MODE=1 "
                "(the weights reach it through its development endpoints)"
            )
        if reply.status_code == 404 and path == "/v1/load_lora_adapter":
            raise ConfigError(
                f"the vLLM server at {self.config.root} cannot load LoRA adapters at run time: start it with "
                "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            )
        if not reply.ok:
            raise RuntimeError(
                f"the vLLM server answered {path} with {reply.status_code}: {reply.text[:500]}"
            )
        if "json" not in reply.headers.get("content-type", ""):
            return reply.text  # load_lora_adapter answers in plain text
        return reply.json()

    def _get(self, path: str) -> Any:
        return self._request("GET", path)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return self._request("POST", path, body)

    def _check_server(self, importance_sampling: bool) -> None:
        info = self._get("/server_info?config_format=json")
        model_config = (info.get("vllm_config") or {}).get("model_config") or {}
        mode = model_config.get("logprobs_mode")
        if importance_sampling and mode != "processed_logprobs":
            raise ConfigError(
                f"the vLLM server returns {mode} log-probabilities; TRL's importance-sampling correction needs "
                "the sampling distribution's: restart it with --logprobs-mode processed_logprobs (or turn the "
                "correction off: vllm_importance_sampling_correction=false)"
            )
        if self.lora and not (info.get("vllm_config") or {}).get("lora_config"):
            raise ConfigError(
                f"the policy is a LoRA model but the vLLM server at {self.config.root} has LoRA off: start it "
                "with --enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            )

    # -- TRL's VLLMGeneration interface ---------------------------------------------------------
    def sync_weights(self) -> None:
        """Write the policy's current weights and have the server load them."""
        started = time.perf_counter()
        target = self.weights_dir / ("adapter" if self.lora else "policy")
        partial = target.with_name(target.name + ".writing")
        shutil.rmtree(partial, ignore_errors=True)
        model = getattr(self.model, "module", self.model)
        # safetensors: the server's loader reads it, and a half-written folder is never the live one
        model.save_pretrained(str(partial), safe_serialization=True)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
        if self.lora:
            name = "wmrl-policy"
            self._post(
                "/v1/load_lora_adapter",
                {"lora_name": name, "lora_path": str(target.resolve()), "load_inplace": True},
            )
            self.generation_model = name
        else:
            self._post(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(target.resolve())}},
            )
        self._reset_prefix_cache()
        self.sync_seconds.append(time.perf_counter() - started)

    def _reset_prefix_cache(self, tries: int = 20) -> None:
        """Drop the KV blocks computed with the old weights (or adapter). vLLM refuses while a request
        holds blocks (``{"success": false}``); between steps none should, so a refusal is retried briefly
        and then raised: stale blocks would give samples and log-probs of the old policy."""
        for _ in range(tries):
            answer = self._post("/reset_prefix_cache", {})
            if not isinstance(answer, dict) or answer.get("success", True):
                return
            time.sleep(0.25)
        raise RuntimeError(
            f"the vLLM server at {self.config.root} refused to reset its prefix cache {tries} times after a "
            "weight update (requests still running?)"
        )

    def generate(
        self,
        prompts: list[list[int]],
        images: Any,
        num_generations: int,
        profiler: Any = None,
    ) -> tuple[list[list[int]], list[list[int]], list[list[list[float]]], None]:
        """``num_generations`` completions of each distinct prompt (TRL repeats each prompt that many
        times in a row in ``prompts``).

        Returns:
            ``(prompt_ids, completion_ids, logprobs, None)`` as TRL's ``VLLMGeneration``: one row per
            entry of ``prompts``; ``logprobs[i][t]`` is ``[log-prob of the sampled token t]``.
        """
        if images is not None and any(i is not None for i in images):
            raise NotImplementedError("the vLLM HTTP generation takes text prompts only")
        if num_generations < 1 or len(prompts) % num_generations:
            raise ValueError(f"{len(prompts)} prompts are not whole groups of {num_generations}")
        # Runs of identical prompts (a group; at a K-turn episode's first turn, a group's contexts):
        # one request each, n = the run's length. vLLM gives one request's prompts a single seed and
        # child j of an n-sample request seed + j, so each request gets seeds of its own (a run of
        # identical prompts sent with n = 1 under one seed would sample one reply G times).
        runs: list[tuple[list[int], int]] = []
        for prompt in prompts:
            ids = [int(t) for t in prompt]
            if runs and runs[-1][0] == ids:
                runs[-1] = (ids, runs[-1][1] + 1)
            else:
                runs.append((ids, 1))
        step = int(self.step())
        if step != self._call_step:
            self._call_step, self._calls = step, 0
        self._calls += 1
        # seeds: the run's seed, the step, this step's call and the rollout's place in the batch, so a
        # run is reproducible and no two rollouts of a run share a sampling seed
        base = ((self.config.seed * 1_000_003 + step) * 1_000 + self._calls) * 1_000_000
        offsets = [sum(n for _, n in runs[:k]) for k in range(len(runs))]
        bodies = [
            {
                "model": self.generation_model,
                "prompt": ids,
                "n": n,
                "seed": (base + offset) % 2**62,
                "logprobs": 0,
                "return_token_ids": True,
                **self.sampling,
            }
            for (ids, n), offset in zip(runs, offsets, strict=True)
        ]
        from concurrent.futures import ThreadPoolExecutor

        with profiler or nullcontext(), ThreadPoolExecutor(max_workers=min(32, len(bodies))) as pool:
            # in flight together: the server batches them as one
            replies = list(pool.map(lambda body: self._post("/v1/completions", body), bodies))
        completion_ids, logprobs = [], []
        for (_, n), reply in zip(runs, replies, strict=True):
            choices = sorted(reply["choices"], key=lambda c: c["index"])
            if len(choices) != n:
                raise RuntimeError(f"the vLLM server returned {len(choices)} completions for {n}")
            for choice in choices:
                ids = choice.get("token_ids")
                lps = (choice.get("logprobs") or {}).get("token_logprobs")
                if ids is None or lps is None or len(ids) != len(lps):
                    raise RuntimeError(
                        "the vLLM server returned no token ids or log-probs (it needs return_token_ids and logprobs)"
                    )
                completion_ids.append([int(t) for t in ids])
                # None or NaN where vLLM had no number: NaN, which TRL's correction treats as ratio 1
                logprobs.append([[float("nan") if lp is None else float(lp)] for lp in lps])
        return [list(p) for p in prompts], completion_ids, logprobs, None
