"""The anchor pairs a training run collects, kept for a world model fine-tuned on them.

Every script the anchor stream executes is a (script, real outcome) pair: exactly what the world
model is asked to predict. A training run appends each one to ``RUN/anchor_pairs.jsonl``
(``anchor_pairs-rank<r>.jsonl`` per rank of a multi-process run) as a world-model corpus example
(:class:`~wmrl.autoresearch.training.corpus.CorpusExample`, role ``world_model``: the JSON answer the
world model should give for that script). ``wmrl train autoresearch-sft corpus.anchor_runs=[RUN]``
fine-tunes a world model on them (beyond the paper, which keeps its world model frozen), and
``wmrl autoresearch wm-fidelity --model`` measures it before and after.

Harness failures are not recorded: they say nothing about the script.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["PAIRS_GLOB", "AnchorPairRecorder", "read_anchor_pairs", "unique_pairs"]

#: The files of one run (one per rank).
PAIRS_GLOB = "anchor_pairs*.jsonl"


class AnchorPairRecorder:
    """``(solutions, results) -> None`` (``(task ref, code)`` pairs and their grade results): appends the
    executed pairs to ``path`` (thread-safe; one
    line per pair, flushed, so a run that dies keeps what it executed).

    Args:
        path: the JSONL file.
        step: ``() -> int``, the training step the pairs belong to (recorded as ``recipe``).
    """

    def __init__(self, path: str | os.PathLike, step=lambda: 0) -> None:
        self.path = Path(path)
        self.step = step
        self._lock = threading.Lock()

    def __call__(self, solutions: Sequence[Any], results: Sequence[Any]) -> None:
        from wmrl.autoresearch.training.corpus import CorpusExample, error_type, world_model_answer

        lines = []
        for (ref, code), result in zip(solutions, results, strict=True):
            if result.reward is None or not code:
                continue
            position = result.position if result.status == "valid" else None
            example = CorpusExample(
                role="world_model",
                task_id=result.task_id,
                task_ref=str(getattr(ref, "id", ref)),
                recipe=f"anchor@step{self.step()}",
                completion=world_model_answer(result.status, position, error_type(result.stderr_tail or "")),
                code=code,
                status=result.status,
                position=position,
                reward=result.reward,
            )
            lines.append(json.dumps(example.to_dict()) + "\n")
        if not lines:
            return
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(lines)
            fh.flush()


def read_anchor_pairs(runs: Sequence[str | os.PathLike]) -> list[Any]:
    """The recorded pairs of the run directories ``runs`` (every rank's file), as corpus examples.

    Raises:
        FileNotFoundError: a run directory has no anchor-pair file (a ``world_model`` mode run executes
            nothing; runs before this file existed have none).
    """
    from wmrl.autoresearch.training.corpus import Corpus

    examples = []
    for run in runs:
        files = sorted(Path(run).glob(PAIRS_GLOB))
        if not files:
            raise FileNotFoundError(
                f"{run} holds no {PAIRS_GLOB}: it is not a wmrl train autoresearch run that executed anchors"
            )
        for file in files:
            examples.extend(Corpus.read_examples(file))
    return examples


def unique_pairs(examples: Sequence[Any]) -> tuple[list[Any], int]:
    """``(kept, dropped)``: ``examples`` without repeats of the same (task, script, outcome), the first
    of each kept in order, and how many were dropped.

    Runs of one seed repeat their samples (a rerun, the bench's modes before they diverge, a longer
    run of the same settings); a script recorded twice would count twice in the loss. The same
    script with two different outcomes (flaky execution) is kept twice: both are what it did.
    """
    seen: set[tuple[str, str, str]] = set()
    kept = []
    for example in examples:
        key = (example.task_id, example.code, example.completion)
        if key not in seen:
            seen.add(key)
            kept.append(example)
    return kept, len(examples) - len(kept)
