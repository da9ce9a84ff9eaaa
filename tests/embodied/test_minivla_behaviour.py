"""MiniVLA policy behaviour: it reads its inputs, it can be taught an action, it samples what it reports.

These are the properties RL relies on, checked on the real tiny model: the action distribution
depends on the image and the instruction; gradient ascent on the log-likelihood of a target action
(behaviour cloning) makes greedy decoding produce it; sampled tokens occur as often as
the probabilities the policy reports; a policy-gradient step moves log-probabilities in the
direction of the advantage's sign.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy

pytestmark = pytest.mark.transformers

INSTRUCTION = "put the black bowl in the bottom drawer of the cabinet and close it"
OTHER = "turn on the stove and put the moka pot on it"
TARGET_BINS = np.array([10, 200, 128, 50, 90, 30, 255])


def _obs(seed: int) -> dict[str, np.ndarray]:
    return {"agentview_image": np.random.default_rng(seed).integers(0, 256, (224, 224, 3), dtype=np.uint8)}


@pytest.fixture(scope="module")
def cloned() -> tuple[MiniVLAPolicy, np.ndarray, int]:
    """A tiny policy taught one action for one (image, instruction) by behaviour cloning.

    Full fine-tuning of projector and LLM (the default trainable set), not LoRA: the tiny model's
    tied embeddings are random rows of norm ~0.16, so with them frozen its action logits span only
    about ±1.3 and no adapter can make one token dominate 256 (LoRA's learning signal is covered by
    ``test_lora_trains_only_adapters_and_round_trips``). Stops once every target token has
    probability > 1/2, which makes it the greedy choice.
    """
    policy = MiniVLAPolicy.tiny(seed=0)
    target = policy.action_tokenizer.first_token + TARGET_BINS
    obs = _obs(0)
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=5e-3)
    for step in range(60):
        opt.zero_grad()
        logp = policy.action_log_probs([obs], [INSTRUCTION], target[None])
        if logp.min().item() > np.log(0.5):
            return policy, target, step
        (-logp.sum()).backward()
        opt.step()
    return policy, target, 60


def test_the_action_distribution_depends_on_image_and_instruction():
    policy = MiniVLAPolicy.tiny(seed=3)
    tokens = np.tile(policy.action_tokenizer.first_token + TARGET_BINS, (3, 1))
    with torch.no_grad():
        logp = policy.action_log_probs([_obs(1), _obs(2), _obs(1)], [INSTRUCTION, INSTRUCTION, OTHER], tokens)
    assert (logp[0] - logp[1]).abs().max() > 1e-4  # another image
    assert (logp[0] - logp[2]).abs().max() > 1e-4  # another instruction


def test_behaviour_cloning_makes_greedy_decoding_produce_the_target(cloned):
    policy, target, steps = cloned
    assert steps < 60, "60 Adam steps did not teach the tiny model one action"
    step = policy.act(_obs(0), INSTRUCTION)
    np.testing.assert_array_equal(step.token_ids, target)
    expected, _ = policy.tokens_to_action(target)
    np.testing.assert_array_equal(step.action, expected)
    assert step.log_prob > 7 * np.log(0.5)


def test_sampled_tokens_occur_as_often_as_their_reported_probability(cloned):
    policy, target, _ = cloned
    sampler = policy.with_config(temperature=1.0, seed=11)
    obs = _obs(0)
    with torch.no_grad():
        p_first = float(sampler.action_log_probs([obs], [INSTRUCTION], target[None])[0, 0].exp())
    n = 48
    steps = sampler.act_batch([obs] * n, [INSTRUCTION] * n)
    hits = sum(int(s.token_ids[0] == target[0]) for s in steps)
    sigma = np.sqrt(n * p_first * (1 - p_first))
    assert abs(hits - n * p_first) <= 4 * sigma + 1, (hits, n * p_first)
    # each sample's reported first-token probability is the model's probability of that token
    first = [s for s in steps if s.token_ids[0] == target[0]]
    assert first and all(abs(np.exp(s.info["token_log_probs"][0]) - p_first) < 1e-3 for s in first)


def test_a_policy_gradient_step_follows_the_advantage_sign():
    policy = MiniVLAPolicy.tiny(seed=4).with_config(temperature=1.0, seed=2)
    obs, instr = [_obs(5), _obs(6)], [INSTRUCTION, OTHER]
    tokens = np.stack([s.token_ids for s in policy.act_batch(obs, instr)])
    advantages = torch.tensor([1.0, -1.0])
    before = policy.action_log_probs(obs, instr, tokens).sum(1).detach()
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=1e-3)
    opt.zero_grad()
    (-(advantages * policy.action_log_probs(obs, instr, tokens).sum(1)).mean()).backward()
    opt.step()
    after = policy.action_log_probs(obs, instr, tokens).sum(1).detach()
    assert after[0] > before[0]  # positive advantage: the taken action becomes more likely
    assert after[1] < before[1]  # negative advantage: less likely
