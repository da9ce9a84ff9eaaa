"""The transformers backend on a tiny random model: shapes, seeds, log-probs, prefixes, errors."""

from __future__ import annotations

import pytest

from wmrl.autoresearch.llm.backend import BackendBase, SamplingConfig, validate_conversations

pytestmark = pytest.mark.transformers

PROMPTS = [
    [{"role": "user", "content": "hello there"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a much longer question about pandas"},
    ],
    [{"role": "user", "content": "x"}],
]


@pytest.fixture(scope="module")
def backend():
    from wmrl.autoresearch.llm.hf import TransformersBackend
    from wmrl.autoresearch.llm.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(arch="qwen2", seed=0)
    return TransformersBackend(model, tokenizer, model_id="tiny", batch_size=2)


def _teacher_forced_logprobs(backend, conversation, prefix, text_ids):
    """Log-probs of ``text_ids`` after the rendered prompt, from one plain forward pass."""
    import torch

    prompt = backend.render(conversation, prefix)
    prompt_ids = backend.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + list(text_ids)])
    with torch.inference_mode():
        logits = backend.model(input_ids=ids).logits[0].float().log_softmax(-1)
    start = len(prompt_ids)
    return [float(logits[start - 1 + t, tok]) for t, tok in enumerate(text_ids)]


def test_shape_is_prompts_by_n(backend):
    out = backend.generate(PROMPTS, n=3, max_new_tokens=6, seed=1)
    assert len(out) == 3 and all(len(row) == 3 for row in out)
    assert all(isinstance(text, str) for row in out for text in row)


def test_same_seed_same_samples_other_seed_differs(backend):
    a = backend.generate(PROMPTS, n=2, max_new_tokens=8, seed=7, temperature=1.0)
    b = backend.generate(PROMPTS, n=2, max_new_tokens=8, seed=7, temperature=1.0)
    c = backend.generate(PROMPTS, n=2, max_new_tokens=8, seed=8, temperature=1.0)
    assert a == b
    assert a != c


def test_the_callers_global_rng_is_untouched(backend):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    backend.generate(PROMPTS[:1], n=2, max_new_tokens=4, seed=0)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("n", [1, 3])
def test_token_logprobs_match_a_teacher_forced_forward_pass(backend, n):
    """Covers both paths: n=1 (plain generate) and n>1 (one prefill, cache repeated n times)."""
    prefix = '{"status": "'
    rows = backend.complete(
        PROMPTS, SamplingConfig(n=n, max_new_tokens=6, seed=3, temperature=1.0, logprobs=True), prefix
    )
    for conversation, row in zip(PROMPTS, rows, strict=True):
        for completion in row:
            assert completion.finish_reason in ("stop", "length")
            lp, ids = completion.token_logprobs, completion.token_ids
            assert lp is not None and len(lp) == len(ids) and 1 <= len(ids) <= 6 and all(x <= 0 for x in lp)
            expected = _teacher_forced_logprobs(backend, conversation, prefix, ids)
            assert lp == pytest.approx(expected, abs=2e-4)


def test_shared_prefix_path_equals_plain_copies_under_greedy(backend):
    greedy = SamplingConfig(n=3, temperature=0, max_new_tokens=10, logprobs=True)
    shared = backend.complete(PROMPTS, greedy)
    plain = backend.complete(
        [p for p in PROMPTS for _ in range(3)],
        SamplingConfig(n=1, temperature=0, max_new_tokens=10, logprobs=True),
    )
    for i, row in enumerate(shared):
        for j, completion in enumerate(row):
            twin = plain[3 * i + j][0]
            assert completion.text == twin.text
            assert completion.token_logprobs == pytest.approx(twin.token_logprobs, abs=2e-4)


def test_stop_token_ends_a_completion(backend):
    import torch

    # Make the first greedy token the end-of-turn token: the completion must stop at once.
    prompt = backend.render(PROMPTS[0])
    ids = torch.tensor([backend.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        first = int(backend.model(input_ids=ids).logits[0, -1].argmax())
    saved = backend._stop_ids
    backend._stop_ids = [first]
    try:
        out = backend.complete(
            PROMPTS[:1], SamplingConfig(n=2, temperature=0, max_new_tokens=5, logprobs=True)
        )
    finally:
        backend._stop_ids = saved
    assert [c.finish_reason for c in out[0]] == ["stop", "stop"]
    assert [c.text for c in out[0]] == ["", ""]
    assert all(len(c.token_logprobs) == 1 for c in out[0])  # the stop token's own log-prob is kept


def test_length_finish_reason_and_prefix_in_prompt(backend):
    out = backend.complete(
        PROMPTS[:1], SamplingConfig(n=1, max_new_tokens=3, seed=0), assistant_prefix="PREFIX"
    )
    assert out[0][0].finish_reason in ("length", "stop")
    assert backend.render(PROMPTS[0], "PREFIX").endswith("<|im_start|>assistant\nPREFIX")
    # The completion is only what follows the prefix: its ids decode to its text.
    assert backend.tokenizer.decode(out[0][0].token_ids, skip_special_tokens=True) == out[0][0].text


def test_batch_size_does_not_change_the_shape(backend):
    from wmrl.autoresearch.llm.hf import TransformersBackend

    one = TransformersBackend(backend.model, backend.tokenizer, batch_size=1)
    assert [len(r) for r in one.generate(PROMPTS, n=2, max_new_tokens=3)] == [2, 2, 2]
    greedy = {"n": 1, "temperature": 0, "max_new_tokens": 5}
    # Greedy decoding does not depend on batch composition (left padding is masked out).
    assert one.generate(PROMPTS, **greedy) == backend.generate(PROMPTS, **greedy)


def test_score_continuations_equals_full_forward(backend):
    candidates = ['valid"', 'runtime_error"', "x", "0.5,"]
    prefix = '{"status": "'
    got = backend.score_continuations(PROMPTS[1], prefix, candidates)
    for value, cand in zip(got, candidates, strict=True):
        ids = backend.tokenizer(cand, add_special_tokens=False)["input_ids"]
        assert value == pytest.approx(
            sum(_teacher_forced_logprobs(backend, PROMPTS[1], prefix, ids)), abs=5e-4
        )
    with pytest.raises(ValueError, match="candidates"):
        backend.score_continuations(PROMPTS[1], prefix, [])


def test_input_validation(backend):
    with pytest.raises(ValueError, match="n must be"):
        SamplingConfig(n=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="seed"):
        SamplingConfig(seed=-3)
    with pytest.raises(TypeError, match="list of conversations"):
        validate_conversations("hello")
    with pytest.raises(ValueError, match="role must be"):
        validate_conversations([[{"role": "robot", "content": "hi"}]])
    with pytest.raises(TypeError, match="content must be a string"):
        validate_conversations([[{"role": "user", "content": 3}]])
    with pytest.raises(ValueError, match="assistant_prefix"):
        backend.generate([[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]])


def test_a_tokenizer_without_chat_template_is_rejected(backend):
    from wmrl.autoresearch.llm.hf import TransformersBackend
    from wmrl.autoresearch.llm.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        TransformersBackend(backend.model, tokenizer)


def test_backend_base_generate_delegates_to_complete():
    from wmrl.autoresearch.llm.backend import Completion

    class Echo(BackendBase):
        model_id = "echo"

        def complete(self, prompts, sampling, assistant_prefix=None):
            return [
                [Completion(f"{p[-1]['content']}:{k}:{sampling.seed}") for k in range(sampling.n)]
                for p in prompts
            ]

    assert Echo().generate(PROMPTS[:2], n=2, seed=4) == [
        ["hello there:0:4", "hello there:1:4"],
        ["a much longer question about pandas:0:4", "a much longer question about pandas:1:4"],
    ]


def test_scoring_reuses_the_previous_prompts_shared_prefix_and_scores_the_same(backend):
    """Prompts that share a long prefix (the world model's instructions and task overview) re-encode
    only what follows it; the scores are those of a fresh full pass over each prompt."""
    from wmrl.autoresearch.llm.hf import TransformersBackend

    shared = "Task: predict the body mass of penguins from their measurements. " * 6
    prompts = [
        [{"role": "system", "content": "You judge scripts."}, {"role": "user", "content": shared + tail}]
        for tail in ("model = Ridge()", "model = RandomForestRegressor(n_estimators=50)", "model = None")
    ]
    candidates = ['valid"', 'runtime_error"', ["x", "0.5,"]]
    reusing = TransformersBackend(backend.model, backend.tokenizer)
    calls = []
    real_forward = reusing.model.forward

    def counting_forward(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[1])
        return real_forward(*args, **kwargs)

    reusing.model.forward = counting_forward
    try:
        got = [reusing.score_continuations(p, '{"status": "', candidates) for p in prompts]
    finally:
        del reusing.model.forward
    for prompt, scores in zip(prompts, got, strict=True):
        fresh = TransformersBackend(backend.model, backend.tokenizer)
        assert scores == pytest.approx(
            fresh.score_continuations(prompt, '{"status": "', candidates), abs=2e-4
        )
    full = len(
        backend.tokenizer(backend.render(prompts[1], '{"status": "'), add_special_tokens=False)["input_ids"]
    )
    # each prompt: one prefill and one candidates pass; the 2nd and 3rd prefills skip the shared prefix
    prefills = calls[0::2]
    assert len(calls) == 6 and prefills[0] > TransformersBackend.MIN_SHARED_PREFIX
    assert max(prefills[1:]) < full - TransformersBackend.MIN_SHARED_PREFIX
