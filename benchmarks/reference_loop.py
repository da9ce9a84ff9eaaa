"""The whole WMRL loop on a toy policy, in one file. Read this first.

A policy picks one of ``N_SOLUTIONS`` "programs" per task. Running a program for real (the
expensive *anchor*) returns its true reward; a cheap *world model* guesses the reward with a
distorted, noisy, sometimes badly wrong estimate, and sometimes cannot answer at all (``None``).
WMRL trains with GRPO where the world model grades what is not known and real execution the
programs that matter, and corrects the world model online:

    1. an execution memory grades every program that was executed before (no source is asked);
    2. the world model grades the rest; in each group the best-ranked programs nobody executed
       yet are executed for real (up to half the group), outcome-blind and deterministic;
    3. the isotonic debiaser maps world-model scores to expected real scores, fitted on the
       executed rollouts (which carry both);
    4. group advantages over real and calibrated rewards (the world model's measured gain is
       reported: ``wm_gain``);
    5. advantages x log-probabilities = the policy-gradient loss.

Run: ``python benchmarks/reference_loop.py [--steps 200] [--mode wmrl|real|world_model]``.
It prints the true reward the policy reaches and what grading cost, like CleanRL scripts print
their returns. Nothing here is special-cased for the toy: the same ``RewardPipeline`` drives the
TRL and loop trainers.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from wmrl.core import Group, RewardPipeline, as_source
from wmrl.core.corrector import CorrectorConfig

# ----------------------------------------------------------------------------------------------
# The toy problem. TRY NOT TO MODIFY: this stands in for "an LLM writes code, a sandbox runs it".
# ----------------------------------------------------------------------------------------------
N_TASKS, N_SOLUTIONS = 16, 32
GROUPS_PER_STEP, GROUP_SIZE = 8, 8
EXEC_SECONDS, WM_SECONDS = 0.002, 0.0002  # pretend costs: real execution is 10x a prediction


def make_problem(seed: int):
    rng = np.random.default_rng(seed)
    # True rewards on the grading ladder: most programs crash (0.1), some run without a
    # submission (0.2), about a third are valid with a quality-dependent score.
    outcome = rng.choice([0.1, 0.2, -1.0], size=(N_TASKS, N_SOLUTIONS), p=[0.5, 0.2, 0.3])
    quality = rng.beta(2, 5, size=(N_TASKS, N_SOLUTIONS))
    true_reward = np.where(outcome < 0, 0.5 + 0.5 * quality, outcome)
    # The world model's persistent misjudgement of each program: usually small, but 15% of the
    # crashing programs look valid to it (the failure the paper reports most often).
    bias = rng.normal(0, 0.08, true_reward.shape)
    fooled = (rng.random(true_reward.shape) < 0.15) & (outcome > 0)
    bias[fooled] += 0.7 - true_reward[fooled]
    return true_reward, bias


def program(rollout: Rollout) -> str:
    """What makes two rollouts the same solution (the execution memory's key): the task and program."""
    return f"{rollout.task}:{rollout.solution}"


class Rollout:
    """One sampled program for one task (what the sources grade)."""

    def __init__(self, task: int, solution: int) -> None:
        self.task, self.solution = task, solution


def make_sources(true_reward: np.ndarray, bias: np.ndarray, seed: int):
    rng = np.random.default_rng(seed + 1)

    def run_for_real(rollouts):  # the anchor: exact, expensive, occasionally a harness failure
        time.sleep(EXEC_SECONDS * len(rollouts))
        return [None if rng.random() < 0.01 else float(true_reward[r.task, r.solution]) for r in rollouts]

    def world_model(rollouts):  # cheap: monotone non-affine distortion + bias + noise, some unknown
        time.sleep(WM_SECONDS * len(rollouts))
        scores = []
        for r in rollouts:
            if rng.random() < 0.03:
                scores.append(None)  # a parse failure is unknown, never 0
                continue
            guess = true_reward[r.task, r.solution] + bias[r.task, r.solution] + rng.normal(0, 0.1)
            scores.append(float(np.clip(0.2 + 0.7 * np.clip(guess, 0, 1) ** 2, 0, 1)))
        return scores

    return as_source(world_model, "world_model", "toy_wm"), as_source(run_for_real, "anchor", "toy_sandbox")


# ----------------------------------------------------------------------------------------------
# ALGO LOGIC: GRPO with the WMRL corrector.
# ----------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=["wmrl", "real", "world_model", "uncorrected_mix"], default="wmrl")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    true_reward, bias = make_problem(args.seed)
    world_model, anchor = make_sources(true_reward, bias, args.seed)

    # The policy: one softmax over programs per task.
    logits = torch.zeros(N_TASKS, N_SOLUTIONS, requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=args.lr)
    # The reward side of every step: plans anchors, calls both sources, books costs, corrects.
    if args.mode in ("wmrl", "real", "world_model"):
        pipeline = RewardPipeline(
            world_model,
            anchor,
            mode=args.mode,
            corrector=CorrectorConfig(seed=args.seed),
            solution_key=program,
        )
    else:  # an ablation preset of the corrector, run as the method
        pipeline = RewardPipeline(
            world_model,
            anchor,
            corrector=CorrectorConfig.preset(args.mode, seed=args.seed),
            solution_key=program,
        )
    ledger = pipeline.ledger

    def true_value() -> float:
        probs = torch.softmax(logits.detach(), dim=1).numpy()
        return float((probs * true_reward).sum(axis=1).mean())

    print(
        f"mode={args.mode}  initial true reward {true_value():.3f}  (best possible {true_reward.max(axis=1).mean():.3f})"
    )
    for step in range(args.steps):
        # 1. Generate: GROUP_SIZE programs for each of GROUPS_PER_STEP tasks.
        with ledger.measure("generation", items=GROUPS_PER_STEP * GROUP_SIZE):
            tasks = rng.choice(N_TASKS, GROUPS_PER_STEP, replace=False)
            probs = torch.softmax(logits.detach()[tasks], dim=1)
            picks = torch.multinomial(probs, GROUP_SIZE, replacement=True).numpy()
        groups = [
            Group(key=f"{step}:{g}", items=[Rollout(t, s) for s in picks[g]], task=f"task{t}")
            for g, t in enumerate(tasks)
        ]
        # 2-4. Grade (both sources, concurrently; real execution only on anchor groups), calibrate,
        #      fuse, and form weighted group advantages.
        out = pipeline.step(groups)

        # 5. Policy gradient: advantages (NaN = unknown, masked out) times log-probabilities.
        with ledger.measure("update"):
            adv = torch.as_tensor(np.nan_to_num(out.advantages, nan=0.0), dtype=torch.float32)
            mask = torch.as_tensor(~np.isnan(out.advantages), dtype=torch.float32)
            logp = torch.log_softmax(logits[tasks], dim=1).gather(1, torch.as_tensor(picks))
            loss = -(adv * logp * mask).sum() / mask.sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        if step % 20 == 0 or step == args.steps - 1:
            m = out.metrics
            gain = m.get("wmrl/wm_gain")
            print(
                f"step {step:4d}  true reward {true_value():.3f}  executed {m['wmrl/execution_share_realised']:.2f}  "
                f"from memory {m.get('memory/known_share') or 0.0:.2f}  calibrated {int(m['wmrl/calibrated'])}  "
                f"wm_gain {'-' if gain is None else f'{gain:.2f}'}"
            )

    print(f"final true reward {true_value():.3f}")
    print(ledger.format())


if __name__ == "__main__":
    main()
