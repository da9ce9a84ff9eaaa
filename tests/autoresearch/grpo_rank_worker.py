"""One rank of the two-process GRPO run of ``test_training_ranks.py`` (launched by ``torchrun``).

Trains ``WMRLGRPOTrainer`` with the closed-form sources of ``test_training_trainer.py`` for three
steps on two CPU processes (gloo), then writes what this rank saw to ``OUT/rank<r>.json``: the
corrector's inputs and outputs per step, the advantages it trained on, the items each source graded,
the logs and its merged ledger. The anchor source labels its executions with the rank, so the test
can tell whose executions a logged status share counts.

Usage: ``torchrun --nproc_per_node 2 grpo_rank_worker.py OUT``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch.distributed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_training_trainer import Counting, Spy, grpo_args, make_trainer, real_formula

from wmrl.core.config import to_dict
from wmrl.core.distributed import leave_launched_process
from wmrl.core.sources import Grade

RANK_STATUS = {0: "valid", 1: "runtime_error"}


class LabelledAnchor(Counting):
    """The closed-form real score, with this rank's status on every execution."""

    def grade(self, items):
        return [Grade(value, status=RANK_STATUS[int(os.environ["RANK"])]) for value in self.score(items)]


def _plain(array) -> list:
    return np.nan_to_num(np.asarray(array, dtype=float), nan=-99.0).tolist()


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    args = grpo_args(out / "train", steps=3, save_strategy="steps", save_steps=3, prompts_per_step=2, group=2)
    anchor = LabelledAnchor(real_formula, "anchor", "real")
    # group anchors (one group a step, the floor): what is checked is that every rank plans, gathers
    # and corrects the same batch, which the group plan shows from the keys alone
    trainer, wm, _ = make_trainer(
        out, "wmrl", preset="wmrl_groups", args=args, anchor=anchor, statuses=tuple(RANK_STATUS.values())
    )
    spy = Spy(trainer)
    trainer.train()
    ledger = trainer.merged_ledger()
    record = {
        "rank": trainer.accelerator.process_index,
        "processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "corrector_state": json.loads(json.dumps(trainer.corrector.state_dict(), default=str)),
        "corrector_config": to_dict(trainer.corrector.config),
        "steps": [
            {
                "keys": list(plan.group_keys),
                "tasks": list(plan.task_keys or []),
                "anchor": plan.anchor.tolist(),
                "wm": _plain(wm_m),
                "real": _plain(real_m),
                "advantages": _plain(result.advantages),
                "weights": _plain(result.weights),
            }
            for plan, wm_m, real_m, _var, result in spy.corrections
        ],
        "used_advantages": [o["advantages"].tolist() for o in spy.outputs],
        "anchor_items": anchor.items,
        "wm_items": wm.items,
        "log_history": trainer.state.log_history,
        "ledger": ledger.report(),
        "own_ledger": trainer.ledger.report(),
    }
    assert record["rank"] == rank
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    trainer.accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()
    leave_launched_process(0)  # as the CLI does: a gloo teardown abort must not fail a finished run


if __name__ == "__main__":
    main(Path(sys.argv[1]))
