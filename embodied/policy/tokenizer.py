"""Text tokenizers for the VLA and the world model: loading, Prismatic's extra tokens, and tiny offline ones.

Prismatic's ``qwen25-0_5b-extra`` backbone takes the Qwen2.5 tokenizer and appends 256 plain (non-special)
tokens ``<|extra_0|>`` ... ``<|extra_255|>`` with ``add_tokens``; the action tokenizer maps the 256 bins
onto them. A real run loads the Qwen2.5-0.5B tokenizer from a local directory (it is not part of a
Prismatic checkpoint); tests and CPU runs use :func:`byte_level_tokenizer`, a real byte-level BPE with
no merges (256 byte tokens) plus the chat special tokens, built offline with the ``tokenizers`` library.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "EXTRA_TOKEN",
    "QWEN_CHAT_SPECIALS",
    "add_extra_tokens",
    "byte_level_tokenizer",
    "load_tokenizer",
]

EXTRA_TOKEN = "<|extra_{}|>"
# The first three special tokens of the Qwen2.5 vocabulary, in id order (151643, 151644, 151645).
QWEN_CHAT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_level_tokenizer(special_tokens: Sequence[str] = QWEN_CHAT_SPECIALS) -> Any:
    """A ``PreTrainedTokenizerFast``: byte-level BPE without merges (ids 0-255) + ``special_tokens`` (256, 257, ...).

    Every string tokenizes to one token per UTF-8 byte, special tokens to one id each; decoding
    round-trips. ``<|endoftext|>`` (when present) is the eos and pad token, as in Qwen2.5.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    tok.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    if "<|endoftext|>" in special_tokens:
        tok.eos_token = "<|endoftext|>"
        tok.pad_token = "<|endoftext|>"
    return tok


def add_extra_tokens(tokenizer: Any, count: int = 256) -> Any:
    """Append ``<|extra_0|>`` ... ``<|extra_{count-1}|>`` as Prismatic does, unless already present.

    Raises:
        ValueError: the tokenizer holds only some of them, or they are not the last ``count`` contiguous ids.
    """
    names = [EXTRA_TOKEN.format(i) for i in range(count)]
    vocab = tokenizer.get_vocab()
    present = [n in vocab for n in names]
    if not any(present):
        added = tokenizer.add_tokens(names)
        if added != count:
            raise ValueError(f"added {added} of {count} extra tokens to the tokenizer")
    elif not all(present):
        raise ValueError(
            f"the tokenizer has {sum(present)} of the {count} <|extra_i|> tokens; expected none or all"
        )
    ids = tokenizer.convert_tokens_to_ids(names)
    first = len(tokenizer) - count
    if ids != list(range(first, first + count)):
        raise ValueError(
            "the <|extra_i|> tokens must be the last ids of the vocabulary in order "
            f"({first}..{first + count - 1}); got {ids[0]}..{ids[-1]}"
        )
    return tokenizer


def load_tokenizer(path: str | Path) -> Any:
    """``AutoTokenizer.from_pretrained`` on a local directory (never the hub)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"tokenizer directory {path} does not exist; MiniVLA needs a local copy of the "
            "Qwen/Qwen2.5-0.5B tokenizer (tokenizer.json, tokenizer_config.json)"
        )
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
