"""PPO epochs on the real tiny MiniVLA, the reference policy, and checkpoint/resume of the trainer.

The episodes here are synthetic data (random frames, random success flags) acted on by the real
tiny policy, so the tokens and behaviour log-probabilities are the policy's own; the rest is real
(tiny MiniVLA with peft LoRA, tiny Robometer, the core corrector, AdamW, the checkpoint files). The
same trainer on the real simulator is exercised by ``test_training_e2e.py`` (marked ``libero``/``slow``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wmrl.core.corrector import Corrector
from wmrl.core.rundir import checkpoint_step, list_checkpoints
from wmrl.core.train_config import LoraConfig
from wmrl.embodied.rollout.records import EpisodeRecord
from wmrl.embodied.training import PolicySpec, PPOConfig, load_train_config
from wmrl.embodied.training.batch import build_samples, keep_frame_window
from wmrl.embodied.training.groups import GroupSpec, episode_specs
from wmrl.embodied.training.policy_setup import build_policy, make_reference
from wmrl.embodied.training.trainer import EmbodiedTrainer
from wmrl.embodied.training.update import PPOUpdater

pytestmark = [pytest.mark.peft, pytest.mark.transformers]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a small shared CPU extra threads only
    oversubscribe it (several times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


INSTRUCTIONS = ("put the bowl on the plate", "open the top drawer", "turn on the stove")


def synthetic_episodes(policy, groups, group_size, step, steps=4, size=64):
    """Group-major episodes on random frames, acted on by ``policy`` (its real tokens and log-probs)."""
    records = []
    for spec in episode_specs(groups, group_size, step, seed=0, record_frames=True):
        rng = np.random.default_rng(spec.seed)
        frames = rng.integers(0, 256, size=(steps + 1, size, size, 3), dtype=np.uint8)
        observations = [{"agentview_image": frames[t]} for t in range(steps)]
        instruction = INSTRUCTIONS[spec.task_id % len(INSTRUCTIONS)]
        policy.reset(seed=spec.seed)
        acts = [policy.act(obs, instruction) for obs in observations]
        success = bool(rng.random() < 0.5)
        records.append(
            EpisodeRecord(
                spec=spec,
                instruction=instruction,
                success=success,
                steps=steps,
                terminated=success,
                truncated=not success,
                actions=np.stack([a.action for a in acts]),
                rewards=np.zeros(steps, np.float32),
                token_ids=np.stack([a.token_ids for a in acts]),
                log_probs=np.array([a.log_prob for a in acts]),
                frames={"agentview": frames},
                frame_steps=np.arange(steps + 1),
                observations=observations,
            )
        )
    return records


def _policy(lora: bool = True, r: int = 4):
    return build_policy(PolicySpec(), LoraConfig(enabled=lora, r=r, alpha=2 * r), "agentview_image")


def _batch(policy, advantages=(1.0, -1.0)):
    records = synthetic_episodes(policy, [GroupSpec(0, 0)], len(advantages), step=0)
    return build_samples(records, list(advantages), [np.arange(r.steps) for r in records])


def _frozen(updater, batch):
    return updater._frozen_log_probs(updater.policy.action_log_probs, batch)


def test_epochs_move_the_ratio_and_the_clip_binds():
    policy = _policy()
    batch = _batch(policy)  # 8 samples: 4 timesteps of an A = +1 episode, 4 of an A = -1 episode
    cfg = PPOConfig(epochs=4, minibatch_size=4, microbatch_size=4, timesteps_per_episode=None, kl_beta=0.0)
    updater = PPOUpdater(policy, cfg, learning_rate=0.05)
    old = _frozen(updater, batch)
    # the recomputed log-probs are those the policy reported while acting
    assert np.allclose(old.sum(dim=1).numpy(), batch.behaviour_logp, atol=1e-4)
    assert torch.equal(_frozen(updater, batch), old)  # before any update the ratio is exactly 1

    metrics = updater.update(batch, step=0, seed=0)
    assert metrics["ppo/updates"] == 8.0  # 4 epochs x 2 minibatches
    assert metrics["ppo/samples"] == 8.0 and metrics["ppo/episodes"] == 2.0
    assert metrics["ppo/behaviour_logp_gap"] < 1e-4
    assert metrics["ppo/clip_fraction"] > 0.0
    assert metrics["ppo/ratio_max"] > 1.2 or metrics["ppo/ratio_min"] < 0.8
    assert metrics["ppo/approx_kl"] > 0 and metrics["ppo/grad_norm"] > 0
    assert metrics["ppo/kl_ref"] is None
    new = _frozen(updater, batch)
    delta = new - old
    assert torch.exp(delta).sub(1).abs().max() > 0.2
    # the update made the positive-advantage episode's tokens likelier and the negative one's less likely
    assert delta[:4].sum() > 0 > delta[4:].sum()


def test_one_epoch_of_one_minibatch_never_clips():
    """The official trainer's setting: a single optimiser step on fresh log-probs, ratio identically 1."""
    policy = _policy()
    batch = _batch(policy)
    cfg = PPOConfig(epochs=1, minibatch_size=8, microbatch_size=8, kl_beta=0.0)
    metrics = PPOUpdater(policy, cfg, learning_rate=0.05).update(batch, step=0, seed=0)
    assert metrics["ppo/updates"] == 1.0
    assert metrics["ppo/clip_fraction"] == 0.0
    assert metrics["ppo/ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["ppo/ratio_max"] == pytest.approx(1.0, abs=1e-5)


def test_microbatches_accumulate_to_the_minibatch_gradient():
    policy_a, policy_b = _policy(), _policy()
    batch = _batch(policy_a)
    for policy, micro in ((policy_a, 3), (policy_b, 8)):
        cfg = PPOConfig(epochs=1, minibatch_size=8, microbatch_size=micro, kl_beta=0.0)
        PPOUpdater(policy, cfg, learning_rate=1e-2).update(batch, step=0, seed=0)
    for pa, pb in zip(policy_a.trainable_parameters(), policy_b.trainable_parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)


@pytest.mark.parametrize("lora", [True, False])
def test_kl_is_taken_to_the_frozen_initial_policy(lora):
    policy = _policy(lora=lora)
    batch = _batch(policy)
    reference = make_reference(policy, LoraConfig(enabled=lora))
    cfg = PPOConfig(epochs=2, minibatch_size=4, microbatch_size=4, kl_beta=0.5)
    updater = PPOUpdater(policy, cfg, reference, learning_rate=0.02)
    ref_before = updater._frozen_log_probs(reference, batch)
    assert torch.allclose(
        ref_before, _frozen(updater, batch), atol=1e-6
    )  # the reference is the initial policy
    metrics = updater.update(batch, step=0, seed=0)
    assert metrics["ppo/kl_ref"] is not None and metrics["ppo/kl_ref"] > 0
    assert torch.equal(updater._frozen_log_probs(reference, batch), ref_before)  # and it stays frozen
    assert not torch.allclose(_frozen(updater, batch), ref_before, atol=1e-4)
    with pytest.raises(ValueError, match="reference"):
        PPOUpdater(policy, cfg, None)


def test_zero_samples_is_no_update():
    policy = _policy()
    records = synthetic_episodes(policy, [GroupSpec(0, 0)], 2, step=0, steps=2)
    batch = build_samples(records, [float("nan"), float("nan")], [np.arange(2)] * 2)
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    metrics = PPOUpdater(policy, PPOConfig(kl_beta=0.0)).update(batch, step=0, seed=0)
    assert metrics["ppo/samples"] == 0.0 and metrics["ppo/updates"] == 0.0 and metrics["ppo/loss"] is None
    assert all(torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters(), strict=True))


def test_cutting_frames_to_robometers_window_keeps_its_score():
    from wmrl.embodied.sources import RobometerSourceConfig, make_robometer_source

    source = make_robometer_source(RobometerSourceConfig(backend="tiny"))
    policy = _policy()
    whole = synthetic_episodes(policy, [GroupSpec(1, 3)], 2, step=0, steps=20, size=32)
    cut = synthetic_episodes(policy, [GroupSpec(1, 3)], 2, step=0, steps=20, size=32)
    for record in cut:
        keep_frame_window(record, "agentview", source.num_frames)
        assert record.frames["agentview"].shape[0] == source.num_frames
        assert record.frame_steps.tolist() == [0, 3, 6, 9, 11, 14, 17, 20]
    full_grades, cut_grades = source.grade(whole), source.grade(cut)
    assert [g.value for g in full_grades] == [g.value for g in cut_grades]
    assert all(g.value is not None for g in cut_grades)
    assert cut_grades[0].info["frame_steps"] == full_grades[0].info["frame_steps"]


# -- checkpoint and resume -------------------------------------------------------------------------------


def _train_config(steps: int, mode: str = "wmrl"):
    return load_train_config(
        "smoke",
        [
            f"mode={mode}",
            f"steps={steps}",
            "groups_per_step=3",
            "env.tasks=[0,1,2]",
            "checkpoint.every=2",
            "checkpoint.keep=5",
            "torch_threads=1",
            *(["corrector.scheduler.fraction=0.5", "corrector.scheduler.floor=1"] if mode == "wmrl" else []),
            "ppo.timesteps_per_episode=3",
            "ppo.minibatch_size=6",
            "ppo.microbatch_size=6",
        ],
    )


def _learn(trainer, n_steps):
    for _ in range(n_steps):
        groups = trainer.step_groups()
        trainer.learn(
            groups, synthetic_episodes(trainer.policy, groups, trainer.config.group_size, trainer.step)
        )


def _params(trainer):
    return [p.detach().clone() for p in trainer.policy.trainable_parameters()]


def test_resume_continues_bit_identically(tmp_path):
    config = _train_config(steps=3)
    # uninterrupted: 3 steps, checkpoints after steps 2 and 3
    with EmbodiedTrainer(config, tmp_path / "a", progress=False) as a:
        _learn(a, 2)
        corrector_after_2 = json.dumps(a.corrector.state_dict(), default=repr)
        _learn(a, 1)
        a.corrector.save(tmp_path / "a_final.json")
        params_a = _params(a)
        items_a = {k: (v.items, v.calls) for k, v in a.ledger.streams.items()}
    assert [checkpoint_step(c) for c in list_checkpoints(tmp_path / "a")] == [2, 3]
    saved = Corrector.load(tmp_path / "a" / "checkpoints" / "checkpoint-2" / "wmrl_corrector.json")
    assert json.dumps(saved.state_dict(), default=repr) == corrector_after_2

    # interrupted after 2 steps (plus a logged step 3 that never reached a checkpoint), then resumed
    with EmbodiedTrainer(config, tmp_path / "b", progress=False) as b:
        _learn(b, 2)
    with (tmp_path / "b" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "time": 0.0, "stale": True}) + "\n")
    with pytest.raises(FileExistsError, match="resume"):
        EmbodiedTrainer(config, tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match=r"\['learning_rate'\]"):
        EmbodiedTrainer(config.replace(learning_rate=0.5), tmp_path / "b", resume=True, progress=False)
    with EmbodiedTrainer(config, tmp_path / "b", resume=True, progress=False) as b:
        assert b.step == 2
        _learn(b, 1)
        b.corrector.save(tmp_path / "b_final.json")
        params_b = _params(b)
        items_b = {k: (v.items, v.calls) for k, v in b.ledger.streams.items()}

    assert (tmp_path / "a_final.json").read_bytes() == (tmp_path / "b_final.json").read_bytes()
    assert all(torch.equal(x, y) for x, y in zip(params_a, params_b, strict=True))
    assert items_a == items_b  # the ledger was restored and continued
    rows_a = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_b] == [0, 1, 2]  # the stale line after the checkpoint was dropped
    for ra, rb in zip(rows_a, rows_b, strict=True):
        for key in ra:
            if key.startswith(("wmrl/", "ppo/", "reward/", "rollout/success")):
                assert ra[key] == rb[key], key
    assert rows_a[-1]["wmrl/calibrated"] == 1.0  # the calibration map was fitted and carried across

    # a checkpoint's policy folder is what `wmrl eval libero --policy` loads
    from wmrl.embodied.eval.policy_loader import load_policy

    loaded = load_policy(tmp_path / "a" / "checkpoints" / "checkpoint-3" / "policy")
    assert all(torch.equal(x, y) for x, y in zip(loaded.trainable_parameters(), params_a, strict=True))


def test_a_run_without_checkpoints_restarts_only_when_asked(tmp_path):
    config = _train_config(steps=1)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "time": 0.0}\n')
    with pytest.raises(FileExistsError, match="never wrote a checkpoint"):
        EmbodiedTrainer(config, tmp_path, progress=False)
    with EmbodiedTrainer(config, tmp_path, resume=True, progress=False) as trainer:
        assert trainer.step == 0
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert json.loads((tmp_path / "config.json").read_text()) == config.to_dict()


@pytest.mark.parametrize("mode", ["real", "world_model", "wmrl"])
def test_the_mode_decides_which_source_grades_the_groups(tmp_path, mode):
    config = _train_config(steps=1, mode=mode)
    with EmbodiedTrainer(config, tmp_path, progress=False) as trainer:
        groups = trainer.step_groups()
        records = synthetic_episodes(trainer.policy, groups, config.group_size, 0)
        result = trainer.learn(groups, records)
        spent = {k: v.items for k, v in trainer.ledger.streams.items()}
    success = np.array([r.success for r in records], dtype=float).reshape(len(groups), config.group_size)
    anchor = result.correction.anchor
    m = result.metrics
    if mode == "real":  # real-signal GRPO: every group graded by the success flag, Robometer not run
        assert trainer.world_model is None and anchor.all()
        assert np.array_equal(result.correction.rewards, success)
        assert spent["world_model"] == 0 and spent["anchor"] == len(records)
        assert m["reward/world_model_mean"] is None
    elif mode == "world_model":  # raw Robometer on every group, no anchors
        assert not anchor.any() and spent["anchor"] == 0 and spent["world_model"] == len(records)
        assert m["reward/world_model_mean"] == pytest.approx(m["reward/corrected_mean"])
    else:  # executed episodes (a whole anchor group, then single rollouts) graded by the flag, the rest by Robometer
        executed = result.correction.executed
        assert anchor.any() and not anchor.all() and executed[anchor].all()
        assert executed[~anchor].any() and not executed[~anchor].all()  # the default's per-rollout anchors
        assert np.array_equal(result.correction.rewards[executed], success[executed])
        assert spent["anchor"] == executed.sum() and spent["world_model"] == len(records)
    assert m["rollout/success_rate"] == pytest.approx(success.mean())
    assert m["ppo/samples"] > 0 or np.all(np.nan_to_num(result.correction.advantages) == 0)


def test_each_rank_takes_its_own_gpu_and_the_run_config_stays_as_given():
    from dataclasses import replace

    from wmrl.core.distributed import Processes
    from wmrl.embodied.training.trainer import per_rank_devices

    config = load_train_config("smoke")
    on_gpu = config.replace(
        policy=replace(config.policy, device="cuda"), world_model=replace(config.world_model, device="cuda")
    )
    second = Processes(rank=1, world=2, local_rank=1)
    mine = per_rank_devices(on_gpu, second)
    assert (mine.policy.device, mine.world_model.device) == ("cuda:1", "cuda:1")
    assert on_gpu.policy.device == "cuda"  # the run's config is not changed
    pinned = on_gpu.replace(policy=replace(on_gpu.policy, device="cuda:3"))
    assert per_rank_devices(pinned, second).policy.device == "cuda:3"  # an explicit GPU is kept
    assert per_rank_devices(on_gpu, Processes()) is on_gpu  # one process: unchanged
    on_cpu = config.replace(policy=replace(config.policy, device="cpu"))
    assert per_rank_devices(on_cpu, second) is on_cpu


def test_a_launch_of_several_processes_needs_out(monkeypatch, tmp_path, capsys):
    """Under torchrun (WORLD_SIZE > 1) the default run folder, named by the time, would differ per rank."""
    from wmrl.core.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "embodied", "--smoke", "--no-progress"]) == 2
    assert "needs --out" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
