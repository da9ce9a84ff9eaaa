"""One process of the loop trainer's data-parallel test (``test_loop_ranks.py``), or the whole run alone.

``python loop_rank_worker.py OUT SCHEDULER [resume]`` on one process, or the same under ``torchrun
--nproc_per_node=2``: a bandit of 4 tasks, 4 groups per step, trained by :class:`LoopTrainer` with
closed-form sources. Rollouts are seeded by (step, task) alone, so a rank rolls out exactly what a
single process rolls out for the same group. Each process writes ``OUT/rank<r>.json``: the items its
world model and its anchor graded, the final parameters, the corrector state and every step's
correction. With ``resume`` the run stops after step 2 and new trainers continue it from the
checkpoint to step 3.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wmrl.core import Group, RewardPipeline, as_source
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.distributed import Processes, leave_launched_process
from wmrl.core.loop import LoopTrainer
from wmrl.core.rundir import RunDirectory
from wmrl.core.scheduler import SchedulerConfig
from wmrl.core.train_config import LoggingConfig, TrainConfigBase

TASKS = 4
ARMS = 6
TRUE = np.linspace(0.0, 1.0, ARMS)


@dataclass(frozen=True)
class BanditConfig(TrainConfigBase):
    """The bandit (see the module docstring)."""

    steps: int = 3
    group_size: int = 4
    learning_rate: float = 0.3
    logging: LoggingConfig = field(
        default_factory=lambda: LoggingConfig(report_to=(), completions=True, completions_to_print=0)
    )
    corrector: CorrectorConfig = field(
        default_factory=lambda: CorrectorConfig(debias=DebiasConfig(min_pairs=4))
    )


class Bandit:
    data_parallel = True

    def __init__(self, config: BanditConfig, processes: Processes) -> None:
        self.config = config
        self.processes = processes
        self.logits = torch.zeros(TASKS, ARMS, dtype=torch.float64, requires_grad=True)
        self.opt = torch.optim.Adam([self.logits], lr=config.learning_rate)
        self.updates = 0

    def groups(self, step):
        return list(range(TASKS))

    def rollout(self, groups, step):
        out = []
        for task in groups:
            gen = torch.Generator().manual_seed(1000 * step + task)
            probs = torch.softmax(self.logits[task].detach(), 0)
            picks = torch.multinomial(probs, self.config.group_size, True, generator=gen)
            out.append(
                Group(key=f"{step}:{task}", items=[(task, int(a)) for a in picks], task=f"t{task % 2}")
            )
        return out

    def update(self, batch, result, step):
        adv = torch.as_tensor(np.nan_to_num(result.local_advantages), dtype=torch.float64)
        self.opt.zero_grad()
        if batch:
            logp = torch.stack(
                [torch.stack([torch.log_softmax(self.logits[t], 0)[a] for t, a in g.items]) for g in batch]
            )
            # the mean over the whole step's rollouts: every rank divides by the step's count
            loss = -(adv * logp).sum() / (result.advantages.size)
            loss.backward()
        if self.logits.grad is None:
            self.logits.grad = torch.zeros_like(self.logits)
        self.processes.all_reduce_sum([self.logits.grad])
        self.opt.step()
        self.updates += 1
        return {}

    def metrics(self, batch, result):
        return {"bandit/rollouts": float(sum(len(g.items) for g in batch))}

    def completion_columns(self, batch):
        return {"arm": [a for g in batch for _, a in g.items]}

    def save(self, folder: Path):
        torch.save({"logits": self.logits.detach(), "opt": self.opt.state_dict()}, folder / "bandit.pt")

    def load(self, folder: Path):
        state = torch.load(folder / "bandit.pt", weights_only=True)
        with torch.no_grad():
            self.logits.copy_(state["logits"])
        self.opt.load_state_dict(state["opt"])


def _trainer(config: BanditConfig, processes: Processes, run: Path, resume: bool = False):
    graded = {"wm": [], "anchor": []}

    def wm(items):
        graded["wm"].extend(items)
        return [float(TRUE[a] ** 2) for _, a in items]

    def real(items):
        graded["anchor"].extend(items)
        return [float(TRUE[a]) for _, a in items]

    pipeline = RewardPipeline(
        as_source(wm, "world_model", "wm"),
        as_source(real, "anchor", "real"),
        mode=config.mode,
        corrector=config.corrector,
    )
    domain = Bandit(config, processes)
    trainer = LoopTrainer(
        domain, pipeline, config, RunDirectory(run, resume=resume), progress=False, processes=processes
    )
    return trainer, domain, graded


def main(out: Path, scheduler: str, resume: bool) -> None:
    processes = Processes.from_env()
    sched = (
        SchedulerConfig(fraction=0.5, floor=1, active_share=1.0)
        if scheduler == "active"
        else SchedulerConfig(fraction=0.5, floor=1)
    )
    config = BanditConfig(corrector=CorrectorConfig(debias=DebiasConfig(min_pairs=4), scheduler=sched))
    if resume:  # stop after step 2 (its checkpoint), then continue in new trainers to step 3
        first, _, _ = _trainer(dataclasses.replace(config, steps=2), processes, out / "run")
        first.run()
        first.close()
    trainer, domain, graded = _trainer(config, processes, out / "run", resume=resume)
    steps = []
    while trainer.step < config.steps:
        done = trainer.train_step()
        steps.append(
            {
                "keys": [g.key for g in done.batch],
                "anchor": done.result.anchor.tolist(),
                "advantages": np.nan_to_num(done.result.advantages, nan=-99.0).tolist(),
                "rows": list(done.result.rows.indices(len(done.result.anchor))),
                "metrics": {
                    k: v for k, v in done.metrics.items() if k.startswith(("wmrl/", "reward/", "bandit/"))
                },
            }
        )
    report = trainer.finish()
    trainer.close()
    (out / f"rank{processes.rank}.json").write_text(
        json.dumps(
            {
                "world": processes.world,
                "wm_items": graded["wm"],
                "anchor_items": graded["anchor"],
                "logits": domain.logits.detach().tolist(),
                "corrector_state": json.loads(
                    json.dumps(trainer.pipeline.corrector.state_dict(), default=str)
                ),
                "steps": steps,
                "report": report,
            }
        )
    )
    processes.close()
    leave_launched_process(0)  # as the CLI does: a gloo teardown abort must not fail a finished run


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], resume=sys.argv[3:] == ["resume"])
