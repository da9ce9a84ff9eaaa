"""GRPO for VLA policies on LIBERO, corrected by WMRL: the training loop behind ``wmrl train embodied``.

One training step:

1. **groups** (:mod:`groups`): ``groups_per_step`` distinct (task, in-domain initial state) pairs;
2. **rollouts** (ledger ``generation``): G episodes per group with the current policy, sampling at
   ``policy.temperature``; every step's action tokens and behaviour log-probabilities are recorded,
   plus the observations of the timesteps the update will use and, for Robometer, the camera frames;
3. **scoring**: ``corrector.plan`` picks the anchor groups (outcome-blind); Robometer grades every
   episode (ledger ``world_model``), the simulator's success flag grades the anchor groups' episodes
   (ledger ``anchor``), ``corrector.correct`` calibrates, fuses and returns per-episode advantages
   (NaN = no advantage);
4. **update** (ledger ``update``, :mod:`update`): PPO-clip epochs on the action tokens;
5. **log** ``metrics.jsonl`` (and TensorBoard), and **checkpoint** every ``checkpoint_every`` steps.

The mode (``sparse`` / ``world_model`` / ``wmrl``) only chooses the corrector preset.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.core.config import to_dict
from wmrl.core.corrector import Correction, Corrector
from wmrl.core.ledger import CostLedger
from wmrl.core.runlog import RunWriter, plot_run
from wmrl.core.sources import collect_grades
from wmrl.embodied.env.config import LiberoEnvConfig
from wmrl.embodied.rollout.records import EpisodeRecord
from wmrl.embodied.training.batch import (
    build_samples,
    choose_timesteps,
    keep_frame_window,
    prune_observations,
)
from wmrl.embodied.training.checkpoint import latest_checkpoint, save_checkpoint
from wmrl.embodied.training.config import EmbodiedTrainConfig
from wmrl.embodied.training.groups import GroupSpec, choose_groups, episode_specs, group_records
from wmrl.embodied.training.policy_setup import build_policy, make_reference
from wmrl.embodied.training.update import PPOUpdater

__all__ = ["RESUMABLE_CHANGES", "EmbodiedTrainer", "StepResult", "train"]

RESUMABLE_CHANGES = frozenset(
    {"steps", "checkpoint_every", "keep_checkpoints", "tensorboard", "torch_threads"}
)
"""Top-level config keys a resumed run may change; anything else would make it a different run."""

ACCOUNTING_NOTE = (
    "Streams: generation = the rollouts (simulator + policy sampling) of every episode; world_model = "
    "Robometer scoring; anchor = reading LIBERO's success flag for the anchor groups' episodes; update = "
    "the PPO epochs. In this domain the expensive part of real execution, running the episode in the "
    "simulator, is paid for every rollout in every mode, because the policy gradient needs on-policy "
    "rollouts whatever grades them; it is booked to generation. The success flag then costs microseconds. "
    "real_mode_estimate (generation + update + every rollout graded at the measured anchor cost) is "
    "therefore about this run minus Robometer: a ratio below 1 says sparse-success GRPO would have been "
    "cheaper by the world model's share. WMRL buys a denser within-group signal here, not compute; a "
    "compute saving exists only where the success label itself costs (a real robot with a person or a "
    "detector judging each episode)."
)


@dataclass
class StepResult:
    """What one training step produced (for callers that drive :meth:`EmbodiedTrainer.train_step`).

    ``records`` are the step's episodes, group-major, with their frames and observations released.
    """

    groups: list[GroupSpec]
    records: list[EpisodeRecord]
    correction: Correction
    metrics: dict[str, Any]


def _nanmean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


class EmbodiedTrainer:
    """Owns the policy, the reward sources, the corrector, the optimiser, the ledger and the run directory.

    Args:
        config: the validated training config.
        out_dir: the run directory (``config.json``, ``metrics.jsonl``, ``checkpoints/``, ``plots/``, ...).
        resume: continue from the newest checkpoint in ``out_dir`` (a fresh start when there is none).
            Without it, a directory that already holds checkpoints is refused.
        progress: show a tqdm bar over training steps.

    Use :meth:`run` for the whole loop, or :meth:`train_step` step by step; :meth:`close` ends the
    simulator workers and the log.
    """

    def __init__(
        self, config: EmbodiedTrainConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True
    ) -> None:
        self.config = config
        self.run_dir = Path(out_dir)
        self.progress = progress
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is not None and not resume:
            raise FileExistsError(
                f"{self.run_dir} already holds checkpoints (newest: step {checkpoint.step}); "
                "resume it (--resume) or choose another --out"
            )
        if checkpoint is not None:
            self._check_resumable(checkpoint.trainer_state()["config"])
        metrics = self.run_dir / "metrics.jsonl"
        if checkpoint is None and metrics.exists() and metrics.stat().st_size > 0:
            if not resume:
                raise FileExistsError(
                    f"{self.run_dir} holds the metrics of a run that never wrote a checkpoint; restart it "
                    "from step 0 with --resume, or choose another --out"
                )
            metrics.write_text("")  # nothing to continue from: start the log over with the run
        if config.uses_tiny_models:
            warnings.warn(
                "training with a tiny random-initialised model (policy.source=tiny or world_model.backend=tiny): "
                "this exercises the pipeline only; it does not train a useful policy",
                stacklevel=2,
            )

        camera = config.env.camera
        self.policy = build_policy(config.policy, config.lora, image_key=f"{camera}_image")
        reference = make_reference(self.policy, config.lora) if config.ppo.kl_beta > 0 else None
        self.updater = PPOUpdater(self.policy, config.ppo, reference)
        self.world_model = None
        if config.uses_world_model:
            from wmrl.embodied.sources import make_robometer_source

            self.world_model = make_robometer_source(config.world_model)
        from wmrl.embodied.sources import SparseSuccessSource

        self.anchor = SparseSuccessSource()
        on_gpu = 1.0 if str(config.policy.device).startswith("cuda") else 0.0
        wm_gpu = (
            1.0 if self.world_model is not None and str(config.world_model.device).startswith("cuda") else 0.0
        )
        self.ledger = CostLedger(
            {"generation": on_gpu, "update": on_gpu, "world_model": wm_gpu, "anchor": 0.0}
        )
        self.corrector = Corrector(config.resolved_corrector())
        self.step = 0
        if checkpoint is not None:
            self._restore(checkpoint)
        self.writer = RunWriter(self.run_dir, config=config.to_dict(), tensorboard=config.tensorboard)
        self.writer.write_json("resolved.json", self.resolved())
        self._runner = None
        self._last_checkpoint_step = self.step if checkpoint is not None else None

    # -- set-up ------------------------------------------------------------------------------------------
    def _check_resumable(self, saved: dict[str, Any]) -> None:
        current = self.config.to_dict()
        differs = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
        blocked = [k for k in differs if k not in RESUMABLE_CHANGES]
        if blocked:
            raise ValueError(
                f"cannot resume {self.run_dir}: the config differs from the checkpoint's in {blocked} "
                f"(a resumed run may only change {sorted(RESUMABLE_CHANGES)})"
            )

    def _restore(self, checkpoint) -> None:
        self.policy.load(checkpoint.policy_dir)
        self.policy.eval()
        self.updater.load_state_dict(checkpoint.optimizer_state())
        restored = Corrector.load(checkpoint.path / "corrector.json")
        if restored.config != self.corrector.config:
            raise ValueError(
                f"{checkpoint.path}: the saved corrector was configured differently from this run"
            )
        self.corrector = restored
        self.ledger.load_state_dict(json.loads((checkpoint.path / "ledger.json").read_text()))
        rng = checkpoint.rng_state()
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.step = checkpoint.step
        # Steps logged after this checkpoint (a crash later) are redone: drop their lines.
        metrics = self.run_dir / "metrics.jsonl"
        if metrics.exists():
            kept = [
                line
                for line in metrics.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] < self.step
            ]
            metrics.write_text("".join(line + "\n" for line in kept))

    def env_config(self) -> LiberoEnvConfig:
        env = self.config.env
        return LiberoEnvConfig(
            suite=env.suite,
            task_id=env.task_ids[0],
            cameras=(env.camera,),
            image_height=env.image_size,
            image_width=env.image_size,
            max_steps=env.max_episode_steps,
            settle_steps=env.settle_steps,
            hard_reset=env.hard_reset,
        )

    def resolved(self) -> dict[str, Any]:
        """What the config resolves to (written to ``resolved.json``)."""
        return {
            "corrector_preset": self.config.corrector_preset,
            "corrector": to_dict(self.config.resolved_corrector()),
            "tasks": list(self.config.env.task_ids),
            "train_states": list(self.config.env.state_ids),
            "max_episode_steps": self.env_config().episode_max_steps,
            "policy_trainable_parameters": int(sum(p.numel() for p in self.updater.params)),
            "policy_lora": self.policy.lora,
            "world_model": None
            if self.world_model is None
            else getattr(self.world_model.backend, "name", "?"),
        }

    @property
    def runner(self):
        if self._runner is None:
            from wmrl.embodied.rollout.runner import RolloutConfig, RolloutRunner

            env = self.config.env
            self._runner = RolloutRunner(
                self.env_config(),
                RolloutConfig(
                    workers=env.workers,
                    frame_cameras=(env.camera,),
                    frame_stride=env.frame_stride,
                    keep_observations=True,
                ),
            )
        return self._runner

    # -- one step -----------------------------------------------------------------------------------------
    def collect(self, groups: list[GroupSpec]) -> list[EpisodeRecord]:
        """Roll out G episodes per group with the current policy (ledger: generation)."""
        cfg = self.config
        specs = episode_specs(
            groups, cfg.group_size, self.step, cfg.seed, record_frames=self.world_model is not None
        )
        position = {id(s): i for i, s in enumerate(specs)}

        def keep_what_is_used(record: EpisodeRecord) -> None:
            # Runs as each episode ends, so a step holds only what the update and Robometer will read:
            # the observations of the chosen timesteps, and Robometer's window of frames (the same
            # frames the source would subsample, so its scores are unchanged).
            i = position[id(record.spec)]
            keep = choose_timesteps(record.steps, cfg.ppo.timesteps_per_episode, cfg.seed, self.step, i)
            prune_observations(record, keep)
            if self.world_model is not None:
                keep_frame_window(record, cfg.env.camera, self.world_model.num_frames)

        with self.ledger.measure("generation", items=len(specs)):
            records = self.runner.run(self.policy, specs, progress=keep_what_is_used)
        return records

    def score(self, groups: list[GroupSpec], records: list[EpisodeRecord]) -> tuple[Correction, np.ndarray]:
        """Plan anchors, grade with Robometer and the success flag, correct. Returns (correction, wm scores)."""
        g_size = self.config.group_size
        members = group_records(records, groups, g_size)
        keys = [g.key for g in groups]
        tasks = [g.task_key for g in groups]
        wm = np.full((len(groups), g_size), np.nan)
        active = self.corrector.config.scheduler.active_share > 0

        def grade_world_model() -> None:
            if self.world_model is None:
                return
            with self.ledger.measure("world_model", items=len(records)):
                grades = collect_grades(self.world_model, records)
            wm[:] = np.array([np.nan if g.value is None else g.value for g in grades]).reshape(wm.shape)

        if active:  # the active scheduler reads the world model's scores to choose anchors
            grade_world_model()
            plan = self.corrector.plan(keys, tasks, wm)
        else:
            plan = self.corrector.plan(keys, tasks)
            grade_world_model()
        real = np.full_like(wm, np.nan)
        anchor_items = [r for i in plan.anchor_indices for r in members[i]]
        if anchor_items:
            with self.ledger.measure("anchor", items=len(anchor_items)):
                grades = collect_grades(self.anchor, anchor_items)
            values = [np.nan if g.value is None else g.value for g in grades]
            for j, i in enumerate(plan.anchor_indices):
                real[i] = values[j * g_size : (j + 1) * g_size]
        self.ledger.count_rollouts(len(records))
        return self.corrector.correct(plan, wm, real), wm

    def step_groups(self) -> list[GroupSpec]:
        """The groups of the current step (a pure function of the seed and the step)."""
        cfg = self.config
        return choose_groups(self.step, cfg.env.task_ids, cfg.env.state_ids, cfg.groups_per_step, cfg.seed)

    def train_step(self) -> StepResult:
        """Run one training step in the simulator; log and (when due) checkpoint it."""
        t0 = time.perf_counter()
        groups = self.step_groups()
        records = self.collect(groups)
        return self.learn(groups, records, t0)

    def learn(
        self, groups: list[GroupSpec], records: list[EpisodeRecord], t0: float | None = None
    ) -> StepResult:
        """Score, correct and update on this step's episodes (group-major), then log and checkpoint.

        ``t0`` is when the step started (its rollouts included); ``None`` = now.
        """
        cfg = self.config
        t_rollout = time.perf_counter()
        t0 = t_rollout if t0 is None else t0
        correction, wm = self.score(groups, records)
        for r in records:
            r.frames = {}  # graded: the frames are not needed any more
        t_score = time.perf_counter()
        advantages = correction.advantages.reshape(-1)
        timesteps = [
            choose_timesteps(r.steps, cfg.ppo.timesteps_per_episode, cfg.seed, self.step, i)
            for i, r in enumerate(records)
        ]
        batch = build_samples(
            records,
            advantages,
            timesteps,
            drop_zero_advantage=cfg.ppo.drop_zero_advantage and cfg.ppo.kl_beta == 0,
        )
        with self.ledger.measure("update", items=len(batch)):
            ppo = self.updater.update(batch, self.step, cfg.seed)
        t_update = time.perf_counter()
        for r in records:
            r.observations = None

        success = np.array([r.success for r in records], dtype=float)
        metrics: dict[str, Any] = dict(correction.metrics)
        metrics.update(
            {
                "rollout/episodes": float(len(records)),
                "rollout/success_rate": float(success.mean()),
                "rollout/episode_steps_mean": float(np.mean([r.steps for r in records])),
                "rollout/truncated_rate": float(np.mean([r.truncated for r in records])),
                "rollout/policy_s": float(sum(r.policy_s for r in records)),
                "reward/robometer_reward_mean": _nanmean(wm),
                "reward/corrected_reward_mean": _nanmean(correction.rewards),
                "reward/advantage_masked": float(np.isnan(advantages).mean()),
            }
        )
        metrics.update(ppo)
        metrics.update(
            {
                "time/rollout_s": t_rollout - t0,
                "time/scoring_s": t_score - t_rollout,
                "time/update_s": t_update - t_score,
            }
        )
        self.step += 1
        t_ckpt = time.perf_counter()
        if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
            self.save_checkpoint()
        metrics["time/checkpoint_s"] = time.perf_counter() - t_ckpt
        metrics["time/step_s"] = time.perf_counter() - t0
        self.writer.log(self.step - 1, metrics)
        return StepResult(groups, records, correction, metrics)

    def save_checkpoint(self):
        ckpt = save_checkpoint(
            self.run_dir,
            self.step,
            self.policy,
            self.updater.state_dict(),
            self.corrector,
            self.ledger,
            self.config.to_dict(),
            keep=self.config.keep_checkpoints,
        )
        self._last_checkpoint_step = self.step
        return ckpt

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self, on_step: Callable[[StepResult], None] | None = None) -> dict[str, Any]:
        """Train up to ``config.steps``, then write plots and ``cost_report.json``; returns the cost report."""
        from tqdm import tqdm

        cfg = self.config
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            desc=f"train embodied ({cfg.mode})",
            unit="step",
            disable=not self.progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        try:
            while self.step < cfg.steps:
                result = self.train_step()
                m = result.metrics
                bar.set_postfix(
                    success=f"{100 * m['rollout/success_rate']:.0f}%",
                    loss="-" if m["ppo/loss"] is None else f"{m['ppo/loss']:.3g}",
                    step_s=f"{m['time/step_s']:.1f}",
                )
                bar.update(1)
                if on_step is not None:
                    on_step(result)
            if self._last_checkpoint_step != self.step:
                self.save_checkpoint()
        finally:
            bar.close()
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """Write the plots and ``cost_report.json``; returns the cost report."""
        from wmrl.embodied.training.report import cost_report, plot_training

        plot_run(self.run_dir, self.corrector.debiaser)
        plot_training(self.run_dir)
        report = cost_report(self.run_dir, self.ledger, self.config)
        self.writer.write_json("cost_report.json", report)
        return report

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self.writer.close()

    def __enter__(self) -> EmbodiedTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def train(
    config: EmbodiedTrainConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Run a whole training (or resume one); returns the cost report."""
    with EmbodiedTrainer(config, out_dir, resume=resume, progress=progress) as trainer:
        return trainer.run()
