"""One prefill per GRPO group: the same samples as generating every copy of the prompt."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_equal_runs_finds_the_groups_of_repeated_prompts():
    from wmrl.core.engines.trl.shared_prefill import equal_runs

    assert equal_runs([[1, 2], [1, 2], [3], [3]]) == [2, 2]
    assert equal_runs([[1, 2], [1, 2], [1, 2], [5, 6], [5, 6], [5, 6]]) == [3, 3]
    assert equal_runs([[1, 2], [1, 2], [3]]) is None  # groups of unequal size
    assert equal_runs([[1, 2], [3, 4]]) is None  # nothing repeated
    assert equal_runs([]) is None


def _tiny_lm():
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("n", [2, 3])
def test_shared_prefill_samples_what_generating_each_copy_samples(n):
    """Greedy decoding is deterministic, so the shared-prefill rows must equal the rows of plain
    ``generate`` over the repeated, left-padded prompts; and sampling gives ``n`` rows per prompt."""
    from wmrl.core.engines.trl.shared_prefill import generate_shared

    model = _tiny_lm()
    prompts = [[5, 9, 11, 3, 7, 8], [4, 2, 6]]  # unequal lengths: left padding
    pad = 0
    greedy = transformers.GenerationConfig(
        max_new_tokens=6, do_sample=False, pad_token_id=pad, eos_token_id=63
    )
    with torch.no_grad():
        shared = generate_shared(model, prompts, n, pad, generation_config=greedy)
        width = max(len(p) for p in prompts)
        rows = [p for p in prompts for _ in range(n)]
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
        plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)
    assert shared.shape == plain.shape == (len(prompts) * n, width + 6)
    assert torch.equal(shared, plain)
    sampling = transformers.GenerationConfig(
        max_new_tokens=5, do_sample=True, temperature=1.0, pad_token_id=pad
    )
    with torch.no_grad():
        sampled = generate_shared(model, prompts, n, pad, generation_config=sampling)
    assert sampled.shape[0] == len(prompts) * n
    with pytest.raises(ValueError, match="at least 2 tokens"):
        generate_shared(model, [[5]], n, pad, generation_config=greedy)
