"""A tiny random-initialised causal LM with a real trained tokenizer and a chat template, for tests.

Built entirely in process (no download, ~0.1 s): a byte-level BPE tokenizer trained on a small
corpus of chat, Python and JSON text, wrapped as a ``PreTrainedTokenizerFast`` with a ChatML chat
template, plus a Qwen2 or Llama model with a few thousand parameters per layer. Its outputs are
random tokens, but every code path (chat templates, left padding, batched sampling, log-probs,
saving and reloading) is the same as for a real model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["CHATML_TEMPLATE", "build_tiny_model", "build_tiny_tokenizer", "save_tiny_model"]

#: ChatML, the format of Qwen2 and SmolLM2 chat models. ``add_generation_prompt`` opens an
#: assistant turn; ``continue_final_message`` is handled by transformers itself.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "You are a helpful assistant. Write one complete Python script.",
    "import numpy as np\nimport pandas as pd\nfrom sklearn.linear_model import LogisticRegression\n",
    "df = pd.read_csv(os.path.join(os.environ['DATA_DIR'], 'train.csv'))\nprint(df.shape)\n",
    'pred.to_csv(os.environ["SUBMISSION_PATH"], index=False)\n',
    '{"status": "valid", "error_type": null, "error_line": null, "position": 0.5, "feedback": "ok"}',
    '{"status": "runtime_error", "error_type": "KeyError", "error_line": 12, "feedback": "Traceback"}',
    "Traceback (most recent call last):\n  File \"solution.py\", line 3, in <module>\nKeyError: 'target'\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 ```python\n```\n",
]


def build_tiny_tokenizer(vocab_size: int = 512) -> Any:
    """A byte-level BPE tokenizer (any text encodes) with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|im_end|>", "<|im_start|>"]
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(
    arch: str = "qwen2", seed: int = 0, hidden_size: int = 32, layers: int = 2
) -> tuple[Any, Any]:
    """Build ``(model, tokenizer)``: a random ``arch`` ("qwen2" or "llama") causal LM.

    Args:
        arch: ``"qwen2"`` (Qwen2ForCausalLM) or ``"llama"`` (LlamaForCausalLM, SmolLM2's class).
        seed: torch seed for the weights (the same seed gives the same weights).
        hidden_size: model width (multiple of 8).
        layers: number of decoder layers.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}; got {arch!r}")
    if hidden_size <= 0 or hidden_size % 8:
        raise ValueError(f"hidden_size must be a positive multiple of 8; got {hidden_size}")
    tokenizer = build_tiny_tokenizer()
    config_cls, model_cls = classes[arch]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,  # world-model prompts run to a few thousand tokens
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.eval()
    return model, tokenizer


def save_tiny_model(directory: str | os.PathLike[str], arch: str = "qwen2", seed: int = 0) -> Path:
    """Build the tiny model and save it as a Hugging Face folder (loadable by :func:`load_model`)."""
    model, tokenizer = build_tiny_model(arch=arch, seed=seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
