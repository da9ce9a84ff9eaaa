"""A loop-trainer run with asynchronous anchors, as its own process (``tests/core/test_late.py``).

    python late_worker.py OUT [--resume] [--kill-at STEP]

A bandit over 6 arms per task; real execution sleeps a little per batch so that executions are in
flight while the next steps train. ``--kill-at S``: the process kills itself with SIGKILL inside step
``S``'s update (executions in flight, no chance to checkpoint).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from test_loop import TRUE, ToyConfig, ToyDomain  # the same directory: the loop trainer's toy bandit

from wmrl.core import RewardPipeline, as_source
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.late import AsynchronyConfig
from wmrl.core.loop import LoopTrainer
from wmrl.core.rundir import RunDirectory
from wmrl.core.scheduler import SchedulerConfig
from wmrl.core.train_config import CheckpointConfig, LoggingConfig


@dataclass(frozen=True)
class LateToyConfig(ToyConfig):
    """The loop trainer's toy bandit (``test_loop.py``) with anchors two steps late."""

    steps: int = 6
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(every=2))
    logging: LoggingConfig = field(default_factory=lambda: LoggingConfig(report_to=(), completions=False))
    corrector: CorrectorConfig = field(
        default_factory=lambda: CorrectorConfig(
            debias=DebiasConfig(min_pairs=4),
            scheduler=SchedulerConfig(fraction=0.5, floor=0, rollout_share=1.0),
            asynchrony=AsynchronyConfig(max_anchor_lag=2),
        )
    )


class LateToyDomain(ToyDomain):
    """The toy bandit that also trains on the late groups (``result.late``)."""

    late_anchors = True

    def __init__(self, config: LateToyConfig, kill_at: int | None = None) -> None:
        super().__init__(config)
        self.kill_at = kill_at

    def update(self, batch, result, step):
        groups = list(batch) + [g for late in result.late for g in late.groups]
        adv = np.concatenate([result.advantages, *[late.advantages for late in result.late]], axis=0)
        a = torch.as_tensor(np.nan_to_num(adv), dtype=torch.float32)
        logp = torch.stack(
            [torch.stack([torch.log_softmax(self.logits[t], 0)[k] for t, k in g.items]) for g in groups]
        )
        loss = -(a * logp).sum() / a[: len(batch)].numel()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if self.kill_at is not None and step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"toy/loss": float(loss.detach()), "toy/late_groups": float(len(groups) - len(batch))}


def slow_real(items):
    time.sleep(0.3)  # executions outlast a step: they are in flight while the next ones train
    return [float(TRUE[a]) for _, a in items]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at", type=int, default=None)
    args = parser.parse_args()
    config = LateToyConfig()
    wm = as_source(lambda items: [float(TRUE[a] ** 2) for _, a in items], "world_model", "wm")
    real = as_source(slow_real, "anchor", "real")
    pipeline = RewardPipeline(wm, real, mode=config.mode, corrector=config.corrector)
    trainer = LoopTrainer(
        LateToyDomain(config, args.kill_at),
        pipeline,
        config,
        RunDirectory(Path(args.out), resume=args.resume),
        progress=False,
    )
    trainer.run()
    trainer.close()


if __name__ == "__main__":
    main()
