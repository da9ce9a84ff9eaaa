"""One rank of ``test_training_ranks.py``'s failure tests (launched by ``torchrun``): rank
``FAILING_RANK``'s anchor source raises on its first execution; every rank records how its training
ended in ``OUT/rank<r>.json``.

Usage: ``torchrun --nproc_per_node 2 grpo_rank_failure_worker.py OUT LAG FAILING_RANK [TURNS]``
(``LAG`` = ``max_anchor_lag``: 0 raises in the synchronous scoring, 1 in the worker thread of the
asynchronous anchors; ``FAILING_RANK`` -1: no rank fails; ``TURNS`` 2: K-turn episodes, where the
execution raises inside the rollout, between two turns' generation).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_training_trainer import grpo_args, make_trainer, real_formula, wm_formula
from vllm_grpo_worker import FeedbackSource, TextEpisode

FAILING_RANK = int(sys.argv[3]) if len(sys.argv) > 3 else 1
TURNS = int(sys.argv[4]) if len(sys.argv) > 4 else 1


class FailingAnchor(FeedbackSource):
    """The closed-form real score, except that rank ``FAILING_RANK``'s first execution raises."""

    def score(self, items):
        if items and int(os.environ["RANK"]) == FAILING_RANK:
            raise OSError("sandbox daemon went away (injected)")
        return super().score(items)


def main(out: Path, lag: int) -> None:
    from wmrl.core.late import AsynchronyConfig

    rank = int(os.environ["RANK"])
    args = grpo_args(out / "train", steps=3, save_strategy="steps", save_steps=3, prompts_per_step=2, group=2)
    changes = {"asynchrony": AsynchronyConfig(max_anchor_lag=lag)} if lag else None
    turns = {}
    if TURNS > 1:
        turns = {
            "world_model": FeedbackSource(wm_formula, "world_model", "wm"),
            "episodes": TextEpisode,
            "turns": TURNS,
        }
    trainer, _, _ = make_trainer(
        out, "wmrl", preset=None, preset_changes=changes, args=args,
        anchor=FailingAnchor(real_formula, "anchor", "real"), **turns,
    )  # fmt: skip
    try:
        trainer.train()
        record = {"ended": "finished"}
    except Exception as exc:
        record = {"ended": type(exc).__name__, "message": str(exc), "step": trainer.state.global_step}
    record["late_rows"] = sum(h.get("async/late_rollouts", 0.0) for h in trainer.state.log_history)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    # leave at once: a failed run leaves the process group mid-step, and its teardown must not hang the test
    os._exit(1 if record["ended"] != "finished" else 0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
