"""One rank of ``test_embodied_ranks.py``: the embodied smoke training under ``torchrun`` (gloo).

``python -m torch.distributed.run --nproc_per_node=2 embodied_rank_worker.py OUT key=value...``:
every rank builds :class:`EmbodiedTrainer` on the real LIBERO simulator (the smoke preset plus the
overrides), trains, and writes its trainable parameters (``OUT/rank<r>.pt``) and what it saw
(``OUT/rank<r>.json``); rank 0 writes the run directory ``OUT/run``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from wmrl.core.distributed import Processes, leave_launched_process
from wmrl.embodied.training import load_train_config
from wmrl.embodied.training.trainer import EmbodiedTrainer


def main(out: Path, overrides: list[str]) -> None:
    processes = Processes.from_env()
    config = load_train_config("smoke", overrides)
    seen = []
    with EmbodiedTrainer(config, out / "run", progress=False, processes=processes) as trainer:
        while trainer.step < config.steps:
            step = trainer.train_step()
            seen.append(
                {
                    "keys": [g.key for g in step.batch],
                    "rows": list(step.result.rows.indices(len(step.result.anchor))),
                    "anchor": step.result.anchor.tolist(),
                    "ppo_samples": step.metrics["ppo/samples"],
                    "episodes": step.metrics["rollout/episodes"],
                }
            )
        report = trainer.loop.finish()
        params = [p.detach().clone() for p in trainer.domain.updater.params]
        corrector = json.loads(json.dumps(trainer.corrector.state_dict(), default=str))
    torch.save(params, out / f"rank{processes.rank}.pt")
    (out / f"rank{processes.rank}.json").write_text(
        json.dumps({"world": processes.world, "steps": seen, "report": report, "corrector": corrector})
    )
    processes.close()
    leave_launched_process(0)  # as the CLI does: a gloo teardown abort must not fail a finished run


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
