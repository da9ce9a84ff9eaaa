"""The scale-out keys of ``wmrl train autoresearch``: TRL's vLLM, gradient checkpointing (refused or
honoured, never dropped), and the GRPOConfig they become."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.trl]


def _config(**grpo):
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import from_dict

    return from_dict(TrainConfig, {"grpo": grpo})


def test_vllm_and_gradient_checkpointing_reach_trls_config_on_a_gpu(tmp_path):
    from wmrl.autoresearch.training.builders import grpo_args

    args = grpo_args(
        _config(
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url="http://gpu1:8000",
            gradient_checkpointing=True,
        ),
        tmp_path,
        "cuda",
    )
    assert args.use_vllm and args.vllm_mode == "server" and args.vllm_server_base_url == "http://gpu1:8000"
    assert args.gradient_checkpointing
    colocated = grpo_args(_config(use_vllm=True, vllm_gpu_memory_utilization=0.5), tmp_path, "cuda")
    assert colocated.vllm_mode == "colocate" and colocated.vllm_gpu_memory_utilization == 0.5
    plain = grpo_args(_config(), tmp_path, "cpu")
    assert not plain.use_vllm and not plain.gradient_checkpointing and plain.use_cpu


def test_what_a_cpu_cannot_do_is_refused_not_dropped(tmp_path):
    from wmrl.autoresearch.training.builders import grpo_args
    from wmrl.core.config import ConfigError

    with pytest.raises(ConfigError, match="needs a GPU"):
        grpo_args(_config(use_vllm=True), tmp_path, "cpu")
    with pytest.raises(ConfigError, match="several times slower"):
        grpo_args(_config(gradient_checkpointing=True), tmp_path, "cpu")
    with pytest.raises(ConfigError, match="vllm_mode=server or http"):
        _config(use_vllm=True, vllm_server_base_url="http://x:1")


def test_vllm_http_mode_is_wmrls_client_not_trls(tmp_path):
    from wmrl.autoresearch.training.builders import grpo_args, vllm_http
    from wmrl.core.config import ConfigError

    config = _config(use_vllm=True, vllm_mode="http", vllm_server_base_url="http://127.0.0.1:8000")
    args = grpo_args(config, tmp_path, "cpu")  # runs on a CPU: TRL's vLLM stays off, WMRL's client generates
    assert not args.use_vllm
    client = vllm_http(config, tmp_path)
    assert client.root == "http://127.0.0.1:8000" and client.weights_dir == str(tmp_path / "vllm-weights")
    assert vllm_http(_config(), tmp_path) is None
    with pytest.raises(ConfigError, match="needs grpo\\.vllm_server_base_url"):
        _config(use_vllm=True, vllm_mode="http")
    with pytest.raises(ConfigError, match="vllm_mode: must be one of"):
        _config(use_vllm=True, vllm_mode="nccl")
