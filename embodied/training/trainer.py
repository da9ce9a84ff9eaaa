"""GRPO for VLA policies on LIBERO, corrected by WMRL: the embodied domain on the core loop trainer.

The loop (:class:`wmrl.core.loop.LoopTrainer`) and the reward side
(:class:`wmrl.core.pipeline.RewardPipeline`) are every domain's; this module supplies what only a
VLA on a simulator knows (:class:`LiberoDomain`):

1. **groups** (:mod:`.groups`): ``groups_per_step`` distinct (task, in-domain initial state) pairs;
2. **rollouts**: G episodes per group with the current policy, sampling at ``policy.temperature``;
   every step's action tokens and behaviour log-probabilities are recorded, plus the observations of
   the timesteps the update will use and the camera frames a reward source reads
   (``RolloutNeeds.frames``: Robometer's window, cut as each episode ends);
3. the pipeline grades: the world model (Robometer by default) every episode, the anchor (the
   simulator's success flag by default) the anchor groups' episodes; both are constructor arguments;
4. **update** (:mod:`.update`): PPO-clip epochs on the action tokens;
5. checkpoints hold the policy folder, ``optimizer.pt`` and ``rng.pt`` beside the shared files.

Under ``torchrun`` (several processes, :class:`~wmrl.core.distributed.Processes`) the rollouts and
the update are data-parallel: each rank rolls out its contiguous share of the step's groups in its
own simulator workers, grades its own episodes, and trains on their samples with the gradients
summed over the ranks (:class:`~.update.PPOUpdater`); the corrector plans and corrects the whole
gathered batch on every rank; rank 0 writes the run directory. Episode seeds and the timesteps the
update uses are functions of an episode's place in the whole step, so ``N`` ranks train what one
process would on the same groups. On GPUs each rank takes GPU ``LOCAL_RANK`` (``device: auto`` or
``cuda``).

:class:`EmbodiedTrainer` puts the two together for ``wmrl train embodied`` and for scripts that
drive steps themselves (``learn`` takes episodes rolled out elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.core.distributed import Processes, leave_launched_process
from wmrl.core.late import refuse_asynchrony
from wmrl.core.ledger import CostLedger
from wmrl.core.loop import LoopStep, LoopTrainer
from wmrl.core.pipeline import RewardPipeline, StepResult
from wmrl.core.rollouts import Group, needs_of
from wmrl.core.rundir import RunDirectory
from wmrl.core.runlog import read_metrics, write_json_atomic
from wmrl.core.sources import RewardSource
from wmrl.embodied.env.config import LiberoEnvConfig
from wmrl.embodied.rollout.records import EpisodeRecord
from wmrl.embodied.training.batch import (
    build_samples,
    choose_timesteps,
    keep_frame_window,
    prune_observations,
)
from wmrl.embodied.training.config import EmbodiedTrainConfig
from wmrl.embodied.training.groups import GroupSpec, choose_groups, episode_specs, group_records
from wmrl.embodied.training.policy_setup import build_policy, make_reference, resolve_observation
from wmrl.embodied.training.update import PPOUpdater

__all__ = ["ACCOUNTING_NOTE", "EmbodiedTrainer", "LiberoDomain", "run_from_cli", "train"]

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
_TIME_KEYS = ("time/step_s", "time/rollout_s", "time/scoring_s", "time/update_s", "time/checkpoint_s")


def _nanmean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


class LiberoDomain:
    """A VLA policy on LIBERO, for :class:`~wmrl.core.loop.LoopTrainer` (see the module docstring).

    Args:
        config: the training config.
        sources: the reward sources the pipeline calls; their ``needs`` decide which frames are kept.
        processes: the ranks of a data-parallel run (default: this process alone).
    """

    #: The update trains on ``result.local_advantages`` and sums its gradients over the ranks.
    data_parallel = True

    def __init__(
        self,
        config: EmbodiedTrainConfig,
        sources: Sequence[RewardSource | None],
        processes: Processes | None = None,
    ) -> None:
        self.config = config
        self.processes = processes or Processes()
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        camera = config.env.camera
        self.policy = build_policy(
            config.policy, config.lora, image_key=f"{camera}_image", suite=config.env.suite
        )
        # Frames as the policy was trained on them (its checkpoint records it), and recorded in ours.
        env = config.env
        self.orientation, self.image_size = resolve_observation(
            self.policy.observation_contract, env.orientation, env.image_size, env.allow_observation_mismatch
        )
        self.policy.config = replace(
            self.policy.config, orientation=self.orientation, render_size=self.image_size
        )
        reference = make_reference(self.policy, config.lora) if config.ppo.kl_beta > 0 else None
        self.updater = PPOUpdater(
            self.policy, config.ppo, reference, learning_rate=config.learning_rate, processes=self.processes
        )
        # the frames the sources read: the most any of them asks for, from the rendered camera
        needs = [needs_of(s) for s in sources if s is not None]
        self.frames = max((n.frames for n in needs), default=0)
        cameras = {n.camera for n in needs if n.frames and n.camera is not None}
        if cameras - {camera}:
            raise ValueError(
                f"a reward source reads frames from {sorted(cameras)}, but env.camera is {camera!r}"
            )
        self._runner = None

    # -- the simulator ---------------------------------------------------------------------------
    @property
    def policy_cameras(self) -> tuple[str, ...]:
        """The cameras rendered: ``env.camera``, then the policy's wrist camera if it reads one."""
        return self.policy.config.cameras

    def env_config(self) -> LiberoEnvConfig:
        env = self.config.env
        return LiberoEnvConfig(
            suite=env.suite,
            task_id=env.task_ids[0],
            cameras=self.policy_cameras,
            image_height=self.image_size,
            image_width=self.image_size,
            orientation=self.orientation,
            max_steps=env.max_episode_steps,
            settle_steps=env.settle_steps,
            hard_reset=env.hard_reset,
        )

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
                    # on Ray a lost node's episodes run again elsewhere; never a failure of the policy
                    on_error="retry" if env.simulators == "ray" else "raise",
                    retries=env.ray.retries,
                    ray=env.ray if env.simulators == "ray" else None,
                ),
            )
        return self._runner

    # -- LoopDomain ------------------------------------------------------------------------------
    def groups(self, step: int) -> list[GroupSpec]:
        """The groups of ``step`` (a pure function of the seed and the step)."""
        cfg = self.config
        return choose_groups(step, cfg.env.task_ids, cfg.env.state_ids, cfg.groups_per_step, cfg.seed)

    def rollout(self, groups: Sequence[GroupSpec], step: int) -> list[Group]:
        """G episodes per group with the current policy, keeping only what the update and the sources read."""
        cfg = self.config
        specs = episode_specs(groups, cfg.group_size, step, cfg.seed, record_frames=self.frames > 0)
        first = self._first_episode(groups, step)
        position = {id(s): first + i for i, s in enumerate(specs)}

        def keep_what_is_used(record: EpisodeRecord) -> None:
            # Runs as each episode ends: the observations of the chosen timesteps, and the window of
            # frames the sources read (the frames they would subsample, so their scores are unchanged).
            i = position[id(record.spec)]
            prune_observations(
                record, choose_timesteps(record.steps, cfg.ppo.timesteps_per_episode, cfg.seed, step, i)
            )
            if self.frames:
                keep_frame_window(record, cfg.env.camera, self.frames)

        records = self.runner.run(self.policy, specs, progress=keep_what_is_used)
        return self.as_groups(groups, records)

    def _first_episode(self, groups: Sequence[GroupSpec], step: int) -> int:
        """The index, in the whole step's group-major episode list, of the first episode of ``groups``
        (a rank's contiguous share of the step; 0 for groups that are not a part of the step's)."""
        every = list(self.groups(step))
        n = len(groups)
        for k in range(len(every) - n + 1):
            if every[k : k + n] == list(groups):
                return k * self.config.group_size
        return 0

    def as_groups(self, groups: Sequence[GroupSpec], records: Sequence[EpisodeRecord]) -> list[Group]:
        """Group-major episodes as the pipeline's groups (checked to belong to their (task, state))."""
        members = group_records(records, groups, self.config.group_size)
        return [Group(key=g.key, items=m, task=g.task_key) for g, m in zip(groups, members, strict=True)]

    def update(self, batch: list[Group], result: StepResult, step: int) -> Mapping[str, float | None]:
        """PPO epochs on this step's episodes with the corrected advantages."""
        cfg = self.config
        records = [r for g in batch for r in g.items]
        for r in records:
            r.frames = {}  # graded: the frames are not needed any more
        advantages = result.local_advantages.reshape(-1)  # this process's groups
        rows = result.rows.indices(result.advantages.shape[0])
        first = rows[0] * cfg.group_size  # their first episode's index in the whole step
        timesteps = [
            choose_timesteps(r.steps, cfg.ppo.timesteps_per_episode, cfg.seed, step, first + i)
            for i, r in enumerate(records)
        ]
        samples = build_samples(
            records,
            advantages,
            timesteps,
            drop_zero_advantage=cfg.ppo.drop_zero_advantage and cfg.ppo.kl_beta == 0,
        )
        metrics = self.updater.update(samples, step, cfg.seed)
        for r in records:
            r.observations = None
        return metrics

    def metrics(self, batch: list[Group], result: StepResult) -> Mapping[str, float | None]:
        records = [r for g in batch for r in g.items]
        success = np.array([r.success for r in records], dtype=float)
        return {
            "rollout/episodes": float(len(records)),
            "rollout/success_rate": float(success.mean()),
            "rollout/episode_steps_mean": float(np.mean([r.steps for r in records])),
            "rollout/truncated_rate": float(np.mean([r.truncated for r in records])),
            "rollout/policy_s": float(sum(r.policy_s for r in records)),
        }

    def completion_columns(self, batch: list[Group]) -> Mapping[str, Sequence[Any]]:
        records = [r for g in batch for r in g.items]
        return {
            "init_state": [r.spec.init_state for r in records],
            "success": [bool(r.success) for r in records],
            "episode_steps": [int(r.steps) for r in records],
        }

    def save(self, folder: Path) -> None:
        self.policy.save(folder / "policy")
        torch.save(self.updater.state_dict(), folder / "optimizer.pt")
        rng: dict[str, Any] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, folder / "rng.pt")

    def load(self, folder: Path) -> None:
        self.policy.load(folder / "policy")
        self.policy.eval()
        self.updater.load_state_dict(
            torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True)
        )
        rng = torch.load(folder / "rng.pt", map_location="cpu", weights_only=True)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    def report(self, run_dir: Path) -> dict[str, Any]:
        """The domain's part of ``cost_report.json`` (and ``plots/training.png``)."""
        from wmrl.embodied.training.report import plot_training

        rows = read_metrics(run_dir)
        per_step = {}
        for key in _TIME_KEYS:
            values = [r[key] for r in rows if r.get(key) is not None]
            per_step[key.removeprefix("time/")] = float(np.mean(values)) if values else None
        episodes = int(sum(r.get("rollout/episodes") or 0 for r in rows))
        env_steps = float(
            sum((r.get("rollout/episodes") or 0) * (r.get("rollout/episode_steps_mean") or 0) for r in rows)
        )
        if self.config.logging.plots:
            plot_training(run_dir)
        return {
            "episodes": episodes,
            "policy_steps": round(env_steps),
            "mean_step_seconds": per_step,
            "accounting": ACCOUNTING_NOTE,
        }

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


class EmbodiedTrainer:
    """The embodied domain on the loop trainer: ``wmrl train embodied`` and step-by-step driving.

    Args:
        config: the validated training config.
        out_dir: the run directory, or a :class:`~wmrl.core.rundir.RunDirectory`.
        resume: continue from the newest checkpoint in ``out_dir`` (a run without one restarts).
        progress: a progress bar over steps.
        world_model: the world-model source (default: Robometer as ``config.world_model`` says, when the
            mode uses one).
        anchor: the real-signal source (default: the simulator's sparse success flag).
        processes: the ranks of a data-parallel run (default: those of the launcher, ``torchrun``, when
            it set ``WORLD_SIZE``; else this process alone). Every rank builds its trainer with the same
            config and ``out_dir``; rank 0 writes the run directory.

    Use :meth:`run` for the whole loop, or :meth:`train_step` / :meth:`learn` step by step;
    :meth:`close` ends the simulator workers and the log.
    """

    def __init__(
        self,
        config: EmbodiedTrainConfig,
        out_dir: str | Path | RunDirectory,
        *,
        resume: bool = False,
        progress: bool = True,
        world_model: RewardSource | None = None,
        anchor: RewardSource | None = None,
        processes: Processes | None = None,
    ) -> None:
        import warnings

        refuse_asynchrony(
            config.corrector.asynchrony,
            "the embodied trainer",
            "its anchor reads the success flag of an episode the simulator has already run, so nothing "
            "waits on real execution (the episodes themselves are the cost)",
        )
        if processes is None:
            processes = Processes.from_env(cuda=config.policy.on_cuda)
        # this rank's devices; the run's config (config.json, resume checks) stays as given
        here = per_rank_devices(config, processes)
        self.processes = processes
        self.config = config
        run_dir = (
            out_dir
            if isinstance(out_dir, RunDirectory)
            else RunDirectory(Path(out_dir), resume=resume, command="wmrl train embodied")
        )
        if world_model is None and config.uses_world_model:
            from wmrl.embodied.sources import make_robometer_source

            world_model = make_robometer_source(here.world_model)
        if anchor is None:
            from wmrl.embodied.sources import SparseSuccessSource

            anchor = SparseSuccessSource()
        if config.uses_tiny_models and processes.is_main:
            warnings.warn(
                "training with a tiny random-initialised model (policy.source=tiny or world_model.backend=tiny): "
                "this exercises the pipeline only; it does not train a useful policy",
                stacklevel=2,
            )
        self.domain = LiberoDomain(
            here, [world_model if config.uses_world_model else None, anchor], processes=processes
        )
        on_gpu = 1.0 if config.policy.on_cuda else 0.0
        wm_gpu = 1.0 if world_model is not None and str(config.world_model.device).startswith("cuda") else 0.0
        ledger = CostLedger(
            {
                "generation": on_gpu,
                "update": on_gpu,
                "world_model": wm_gpu,
                "anchor": 0.0,
                "anchor_wait": on_gpu,
            }
        )
        self.pipeline = RewardPipeline(
            world_model,
            anchor,
            mode=config.mode,
            corrector=config.corrector,
            ledger=ledger,
            world_model_in_real=config.world_model_in_real,
        )
        self.loop = LoopTrainer(
            self.domain,
            self.pipeline,
            config,
            run_dir,
            progress=progress,
            details=lambda: self.domain.report(run_dir.path),
            device="cuda" if config.policy.on_cuda else "cpu",
            processes=processes,
        )
        if processes.is_main:
            write_json_atomic(run_dir.path / "resolved.json", self.resolved())

    # -- what the run is ---------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.loop.step

    @property
    def policy(self):
        return self.domain.policy

    @property
    def corrector(self):
        return self.pipeline.corrector

    @property
    def ledger(self) -> CostLedger:
        return self.pipeline.ledger

    @property
    def world_model(self) -> RewardSource | None:
        return self.pipeline.world_model

    @property
    def run_dir(self) -> Path:
        return self.loop.run_dir.path

    def resolved(self) -> dict[str, Any]:
        """What the config resolves to beyond itself (written to ``resolved.json``)."""
        return {
            "tasks": list(self.config.env.task_ids),
            "train_states": list(self.config.env.state_ids),
            "max_episode_steps": self.domain.env_config().episode_max_steps,
            "image_size": self.domain.image_size,
            "orientation": self.domain.orientation,
            "policy_trainable_parameters": int(sum(p.numel() for p in self.domain.updater.params)),
            "policy_lora": self.policy.lora,
            "world_model": None if self.world_model is None else getattr(self.world_model, "name", "?"),
            "frames_kept_per_episode": self.domain.frames,
        }

    # -- steps ---------------------------------------------------------------------------------------
    def step_groups(self) -> list[GroupSpec]:
        """The groups of the current step."""
        return self.domain.groups(self.step)

    def train_step(self) -> LoopStep:
        """Roll out, score, correct, update one step in the simulator; log and (when due) checkpoint."""
        return self.loop.train_step()

    def learn(self, groups: Sequence[GroupSpec], records: Sequence[EpisodeRecord]) -> LoopStep:
        """Score, correct and update on episodes rolled out elsewhere (group-major), then log and checkpoint."""
        return self.loop.train_step(batch=self.domain.as_groups(groups, records))

    def run(self) -> dict[str, Any]:
        """Train up to ``config.steps``; then plots and ``cost_report.json``. Returns the cost report."""
        return self.loop.run()

    def close(self) -> None:
        self.domain.close()
        self.loop.close()

    def __enter__(self) -> EmbodiedTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def per_rank_devices(config: EmbodiedTrainConfig, processes: Processes) -> EmbodiedTrainConfig:
    """``config`` with the policy and an in-process Robometer on this rank's GPU (``cuda:LOCAL_RANK``)
    when several processes train on CUDA and the config says ``auto`` or ``cuda``; else unchanged."""
    if not processes.distributed or not config.policy.on_cuda:
        return config
    gpu = f"cuda:{processes.local_rank}"
    changes: dict[str, Any] = {}
    if config.policy.device in ("auto", "cuda"):
        changes["policy"] = replace(config.policy, device=gpu)
    if config.world_model.backend != "http" and config.world_model.device in ("auto", "cuda"):
        changes["world_model"] = replace(config.world_model, device=gpu)
    return config.replace(**changes) if changes else config


def train(
    config: EmbodiedTrainConfig,
    out_dir: str | Path | RunDirectory,
    *,
    resume: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Run a whole training (or resume one); returns the cost report."""
    with EmbodiedTrainer(config, out_dir, resume=resume, progress=progress) as trainer:
        return trainer.run()


def run_from_cli(config: EmbodiedTrainConfig, run_dir: RunDirectory, *, progress: bool) -> list[str]:
    """``wmrl train embodied``: train, then the lines to print (see :mod:`wmrl.core.cli_runs`)."""
    processes = Processes.from_env(cuda=config.policy.on_cuda)
    with EmbodiedTrainer(config, run_dir, progress=progress, processes=processes) as trainer:
        report = trainer.run()
    lines = _summary(config, run_dir, report) if processes.is_main else []  # the main process reports
    if processes.distributed:
        processes.close()
        for line in lines:
            print(line)
        leave_launched_process(0)
    return lines


def _summary(config: EmbodiedTrainConfig, run_dir: RunDirectory, report: dict) -> list[str]:
    spent = report["spent"]
    return [
        f"trained {report['steps']} step(s), {report['details']['episodes']} episodes, mode {config.mode.value}; "
        f"rollouts {spent['generation']['wall_s']:.1f} s, world model {spent['world_model']['wall_s']:.1f} s, "
        f"update {spent['update']['wall_s']:.1f} s",
        f"run directory: {run_dir.path} (config.json, metrics.jsonl, plots/, cost_report.json, checkpoints/)",
    ]
