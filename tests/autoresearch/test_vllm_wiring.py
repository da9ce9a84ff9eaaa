"""GRPO generation through TRL's vLLM integration, with a fake of vLLM's interface (TRL's colocate mode
needs vLLM in this environment; its CPU build pins an older transformers, so it lives in .venv-vllm).

``vllm_grpo_worker.py`` trains in a subprocess whose ``PYTHONPATH`` starts with ``tests/fakes``:
TRL's real ``VLLMGeneration`` (colocate) then builds ``vllm.LLM`` from the fake, samples through
it, pushes the policy's weights into it every step and computes its importance-sampling
correction from the fake's log-probs. The fake samples with the policy itself (transformers), so
the importance ratio must be 1: that checks that every log-prob lines up with its token, the
observation tokens of K-turn episodes included. What the fake does not run (paged attention, CUDA
graphs, NCCL weight transfer of server mode) ``benchmarks/gpu_check.py`` runs on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trl]

HERE = Path(__file__).resolve().parent
FAKES = HERE.parent / "fakes"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm")
    env = dict(
        os.environ, PYTHONPATH=f"{FAKES}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1"
    )
    done = subprocess.run(
        [sys.executable, str(HERE / "vllm_grpo_worker.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {r["turns"]: r for r in json.loads((out / "vllm.json").read_text())}


def test_trl_builds_vllm_in_colocate_mode_and_pushes_the_policy_every_step(runs):
    single = runs[1]
    kwargs = single["engine_kwargs"]
    assert kwargs["gpu_memory_utilization"] == "0.3"
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["logprobs_mode"] == "processed_logprobs"  # the IS correction needs processed log-probs
    assert single["model_path"].endswith("policy-1")
    # TRL pushes the policy parameter by parameter, once per step: every parameter twice in 2 steps
    pushed = single["weight_pushes"]
    assert single["steps"] == 2 and set(pushed) == {1} and len(pushed) == 2 * single["parameters"]


def test_single_turn_completions_are_vllms_samples(runs):
    single = runs[1]
    generated = {tuple(g) for g in single["generated"]}
    for step in single["outputs"]:
        for ids, mask in zip(step["completion_ids"], step["completion_mask"], strict=True):
            kept = tuple(t for t, m in zip(ids, mask, strict=True) if m)
            assert kept in generated
    assert "sampling/importance_sampling_ratio/mean" in single["log_keys"]


def test_k_turn_episodes_generate_every_turn_with_vllm(runs):
    multi = runs[2]
    generated = [tuple(g) for g in multi["generated"]]
    assert len(generated) == 2 * 2 * 4  # 2 steps x 2 turns x 4 rollouts, every one from vLLM
    checked = 0
    for step in multi["outputs"]:
        rows = zip(
            step["completion_ids"],
            step["completion_mask"],
            step["tool_mask"],
            step["sampling_logps"],
            step["advantages"],
            strict=True,
        )
        for ids, mask, tool, logps, advantage in rows:
            replies, observation = [], []
            for t, real, m, lp in zip(ids, mask, tool, logps, strict=True):
                if real:  # not padding
                    (replies if m else observation).append((t, lp))
            if not replies:  # a row the corrector left unknown: out of the loss entirely, advantage 0
                assert advantage == 0.0
                continue
            checked += 1
            assert observation, "a 2-turn completion has the feedback message between its replies"
            # observation tokens: no sampler log-prob; reply tokens: vLLM's log-probs, each aligned
            assert all(lp == 0.0 for _, lp in observation), observation
            assert all(lp < 0 for _, lp in replies), replies
    assert checked >= 4
    assert "sampling/importance_sampling_ratio/mean" in multi["log_keys"]
