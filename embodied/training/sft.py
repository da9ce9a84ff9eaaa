"""``wmrl train embodied-sft``: behaviour cloning of a VLA on LIBERO demonstrations (the stage RL starts from).

One optimiser step: ``grad_accumulation`` microbatches of ``microbatch_size`` (frame, action) samples,
the loss the mean over the 7 action tokens of the cross-entropy of the demonstrated token under
teacher forcing (over the full vocabulary, as Prismatic trains; the policy is saved with that same
support for greedy evaluation), gradient clipping, AdamW. Samples are shuffled per epoch by a
generator seeded with ``(seed, epoch)``, so the order needs no saved state and a resumed run sees the
same batches.

The run directory is every trainer's (:mod:`wmrl.core.rundir`): ``config.json``, ``metrics.jsonl``,
``RUN/checkpoints/checkpoint-N/`` (N = optimiser steps) with ``policy/`` (a ``MiniVLAPolicy.save``
folder: ``wmrl train embodied policy.source=RUN/checkpoints/checkpoint-N/policy`` and ``wmrl eval
embodied --policy ...`` take it directly), ``optimizer.pt``, ``rng.pt`` and ``wmrl_stage.json``
(the core stage marker, written last: the checkpoint's completion marker), plus ``RUN/demos/`` (the demonstrations as
trained on, after replay, and the replay report) and ``RUN/eval/`` (the evaluation hook's reports).
Ctrl-C finishes the optimiser step, checkpoints and exits 130 (:class:`~wmrl.core.interrupt.GracefulStop`).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.core.errors import Interrupted
from wmrl.core.interrupt import GracefulStop
from wmrl.core.rundir import (
    CHECKPOINTS,
    STAGE_FILE,
    RunDirectory,
    list_checkpoints,
    read_stage_marker,
    write_stage_marker,
)
from wmrl.core.runlog import RunWriter, write_json_atomic
from wmrl.embodied.training.sft_config import EmbodiedSFTConfig
from wmrl.embodied.training.sft_data import SFTSamples, action_statistics, load_demos, make_samples

__all__ = ["SFT_MARKER", "SFTTrainer", "run_sft_from_cli", "train_sft"]

#: The SFT trainer's file in each checkpoint, written last: a folder without it is incomplete.
SFT_MARKER = STAGE_FILE  # the core marker of a stage without a corrector
CHECKPOINT_FORMAT = "wmrl-sft-checkpoint/1"
_ORDER_STREAM = 0x73_66_74  # the sample-order random stream


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The sample order of ``epoch``: a permutation of ``range(n)`` that is a pure function of (seed, epoch)."""
    return np.random.default_rng([int(seed), int(epoch), _ORDER_STREAM]).permutation(n)


class SFTTrainer:
    """Behaviour cloning of a MiniVLA policy (see the module docstring).

    Args:
        config: the validated SFT config.
        run_dir: the run directory (fresh, resumed or restarted), with ``marker=SFT_MARKER``.
        progress: a progress bar over optimiser steps.
    """

    def __init__(self, config: EmbodiedSFTConfig, run_dir: RunDirectory, *, progress: bool = True) -> None:
        from wmrl.embodied.training.policy_setup import build_policy

        self.config = config
        self.run_dir = run_dir
        self.progress = progress
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        run_dir.open()
        data = config.data
        torch.manual_seed(config.seed)
        self.policy = build_policy(
            config.policy.as_policy_spec(), config.lora, image_key=f"{data.camera}_image", suite=data.suite
        )
        # the policy's cameras in its order: data.camera, then its wrist camera if it reads one
        self.cameras = self.policy.config.cameras
        self.demos, self.demo_report = load_demos(
            data, run_dir.path / "demos", progress=progress, cameras=self.cameras
        )
        self.image_size = int(self.demos[0].frames[data.camera].shape[1])
        # Behaviour cloning is scored over the full vocabulary (Prismatic's loss), and the policy is
        # saved greedy with the frames it was trained on: what RL and evaluation read back.
        self.policy.config = replace(
            self.policy.config,
            temperature=0.0,
            constrain_to_actions=False,
            orientation=data.orientation,
            render_size=self.image_size,
        )
        if config.train_vision:
            self.policy.model.vision.requires_grad_(True)
        self.stats_key = data.stats_key or data.suite
        self.policy.set_dataset_statistics({self.stats_key: self._action_statistics(data)}, self.stats_key)
        self.samples: SFTSamples = make_samples(self.policy, self.demos, self.cameras)
        self.params = self.policy.trainable_parameters()
        if not self.params:
            raise ValueError("the policy has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.steps_per_epoch = math.ceil(len(self.samples) / config.samples_per_step)
        self.total_steps = self.steps_per_epoch * config.epochs
        self.step = 0
        if run_dir.checkpoint is not None:
            self._restore(run_dir.checkpoint)
        self.writer = RunWriter(run_dir.path, config, report_to=config.logging.report_to)
        write_json_atomic(run_dir.path / "resolved.json", self.resolved())
        self._last_saved = self.step if run_dir.checkpoint is not None else None

    def _action_statistics(self, data: Any) -> dict[str, Any]:
        """The statistics actions are tokenised with: the demonstrations' or the source policy's own."""
        if data.statistics == "demos":
            return action_statistics(self.demos)
        # the statistics the source policy un-normalises with (its one entry, or its unnorm key's)
        statistics = self.policy.dataset_statistics
        key = self.policy.config.unnorm_key
        if key not in statistics and len(statistics) == 1:
            (key,) = statistics
        if key not in statistics:
            raise ValueError(
                f"data.statistics=source: the source policy has statistics {sorted(statistics)} and no "
                "unnorm key naming one of them"
            )
        return dict(statistics[key])

    # -- what the run is -------------------------------------------------------------------------
    def resolved(self) -> dict[str, Any]:
        return {
            "demonstrations": len(self.demos),
            "samples": len(self.samples),
            "tasks": sorted({d.task_id for d in self.demos if d.task_id is not None}),
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "image_size": self.image_size,
            "orientation": self.config.data.orientation,
            "unnorm_key": self.stats_key,
            "trainable_parameters": int(sum(p.numel() for p in self.params)),
            "demo_report": self.demo_report,
        }

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        root = self.run_dir.path / CHECKPOINTS
        root.mkdir(parents=True, exist_ok=True)
        final, tmp = root / f"checkpoint-{self.step}", root / f".checkpoint-{self.step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self.policy.save(tmp / "policy")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        write_stage_marker(
            tmp,
            stage="embodied-sft",
            format=CHECKPOINT_FORMAT,
            step=self.step,
            epoch=self.step / self.steps_per_epoch,
            config=self.config.to_dict(),
        )
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        keep = self.config.checkpoint.keep
        if keep is not None:
            for old in list_checkpoints(self.run_dir.path, SFT_MARKER)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        self._last_saved = self.step
        return final

    def _restore(self, folder: Path) -> None:
        state = read_stage_marker(folder)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"{folder} has checkpoint format {state.get('format')!r}, not {CHECKPOINT_FORMAT!r}"
            )
        self.config.check_resume(state["config"])
        self.policy.load(folder / "policy")
        self.optimizer.load_state_dict(
            torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True)
        )
        torch.set_rng_state(torch.load(folder / "rng.pt", map_location="cpu", weights_only=True)["torch"])
        self.step = int(state["step"])
        metrics = self.run_dir.path / "metrics.jsonl"
        if metrics.exists():
            kept = [
                x for x in metrics.read_text().splitlines() if x.strip() and json.loads(x)["step"] < self.step
            ]
            metrics.write_text("".join(line + "\n" for line in kept))

    # -- one optimiser step --------------------------------------------------------------------------
    def _batch(self, step: int) -> np.ndarray:
        epoch, within = divmod(step, self.steps_per_epoch)
        order = epoch_order(len(self.samples), self.config.seed, epoch)
        k = self.config.samples_per_step
        return order[within * k : (within + 1) * k]

    def loss_and_accuracy(self, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean token cross-entropy (nats) and greedy token accuracy of the samples ``index``."""
        s = self.samples
        observations = [{f"{c}_image": s.frames[c][i] for c in self.cameras} for i in index]
        logits, targets = self.policy.action_logits(
            observations, [s.instructions[i] for i in index], s.tokens[index]
        )
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        accuracy = (logits.argmax(-1) == targets).float().mean()
        return loss, accuracy

    def train_step(self) -> dict[str, Any]:
        cfg = self.config
        t0 = time.perf_counter()
        self.policy.train()
        index = self._batch(self.step)
        chunks = [index[i : i + cfg.microbatch_size] for i in range(0, len(index), cfg.microbatch_size)]
        self.optimizer.zero_grad(set_to_none=True)
        losses, accuracies = [], []
        for chunk in chunks:
            loss, accuracy = self.loss_and_accuracy(chunk)
            # weight by the chunk's share of the step's samples (the last chunk of an epoch may be short)
            (loss * (len(chunk) / len(index))).backward()
            losses.append(float(loss.detach()) * len(chunk))
            accuracies.append(float(accuracy) * len(chunk))
        norm = torch.nn.utils.clip_grad_norm_(
            self.params, cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy.eval()
        self.step += 1
        metrics = {
            "sft/loss": sum(losses) / len(index),
            "sft/token_accuracy": sum(accuracies) / len(index),
            "sft/grad_norm": float(norm),
            "sft/samples": len(index),
            "sft/epoch": self.step / self.steps_per_epoch,
            "time/step_s": time.perf_counter() - t0,
        }
        every = cfg.checkpoint.every
        if (every is not None and self.step % every == 0) or self.step == self.total_steps:
            self.save_checkpoint()
        if self.step % self.steps_per_epoch == 0:
            metrics.update(self._evaluate_if_due(self.step // self.steps_per_epoch))
        self.writer.log(self.step - 1, metrics)
        return metrics

    def _evaluate_if_due(self, epoch: int) -> dict[str, Any]:
        hook = self.config.evaluation
        if hook.every_epochs is None or (epoch % hook.every_epochs and epoch != self.config.epochs):
            return {}
        from wmrl.embodied.eval.libero_eval import LiberoEvalConfig, run_libero_eval

        tasks = hook.tasks or tuple(sorted({d.task_id for d in self.demos if d.task_id is not None}))
        eval_cfg = LiberoEvalConfig(
            suite=self.config.data.suite,
            tasks=tasks,
            states=hook.states,
            split="in_domain" if hook.states is None else "all",
            rollouts_per_state=hook.rollouts_per_state,
            max_steps=hook.max_steps,
            workers=hook.workers,
            cameras=self.cameras,
            seed=self.config.seed,
            out_dir=str(self.run_dir.path / "eval" / f"epoch-{epoch}"),
        )
        report = run_libero_eval(eval_cfg, self.policy, progress=False)
        m = report["metrics"]
        return {"eval/success": m["all"]["avg"], "eval/best_at_k": m["all"]["best_at_k"], "eval/epoch": epoch}

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to ``epochs``; returns a summary. Raises :class:`Interrupted` on Ctrl-C (after a checkpoint)."""
        from tqdm import tqdm

        started = self.step
        bar = tqdm(
            total=self.total_steps, initial=self.step, desc="sft", unit="step", file=sys.stderr,
            disable=not (self.progress and self.config.logging.progress), dynamic_ncols=True,
        )  # fmt: skip
        last: dict[str, Any] = {}
        try:
            with GracefulStop() as stop:
                try:
                    while self.step < self.total_steps:
                        last = self.train_step()
                        bar.set_postfix(
                            loss=f"{last['sft/loss']:.3f}", acc=f"{last['sft/token_accuracy']:.2f}"
                        )
                        bar.update(1)
                        if stop.requested:
                            break
                except KeyboardInterrupt:
                    if self.step == started and self.run_dir.abandon():
                        raise Interrupted(
                            "interrupted before the first step completed; nothing was kept"
                        ) from None
                    raise Interrupted(
                        f"interrupted in step {self.step + 1}; the last checkpoint is kept; continue with: "
                        f"{self.run_dir.resume_hint}"
                    ) from None
                if self._last_saved != self.step:
                    self.save_checkpoint()
                if stop.requested and self.step < self.total_steps:
                    raise Interrupted(
                        f"stopped after step {self.step}; checkpoint saved; continue with: {self.run_dir.resume_hint}"
                    )
        finally:
            bar.close()
        return {
            "steps": self.step,
            "last": last,
            "checkpoint": str(self.run_dir.path / CHECKPOINTS / f"checkpoint-{self.step}"),
        }

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> SFTTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def train_sft(config: EmbodiedSFTConfig, out_dir: str | Path | RunDirectory, *, resume: bool = False,
              progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """Run (or resume) a whole SFT; returns the summary."""
    run_dir = out_dir if isinstance(out_dir, RunDirectory) else RunDirectory(
        Path(out_dir), resume=resume, command="wmrl train embodied-sft", marker=SFT_MARKER
    )  # fmt: skip
    with SFTTrainer(config, run_dir, progress=progress) as trainer:
        return trainer.run()


def run_sft_from_cli(config: EmbodiedSFTConfig, run_dir: RunDirectory, *, progress: bool) -> list[str]:
    """``wmrl train embodied-sft``: train, then the lines to print."""
    summary = train_sft(config, run_dir, progress=progress)
    last = summary["last"]
    lines = [f"SFT: {summary['steps']} optimiser step(s)"]
    if last:
        lines[0] += f", last loss {last['sft/loss']:.4f}, token accuracy {last['sft/token_accuracy']:.3f}"
    policy = Path(summary["checkpoint"]) / "policy"
    lines += [
        f"run directory: {run_dir.path}",
        f"policy: {policy}  (wmrl train embodied policy.source={policy}; wmrl eval embodied --policy {policy})",
    ]
    return lines
