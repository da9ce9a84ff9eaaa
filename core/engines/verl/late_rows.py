"""Asynchronous anchors in verl: a batch's executed rows kept while their executions run, and put back
into the update of the step at which they land (:mod:`wmrl.core.late`).

verl clears a step's rows from TransferQueue when the step ends (``PPOTrainer.fit``), so the rows of
the groups whose executions are in flight are copied out first, as TransferQueue holds them after
generation (tokens, masks, rollout log-probabilities, reward fields, tags), into the trainer
process's memory: only the groups with an execution, one batch per step in flight. At the landing
step they are written back under fresh keys before verl's log-probability passes, so the update
sees them as rows of its own batch: their ``old_log_probs`` are recomputed at the current policy
(a plain gradient ``d`` steps stale; with ``algorithm.rollout_correction`` set, verl's importance
weights against the kept rollout log-probabilities apply to them as to every row), and their
advantage is the late one the corrector computed.

The TransferQueue read is passed in (``fetch``), so the bookkeeping is tested without a
TransferQueue; the trainer passes verl's and writes the due rows back itself (``put_late_rows``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wmrl.core.engines.verl.advantage import row_groups
from wmrl.core.late import LateGroups
from wmrl.core.pipeline import Scores

__all__ = ["AsynchronousStep", "KeptRow", "LateRow", "LateRows", "asynchronous_step", "late_key"]


def late_key(step: int, key: str) -> str:
    """The TransferQueue key a kept row is written back under: its own key, prefixed (verl's keys end in
    ``_<session>_<index>``, which its multi-trajectory helpers parse; the prefix keeps that)."""
    return f"wmrl-late{step}-{key}"


@dataclass(frozen=True)
class KeptRow:
    """One row as TransferQueue held it: ``sample`` its fields (field name -> value, one row), ``tag``
    its verl tag (``seq_len``, ``min_global_steps``...)."""

    key: str
    sample: Mapping[str, Any]
    tag: Mapping[str, Any]


@dataclass(frozen=True)
class LateRow:
    """A kept row due in this step's update with ``advantage`` (finite), generated at corrector step
    ``step``."""

    row: KeptRow
    advantage: float
    step: int

    @property
    def key(self) -> str:
        return late_key(self.step, self.row.key)


@dataclass
class LateRows:
    """The kept rows of the steps whose executions are in flight, by corrector step.

    ``_groups[step][group key]``: the TransferQueue keys of the group's rows in slot order (the
    order of the corrector's ``(n_groups, G)`` matrices); ``_rows[step][key]``: the kept row.
    """

    _groups: dict[int, dict[str, list[str]]] = field(default_factory=dict)
    _rows: dict[int, dict[str, KeptRow]] = field(default_factory=dict)

    def keep(
        self,
        step: int,
        groups: Mapping[str, Sequence[str]],
        tags: Mapping[str, Mapping[str, Any]],
        fetch: Callable[[list[str]], list[Mapping[str, Any]]],
    ) -> int:
        """Copy the rows of ``groups`` (group key -> its rows' TransferQueue keys, slot order) out of
        TransferQueue. ``fetch(keys)`` returns each key's fields; ``tags``: each key's verl tag.
        Returns the rows kept."""
        keys = [key for rows in groups.values() for key in rows]
        if step in self._rows:
            raise ValueError(f"rows of corrector step {step} are kept already")
        samples = fetch(keys) if keys else []
        if len(samples) != len(keys):
            raise RuntimeError(f"TransferQueue returned {len(samples)} rows for {len(keys)} keys")
        self._groups[step] = {g: list(rows) for g, rows in groups.items()}
        self._rows[step] = {
            key: KeptRow(key, dict(sample), dict(tags[key]))
            for key, sample in zip(keys, samples, strict=True)
        }
        return len(keys)

    def due(self, late: Sequence[LateGroups]) -> list[LateRow]:
        """The kept rows with a late advantage in ``late`` (what landed now), in group and slot order;
        the landed steps' rows are forgotten. A row with a NaN late advantage is not due (nothing to
        apply to it: not executed with ``late_update=executed``, or unknown)."""
        out: list[LateRow] = []
        for landed in late:
            groups = self._groups.pop(landed.step, None)
            rows = self._rows.pop(landed.step, None)
            if groups is None or rows is None:
                raise RuntimeError(
                    f"corrector step {landed.step} landed but none of its rows were kept (were they kept at "
                    "the step that submitted its executions?)"
                )
            for i, group in enumerate(landed.groups):
                kept = groups.get(group.key)
                for j in range(landed.advantages.shape[1]):
                    advantage = float(landed.advantages[i, j])
                    if not math.isfinite(advantage):
                        continue
                    if kept is None or j >= len(kept):  # only groups with an execution change
                        raise RuntimeError(
                            f"group {group.key!r} of corrector step {landed.step} has a late advantage for a row "
                            "that was not kept"
                        )
                    out.append(LateRow(rows[kept[j]], advantage, landed.step))
        return out

    def forget_before(self, step: int) -> int:
        """Forget the rows of steps before ``step`` (their executions landed for calibration only, or
        were drained without a step to train in). Returns the rows forgotten."""
        old = [s for s in self._rows if s < step]
        dropped = sum(len(self._rows[s]) for s in old)
        for s in old:
            del self._rows[s], self._groups[s]
        return dropped

    def __len__(self) -> int:
        return sum(len(rows) for rows in self._rows.values())


@dataclass(frozen=True)
class AsynchronousStep:
    """One verl batch through the asynchronous corrector: ``result`` the pipeline's step,
    ``advantages`` each of the batch's own rows' advantage by TransferQueue key (NaN: none), ``late`` the
    kept rows due in this step's update."""

    result: Any
    advantages: dict[str, float]
    late: list[LateRow]


def asynchronous_step(
    pipeline: Any,
    late_rows: LateRows,
    rows: Sequence[tuple[str, str, Any, float, float]],
    tags: Mapping[str, Mapping[str, Any]],
    step: int,
    drain: bool,
    fetch: Callable[[list[str]], list[Mapping[str, Any]]],
) -> AsynchronousStep:
    """Land what is due, plan and submit this batch's executions, correct; keep the rows of the groups
    submitted; return the landed rows with a late advantage.

    Args:
        pipeline: the run's :class:`~wmrl.core.pipeline.RewardPipeline` (``asynchrony.max_anchor_lag > 0``).
        late_rows: the rows kept so far.
        rows: per batch row ``(TransferQueue key, uid, item, world-model score, its variance)``, batch order.
        tags: each key's verl tag.
        step: verl's global step (group keys are ``<uid>@<step>``).
        drain: wait for everything in flight and execute this batch's rows synchronously.
        fetch: ``keys -> their fields`` from TransferQueue.
    """
    keys = [r[0] for r in rows]
    groups, group_of, slot = row_groups([r[1] for r in rows], [r[2] for r in rows], step)
    # the pipeline's flat rollouts are group-major (each group's items in slot order), not batch order
    flat = np.lexsort((slot, group_of))
    scored = Scores.empty(len(rows))
    scored.wm[:] = np.asarray([r[3] for r in rows], dtype=np.float64)[flat]
    scored.wm_variance[:] = np.asarray([r[4] for r in rows], dtype=np.float64)[flat]
    corrector_step = pipeline.corrector.step_count
    result = pipeline.step(groups, drain=drain, scored=scored)
    if any(entry.step == corrector_step for entry in pipeline.in_flight.pending):
        executed = result.plan.execute_mask(max(len(g.items) for g in groups)).any(axis=1)
        kept: dict[str, list[str]] = {}
        for i, key in enumerate(keys):
            if executed[group_of[i]]:
                kept.setdefault(groups[group_of[i]].key, []).append(key)
        late_rows.keep(corrector_step, kept, tags, fetch)
    advantages = np.asarray(result.advantages)[group_of, slot]
    late = late_rows.due(result.late)
    # what was due by now and did not land is overdue: calibration only, its rows never train
    late_rows.forget_before(corrector_step + 1 - pipeline.asynchrony.max_anchor_lag)
    return AsynchronousStep(result, {k: float(a) for k, a in zip(keys, advantages, strict=True)}, late)
