"""How fast do the embodied models run on this machine? Policy step and world-model scoring times.

Measures, on CPU in float32 (bf16 matmuls are very slow on CPUs without AMX):

1. the tiny MiniVLA policy: seconds per ``act`` (one 224 px image, greedy; and sampled at T = 1);
2. the tiny Robometer: seconds to score one LIBERO-Long-sized episode through ``RobometerSource``
   (520 frames of 128 px -> 8 subsampled frames -> one forward pass -> potential score), alone and
   per episode in a batch of 8;
3. MiniVLA-1B: a *random* full-size network (DINOv2 ViT-L/14 + SigLIP SO400M/14 + Qwen2.5-0.5B,
   fp32, about 5 GB) instantiated once; seconds per policy step (both ViTs, projector, LLM prefill of
   the 256 patch tokens + a 48-token prompt, 7 action tokens decoded with a KV cache). A random
   network costs exactly what the trained one does; no weights are needed.
4. Robometer-4B on CPU is *estimated*, not run (fp32 weights are 18 GB): forward FLOPs of the
   backbone for 8 frames of 256 px (8 x 256 vision patches, 8 x 64 + 110 LLM tokens) divided by
   the fp32 matmul throughput measured here.

Usage:
    python benchmarks/embodied_models_speed.py [--steps 20] [--full-steps 2] [--skip-full] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

TASK = "put both the alphabet soup and the tomato sauce in the basket"


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "n": len(times)}


def tiny_policy(steps: int) -> dict:
    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy

    policy = MiniVLAPolicy.tiny(seed=0)
    sampler = policy.with_config(temperature=1.0)
    obs = {"agentview_image": np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)}
    policy.act(obs, TASK)  # warm-up
    params = sum(p.numel() for p in policy.model.parameters())
    return {
        "params": params,
        "greedy": _summary(_timed(lambda: policy.act(obs, TASK), steps)),
        "sampled": _summary(_timed(lambda: sampler.act(obs, TASK), steps)),
    }


def tiny_robometer(steps: int) -> dict:
    from wmrl.embodied.sources import RobometerSourceConfig, make_robometer_source

    source = make_robometer_source(RobometerSourceConfig(backend="tiny", batch_size=8))
    rng = np.random.default_rng(1)

    def episode() -> SimpleNamespace:
        frames = rng.integers(0, 256, (521, 128, 128, 3), dtype=np.uint8)
        return SimpleNamespace(instruction=TASK, success=False, frames={"agentview": frames})

    one = [episode()]
    eight = [episode() for _ in range(8)]
    assert source.score(one)[0] is not None
    batch = _timed(lambda: source.score(eight), max(1, steps // 2))
    return {
        "params": sum(p.numel() for p in source.backend.model.parameters()),
        "episode": _summary(_timed(lambda: source.score(one), steps)),
        "per_episode_in_batch_of_8": _summary([t / 8 for t in batch]),
    }


def full_minivla(steps: int) -> dict:
    from wmrl.embodied.policy.minivla import MINIVLA_1B, MiniVLA
    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy
    from wmrl.embodied.policy.tokenizer import byte_level_tokenizer

    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = MiniVLA(MINIVLA_1B)
    build_s = time.perf_counter() - t0
    # The real Qwen2.5 tokenizer is not available offline; the policy only needs one with the 256
    # extra tokens. Prompt ids are random of the real prompt's length, so the cost is the real one.
    policy = MiniVLAPolicy(model, byte_level_tokenizer(), {"libero_10": _stats()})
    obs = {"agentview_image": np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)}
    prompt = np.random.default_rng(1).integers(0, 150000, 48).tolist()

    def step() -> None:
        tokens, _ = policy.generate(policy.pixel_values([obs]), [prompt])
        policy.tokens_to_action(tokens[0].numpy())

    step()  # warm-up
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "build_s": build_s,
        "step": _summary(_timed(step, steps)),
    }


def _stats() -> dict:
    q = [1.0] * 6 + [1.0]
    return {"action": {"q01": [-v for v in q[:6]] + [0.0], "q99": q, "mask": [True] * 6 + [False]}}


def matmul_gflops() -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = _timed(lambda: a @ b, 5)
    return 2 * 2048**3 / min(times) / 1e9


def robometer_4b_estimate(gflops: float) -> dict:
    """Forward FLOPs of Robometer-4B on 8 frames of 256 px (2 x params x tokens, plus attention)."""
    from wmrl.embodied.worldmodel.robometer_config import QWEN3_VL_4B_ROBOMETER as C

    text, vision = C["text_config"], C["vision_config"]
    d, layers, inter = text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"]
    q_dim, kv_dim = (
        text["num_attention_heads"] * text["head_dim"],
        text["num_key_value_heads"] * text["head_dim"],
    )
    llm_layer = 2 * d * q_dim + 2 * d * kv_dim + 3 * d * inter  # q,o + k,v + gate,up,down
    vd, vdepth, vinter = vision["hidden_size"], vision["depth"], vision["intermediate_size"]
    vit_layer = 4 * vd * vd + 2 * vd * vinter
    frames, patches = 8, (256 // 16) ** 2
    tokens = frames * patches // 4 + 110
    vit = 2 * frames * patches * vit_layer * vdepth + 2 * 2 * frames * patches**2 * vd * vdepth
    llm = 2 * tokens * llm_layer * layers + 2 * 2 * tokens**2 * q_dim * layers
    flops = vit + llm
    return {"llm_tokens": tokens, "tflop": flops / 1e12, "estimated_cpu_s": flops / (gflops * 1e9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed repeats for the tiny models")
    parser.add_argument("--full-steps", type=int, default=2, help="timed steps of MiniVLA-1B")
    parser.add_argument("--skip-full", action="store_true", help="do not build MiniVLA-1B")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            # The machine is shared: the load average says how contended the timings were.
            "loadavg_1_5_15": os.getloadavg(),
        },
        "fp32_matmul_gflops": matmul_gflops(),
        "tiny_minivla": tiny_policy(args.steps),
        "tiny_robometer": tiny_robometer(args.steps),
    }
    results["robometer_4b_cpu_estimate"] = robometer_4b_estimate(results["fp32_matmul_gflops"])
    if not args.skip_full:
        results["minivla_1b"] = full_minivla(args.full_steps)
    print(json.dumps(results, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
