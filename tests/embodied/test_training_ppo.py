"""The PPO-clip token loss and the per-episode sample table, against hand-computed values (no simulator)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from wmrl.embodied.rollout.records import EpisodeRecord, EpisodeSpec
from wmrl.embodied.training.batch import build_samples, choose_timesteps, prune_observations
from wmrl.embodied.training.ppo import kl_k3, ppo_token_loss

LOGP = [[math.log(0.5), math.log(0.2)], [math.log(0.3), math.log(0.6)]]
OLD = [[math.log(0.4), math.log(0.4)], [math.log(0.3), math.log(0.3)]]
REF = [[math.log(0.5)] * 2, [math.log(0.5)] * 2]
# ratios: [[1.25, 0.5], [1.0, 2.0]]


def _t(values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def test_loss_ratio_and_clip_match_hand_computation():
    logp = _t(LOGP, grad=True)
    terms = ppo_token_loss(logp, _t(OLD), _t([1.0, -2.0]), clip_low=0.2, clip_high=0.2)
    # sample 0 (A = +1): token 0 r = 1.25 -> clipped to 1.2, loss -1.2; token 1 r = 0.5 -> loss -0.5
    # sample 1 (A = -2): token 0 r = 1 -> loss 2; token 1 r = 2 -> min(-4, -2.4) = -4, loss 4
    expected = ((-1.2 - 0.5) / 2 + (2.0 + 4.0) / 2) / 2
    assert terms.loss.item() == pytest.approx(expected, abs=1e-12)
    assert terms.tokens == 4
    assert terms.clipped == 1  # only (0, 0): A > 0 and r > 1 + eps; (1, 1) has the unclipped term active
    assert terms.ratio_min == pytest.approx(0.5) and terms.ratio_max == pytest.approx(2.0)
    assert terms.policy_loss_sum == pytest.approx(-1.2 - 0.5 + 2.0 + 4.0)
    approx = sum((r - 1) - math.log(r) for r in (1.25, 0.5, 1.0, 2.0))
    assert terms.approx_kl_sum == pytest.approx(approx)

    terms.loss.backward()
    grad = logp.grad.numpy()
    assert grad[0, 0] == 0.0  # clipped: the surrogate is flat in the ratio
    # d(-r A)/d logp = -r A, averaged over 2 tokens and 2 samples
    assert grad[0, 1] == pytest.approx(-0.5 * 1.0 / 4)
    assert grad[1, 1] == pytest.approx(-2.0 * -2.0 / 4)


def test_clip_higher_uses_separate_bounds():
    logp = _t([[math.log(1.3)], [math.log(0.7)]])
    old = _t([[0.0], [0.0]])
    # r = 1.3 with A > 0: clipped at 1 + 0.28 = 1.28 with clip_high 0.28, not clipped with 0.4
    narrow = ppo_token_loss(logp, old, _t([1.0, -1.0]), clip_low=0.2, clip_high=0.28)
    assert narrow.clipped == 1 + 1  # r = 0.7 with A < 0 is below 1 - 0.2 as well
    assert narrow.loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    wide = ppo_token_loss(logp, old, _t([1.0, -1.0]), clip_low=0.4, clip_high=0.4)
    assert wide.clipped == 0
    assert wide.loss.item() == pytest.approx((-1.3 + 0.7) / 2)


def test_kl_penalty_is_k3_to_the_reference():
    logp = _t(LOGP, grad=True)
    beta = 0.1
    terms = ppo_token_loss(logp, _t(OLD), _t([1.0, -2.0]), ref_logp=_t(REF), kl_beta=beta)
    k3 = [
        [(p_ref / p) - math.log(p_ref / p) - 1 for p, p_ref in zip(row, (0.5, 0.5), strict=True)]
        for row in ((0.5, 0.2), (0.3, 0.6))
    ]
    assert k3[0][0] == 0.0
    surrogate = ((-1.2 - 0.5) / 2 + (2.0 + 4.0) / 2) / 2
    penalty = beta * ((k3[0][0] + k3[0][1]) / 2 + (k3[1][0] + k3[1][1]) / 2) / 2
    assert terms.loss.item() == pytest.approx(surrogate + penalty, abs=1e-12)
    assert terms.kl_ref_sum == pytest.approx(sum(map(sum, k3)))
    # k3 is non-negative and zero only where the two policies agree
    assert torch.all(kl_k3(_t(LOGP), _t(REF)) >= 0)
    # the KL is logged without being penalised when beta is 0
    logged = ppo_token_loss(_t(LOGP), _t(OLD), _t([1.0, -2.0]), ref_logp=_t(REF), kl_beta=0.0)
    assert logged.loss.item() == pytest.approx(surrogate) and logged.kl_ref_sum == pytest.approx(
        terms.kl_ref_sum
    )
    with pytest.raises(ValueError, match="ref_logp"):
        ppo_token_loss(_t(LOGP), _t(OLD), _t([1.0, -2.0]), kl_beta=0.1)


def test_nan_advantage_masks_its_sample():
    logp = _t(LOGP, grad=True)
    terms = ppo_token_loss(logp, _t(OLD), _t([1.0, float("nan")]))
    assert terms.loss.item() == pytest.approx((-1.2 - 0.5) / 2)  # normalised by the one valid sample
    assert terms.tokens == 2
    terms.loss.backward()
    assert torch.all(torch.isfinite(logp.grad))
    assert torch.all(logp.grad[1] == 0)
    # with an explicit normalizer (the minibatch size) the masked sample still counts in the denominator
    fixed = ppo_token_loss(_t(LOGP), _t(OLD), _t([1.0, float("nan")]), normalizer=2)
    assert fixed.loss.item() == pytest.approx((-1.2 - 0.5) / 4)
    nothing = ppo_token_loss(_t(LOGP, grad=True), _t(OLD), _t([float("nan")] * 2))
    assert nothing.loss.item() == 0.0 and nothing.tokens == 0 and math.isnan(nothing.ratio_max)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="advantages must be"):
        ppo_token_loss(_t(LOGP), _t(OLD), _t([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"\(B, A\)"):
        ppo_token_loss(_t([1.0, 2.0]), _t([1.0, 2.0]), _t([1.0, 2.0]))


# -- samples -------------------------------------------------------------------------------------------


def _record(episode: int, steps: int, success: bool = False) -> EpisodeRecord:
    rng = np.random.default_rng(episode)
    return EpisodeRecord(
        spec=EpisodeSpec(task_id=0, init_state=episode % 16, seed=episode, rollout=episode),
        instruction=f"task of episode {episode}",
        success=success,
        steps=steps,
        terminated=success,
        truncated=not success,
        actions=np.zeros((steps, 7), np.float32),
        rewards=np.zeros(steps, np.float32),
        token_ids=rng.integers(0, 256, size=(steps, 7)),
        log_probs=-rng.random(steps) * 10,
        observations=[
            {"agentview_image": np.full((4, 4, 3), 10 * episode + t, np.uint8)} for t in range(steps)
        ],
    )


def test_advantage_is_broadcast_to_every_timestep_of_its_episode():
    records = [_record(0, 5), _record(1, 3), _record(2, 4), _record(3, 6)]
    advantages = [0.7, float("nan"), -1.3, 0.0]
    timesteps = [np.arange(r.steps) for r in records]
    batch = build_samples(records, advantages, timesteps)
    # NaN = no advantage: episode 1 contributes nothing; every other timestep of every episode appears
    assert sorted(set(batch.episode.tolist())) == [0, 2, 3]
    assert len(batch) == 5 + 4 + 6
    for e, t, a, tok, lp, obs in zip(
        batch.episode,
        batch.timestep,
        batch.advantage,
        batch.token_ids,
        batch.behaviour_logp,
        batch.observations,
        strict=True,
    ):
        assert a == advantages[e]
        assert np.array_equal(tok, records[e].token_ids[t])
        assert lp == records[e].log_probs[t]
        assert obs["agentview_image"][0, 0, 0] == 10 * e + t
    assert batch.instructions[0] == "task of episode 0"
    dropped = build_samples(records, advantages, timesteps, drop_zero_advantage=True)
    assert sorted(set(dropped.episode.tolist())) == [0, 2]


def test_timestep_choice_is_a_pure_function_and_pruning_keeps_what_is_used():
    a = choose_timesteps(40, 12, seed=0, step=3, episode=5)
    assert np.array_equal(a, choose_timesteps(40, 12, seed=0, step=3, episode=5))
    assert not np.array_equal(a, choose_timesteps(40, 12, seed=0, step=3, episode=6))
    assert len(a) == 12 and len(set(a.tolist())) == 12 and np.all(np.diff(a) > 0) and a.max() < 40
    assert np.array_equal(choose_timesteps(7, 12, 0, 0, 0), np.arange(7))
    assert np.array_equal(choose_timesteps(7, None, 0, 0, 0), np.arange(7))

    record = _record(4, 10)
    keep = choose_timesteps(10, 3, 0, 0, 4)
    prune_observations(record, keep)
    assert [t for t, o in enumerate(record.observations) if o is not None] == keep.tolist()
    batch = build_samples([record], [1.0], [keep])
    assert batch.timestep.tolist() == keep.tolist()
    with pytest.raises(ValueError, match="was not kept"):
        build_samples([record], [1.0], [np.arange(10)])
    with pytest.raises(ValueError, match="one advantage"):
        build_samples([record], [1.0, 2.0], [keep])
