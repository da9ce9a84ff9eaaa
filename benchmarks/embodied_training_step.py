"""How long does one embodied GRPO training step take here? The smoke step measured, the full-size one estimated.

1. **Smoke step, measured**: ``wmrl train embodied --smoke`` (tiny random MiniVLA + LoRA, tiny random
   Robometer, LIBERO-Long task 0 in the real simulator, one 64 px camera, one group of 2 rollouts of
   12 policy steps) run for ``--smoke-steps`` steps; each step's wall time and its phases (rollout,
   scoring, update, checkpoint) from ``metrics.jsonl``. Step 0 also builds the simulator.
2. **Full-size parts, measured on this machine**:
   - the simulator with the training camera (one ``agentview`` camera at 256 px, soft reset):
     seconds per policy step and per reset (10 settle steps);
   - a random MiniVLA-1B (DINOv2 ViT-L + SigLIP So400m + Qwen2.5-0.5B, fp32, LoRA r16 on the LLM):
     one sampled ``act`` (T = 1), and per sample the teacher-forced log-probabilities without gradient
     (the update's ``π_old`` and reference passes) and with forward + backward (the PPO passes), in
     microbatches of ``--microbatch``. A 48-token prompt as the real Qwen tokenizer gives (the real
     tokenizer is not available offline; the cost depends on the length, not on the ids).
3. **Full-size step, estimated** from those per-unit times for the default recipe: 10 groups × G = 8
   rollouts = 80 episodes of 520 policy steps (an upper bound: successful episodes stop early),
   12 sampled timesteps per episode (960 samples), 2 PPO epochs, KL to the reference (one more
   no-gradient pass), Robometer-4B on every episode at ``--robometer-episode-s`` seconds (default: the
   FLOP-based estimate of the "Embodied models" section of docs/benchmarks/embodied.md, 32 s on this CPU).
   Rollout time = policy + simulator in series (on two cores the two cannot overlap much).

Usage:
    python benchmarks/embodied_training_step.py [--smoke-steps 4] [--full-reps 2] [--microbatch 2]
        [--skip-full] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def smoke_steps(n_steps: int) -> dict:
    from wmrl.core.runlog import read_metrics
    from wmrl.embodied.training import load_train_config
    from wmrl.embodied.training.trainer import train

    config = load_train_config("smoke", [f"steps={n_steps}", f"checkpoint.every={n_steps}"])
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train(config, Path(tmp) / "run", progress=False)
        total = time.perf_counter() - t0
        rows = read_metrics(Path(tmp) / "run")
    keys = ("step_s", "rollout_s", "scoring_s", "update_s", "checkpoint_s")
    per_step = [{k: r[f"time/{k}"] for k in keys} | {"step": r["step"]} for r in rows]
    steady = rows[1:] or rows
    policy_steps = config.group_size * config.groups_per_step * config.env.max_episode_steps
    return {
        "command": f"wmrl train embodied --smoke steps={n_steps}",
        "wall_s_total": total,
        "steps": per_step,
        "steady_mean": {k: float(np.mean([r[f"time/{k}"] for r in steady])) for k in keys},
        "policy_steps_per_training_step": policy_steps,
        "rollout_s_per_policy_step": float(np.mean([r["time/rollout_s"] for r in steady])) / policy_steps,
        "policy_act_s_per_policy_step": float(np.mean([r["rollout/policy_s"] for r in steady]))
        / policy_steps,
    }


def simulator(steps: int = 40) -> dict:
    from wmrl.embodied.env import LiberoEnv, LiberoEnvConfig

    env = LiberoEnv(
        LiberoEnvConfig(
            task_id=0, cameras=("agentview",), image_height=256, image_width=256, hard_reset=False
        )
    )
    env.reset(seed=0, options={"init_state": 0})
    t0 = time.perf_counter()
    for state in (1, 2, 3):
        env.reset(seed=state, options={"init_state": state})
    reset_s = (time.perf_counter() - t0) / 3
    rng = np.random.default_rng(0)
    for _ in range(5):
        env.step(rng.uniform(-1, 1, 7))
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(rng.uniform(-1, 1, 7))
    step_s = (time.perf_counter() - t0) / steps
    env.close()
    return {"camera": "agentview", "image_size": 256, "reset_s": reset_s, "step_s": step_s}


def full_minivla(reps: int, microbatch: int) -> dict:
    from wmrl.embodied.policy.minivla import MINIVLA_1B, MiniVLA
    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy, MiniVLAPolicyConfig
    from wmrl.embodied.policy.tiny import tiny_dataset_statistics
    from wmrl.embodied.policy.tokenizer import byte_level_tokenizer

    t0 = time.perf_counter()
    model = MiniVLA(MINIVLA_1B)
    policy = MiniVLAPolicy(
        model, byte_level_tokenizer(), tiny_dataset_statistics(), MiniVLAPolicyConfig(temperature=1.0)
    )
    policy.apply_lora(r=16, alpha=32)
    build_s = time.perf_counter() - t0
    instruction = "put both the alphabet soup and the tomato sauce in the basket"
    # the real Qwen2.5 prompt for a LIBERO-Long instruction is about 48 tokens
    policy._prompt_cache[instruction] = np.random.default_rng(1).integers(0, 150000, 48).tolist()
    rng = np.random.default_rng(0)
    obs = {"agentview_image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)}

    def timed(fn) -> list[float]:
        fn()  # warm-up
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return out

    tokens = np.stack([policy.act(obs, instruction).token_ids for _ in range(microbatch)])
    observations, instructions = [obs] * microbatch, [instruction] * microbatch
    act = timed(lambda: policy.act(obs, instruction))

    def frozen() -> None:
        with torch.no_grad():
            policy.action_log_probs(observations, instructions, tokens)

    def grad() -> None:
        policy.train()
        policy.action_log_probs(observations, instructions, tokens).sum().backward()
        policy.eval()

    no_grad = timed(frozen)
    with_grad = timed(grad)
    return {
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "trainable_lora_parameters": int(sum(p.numel() for p in policy.trainable_parameters())),
        "build_s": build_s,
        "act_s": float(np.median(act)),
        "logp_no_grad_s_per_sample": float(np.median(no_grad)) / microbatch,
        "logp_fwd_bwd_s_per_sample": float(np.median(with_grad)) / microbatch,
        "microbatch": microbatch,
        "reps": reps,
    }


def estimate(sim: dict, vla: dict, robometer_episode_s: float) -> dict:
    groups, g, steps, timesteps, epochs = 10, 8, 520, 12, 2
    episodes = groups * g
    samples = episodes * timesteps
    rollout_policy = episodes * steps * vla["act_s"]
    rollout_sim = episodes * (sim["reset_s"] + steps * sim["step_s"])
    scoring = episodes * robometer_episode_s
    update = samples * (2 * vla["logp_no_grad_s_per_sample"] + epochs * vla["logp_fwd_bwd_s_per_sample"])
    total = rollout_policy + rollout_sim + scoring + update
    return {
        "recipe": {
            "groups_per_step": groups,
            "group_size": g,
            "episodes": episodes,
            "max_episode_steps": steps,
            "timesteps_per_episode": timesteps,
            "samples": samples,
            "ppo_epochs": epochs,
            "kl_to_reference": True,
            "robometer_episode_s": robometer_episode_s,
        },
        "rollout_policy_s": rollout_policy,
        "rollout_simulator_s": rollout_sim,
        "scoring_s": scoring,
        "update_s": update,
        "total_s": total,
        "total_h": total / 3600,
        "shares": {
            "rollout_policy": rollout_policy / total,
            "rollout_simulator": rollout_sim / total,
            "scoring": scoring / total,
            "update": update / total,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke-steps", type=int, default=4)
    parser.add_argument("--full-reps", type=int, default=2)
    parser.add_argument("--microbatch", type=int, default=2)
    parser.add_argument("--robometer-episode-s", type=float, default=32.0)
    parser.add_argument("--skip-full", action="store_true", help="only the smoke step")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "osmesa")
    os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")

    result: dict = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "load_average_start": os.getloadavg(),
        }
    }
    result["smoke"] = smoke_steps(args.smoke_steps)
    print(json.dumps(result["smoke"]["steady_mean"]), file=sys.stderr)
    if not args.skip_full:
        torch.set_num_threads(os.cpu_count() or 1)
        result["simulator"] = simulator()
        print(json.dumps(result["simulator"]), file=sys.stderr)
        result["minivla_1b"] = full_minivla(args.full_reps, args.microbatch)
        print(json.dumps(result["minivla_1b"]), file=sys.stderr)
        result["full_step_estimate"] = estimate(
            result["simulator"], result["minivla_1b"], args.robometer_episode_s
        )
    result["machine"]["load_average_end"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
