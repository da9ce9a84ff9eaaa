"""The corrector on a verl batch: groups from ``uid``, anchors executed, advantages per row.

verl keeps a GRPO group as the rows that share a ``uid`` (one prompt, ``rollout.n`` responses).
:func:`correct_rows` turns the rows of one training batch (their uid, the world model's score from
the reward manager, the item both sources grade) into the corrector's step: plan the executions
from the uids and the world model's scores, execute those rows through the pipeline's anchor source (a Ray pool when
it is one), correct, and return one advantage per row (NaN = unknown: the row leaves the loss).

The ``wmrl`` advantage estimator (:func:`compute_wmrl_advantage`, registered with verl's
``register_adv_est``) hands these advantages to verl's ``compute_advantage``: it refuses a batch
other than the one the corrector just corrected (same uids, same order), so it can never apply
one step's advantages to another.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from wmrl.core.corrector import Correction
from wmrl.core.pipeline import RewardPipeline
from wmrl.core.rollouts import Group

if TYPE_CHECKING:
    import torch

__all__ = [
    "RowAdvantages",
    "RowCorrection",
    "compute_wmrl_advantage",
    "correct_rows",
    "publish",
    "published",
    "row_groups",
]


@dataclass(frozen=True)
class RowCorrection:
    """One batch corrected, row by row.

    Attributes:
        uids: ``(B,)`` the rows' group ids, in batch order.
        advantages: ``(B,)`` the corrector's advantage per row (NaN: unknown; the row leaves the loss).
        rewards: ``(B,)`` the corrected reward per row (NaN: unknown).
        real: ``(B,)`` real-execution scores (NaN where not executed or unknown).
        anchor_rows: ``(B,)`` bool, rows executed for real (anchor groups' rows and single executions).
        correction: the corrector's result on the ``(groups, G)`` matrices.
        step_key: ``<global step>``: the step this correction belongs to.
    """

    uids: npt.NDArray[Any]
    advantages: npt.NDArray[Any]
    rewards: npt.NDArray[Any]
    real: npt.NDArray[Any]
    anchor_rows: npt.NDArray[Any]
    correction: Correction
    step_key: int


def _groups(uids: Sequence[Any]) -> tuple[list[str], npt.NDArray[Any], npt.NDArray[Any]]:
    """Group keys (first appearance order), each row's group index and its position in the group."""
    keys: dict[str, int] = {}
    group_of = np.empty(len(uids), dtype=np.int64)
    slot = np.empty(len(uids), dtype=np.int64)
    sizes: list[int] = []
    for i, uid in enumerate(uids):
        g = keys.setdefault(str(uid), len(keys))
        if g == len(sizes):
            sizes.append(0)
        group_of[i], slot[i] = g, sizes[g]
        sizes[g] += 1
    return list(keys), group_of, slot


def row_groups(
    uids: Sequence[Any], items: Sequence[Any], step: int
) -> tuple[list[Group], npt.NDArray[Any], npt.NDArray[Any]]:
    """A batch's rows as the pipeline's groups: ``(groups, group_of, slot)``, group keys ``<uid>@<step>``
    in first-appearance order, each group's items in row order; ``group_of`` / ``slot`` ``(B,)``: each
    row's group and its place in it (the corrector's matrices are ``[group_of, slot]``)."""
    if len(items) != len(uids):
        raise ValueError(f"uids and items must have one entry per row; got {len(uids)} and {len(items)}")
    keys, group_of, slot = _groups(uids)
    members: list[list[Any]] = [[] for _ in keys]
    for i, item in enumerate(items):
        members[int(group_of[i])].append(item)
    groups = [Group(f"{key}@{step}", members[g]) for g, key in enumerate(keys)]
    return groups, group_of, slot


def correct_rows(
    pipeline: RewardPipeline,
    uids: Sequence[Any],
    wm: Sequence[float],
    items: Sequence[Any],
    step: int,
    wm_variance: Sequence[float] | None = None,
    tasks: Sequence[str] | None = None,
) -> RowCorrection:
    """Plan, execute the anchor rows, correct (see the module docstring).

    Args:
        pipeline: the run's reward pipeline (its anchor source executes; its world model is not called
            here: the reward manager scored every row already).
        uids: ``(B,)`` group id per row.
        wm: ``(B,)`` world-model score per row (NaN: unknown).
        items: ``(B,)`` what the anchor source grades, per row.
        step: verl's global step (group keys are ``<uid>@<step>``).
        wm_variance: ``(B,)`` the world model's per-call noise variance (NaN: none).
        tasks: ``(B,)`` task key per row (anchors are stratified by task), or ``None``.
    """
    n = len(uids)
    if not (len(wm) == len(items) == n):
        raise ValueError(f"uids, wm and items must have one entry per row; got {n}, {len(wm)}, {len(items)}")
    keys, group_of, slot = _groups(uids)
    width = int(slot.max()) + 1 if n else 0
    group_tasks = None
    if tasks is not None:
        first: dict[int, str] = {}
        for i, g in enumerate(group_of):
            first.setdefault(int(g), str(tasks[i]))
        group_tasks = [first[g] for g in range(len(keys))]

    def matrix(flat: Sequence[Any] | npt.NDArray[Any], dtype: Any = np.float64) -> npt.NDArray[Any]:
        out = np.full((len(keys), width), np.nan if dtype is np.float64 else None, dtype=dtype)
        out[group_of, slot] = np.asarray(flat, dtype=dtype)
        return out

    # Every row was scored by the world model already, so plans that read its scores (per-rollout
    # anchors, the default) choose here; solutions the execution memory knows are not executed.
    flat_keys = pipeline.keys_of(list(items))
    solution_keys = None if flat_keys is None else matrix(flat_keys, object)
    plan = pipeline.plan(
        [f"{k}@{step}" for k in keys], group_tasks, matrix(wm), group_size=width, solution_keys=solution_keys
    )
    anchor_rows = np.asarray(plan.execute_mask(width))[group_of, slot]
    scores = pipeline.score(list(items), anchor_rows, world_model=False)
    real_flat = scores.real
    pipeline.learn(list(items), real_flat)  # a world model that learns from the run's outcomes
    variance = None if wm_variance is None else matrix(wm_variance)
    correction = pipeline.correct(
        plan, matrix(wm), matrix(real_flat), variance, rollouts=n, solution_keys=solution_keys
    )
    return RowCorrection(
        uids=np.asarray([str(u) for u in uids], dtype=object),
        advantages=np.asarray(correction.advantages)[group_of, slot],
        rewards=np.asarray(correction.rewards)[group_of, slot],
        real=np.asarray(real_flat, dtype=np.float64),
        anchor_rows=anchor_rows,
        correction=correction,
        step_key=int(step),
    )


@dataclass(frozen=True)
class RowAdvantages:
    """What the ``wmrl`` estimator applies to a batch: ``uids`` ``(B,)`` in batch order and one
    ``advantages`` ``(B,)`` per row (NaN: none; the row leaves the loss). A :class:`RowCorrection` is
    one; an asynchronous step publishes its rows' own and the late rows' advantages."""

    uids: npt.NDArray[Any]
    advantages: npt.NDArray[Any]


_published: RowCorrection | RowAdvantages | None = None
_lock = threading.Lock()


def publish(rows: RowCorrection | RowAdvantages | None) -> None:
    """Make ``rows`` the batch the ``wmrl`` estimator applies (``None``: none)."""
    global _published
    with _lock:
        _published = rows


def published() -> RowCorrection | RowAdvantages | None:
    with _lock:
        return _published


def compute_wmrl_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: npt.NDArray[Any] | Sequence[Any] | None = None,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator ``wmrl``: the corrector's advantages of the published batch.

    Args (verl's): ``token_level_rewards`` ``(B, T)``, ``response_mask`` ``(B, T)``, ``index`` ``(B,)``
    the rows' uids.

    Returns:
        ``(advantages, returns)``, each ``(B, T)``: the row's advantage on every response token
        (0 for unknown rows, which the WMRL trainer also removes from the loss mask).
    """
    import torch

    rows = published()
    if rows is None:
        raise RuntimeError(
            "algorithm.adv_estimator=wmrl needs the WMRL trainer (trainer.v1.trainer_mode=wmrl_sync), which "
            "corrects each batch before verl computes its advantages"
        )
    if (
        index is None
        or len(index) != len(rows.uids)
        or any(str(a) != b for a, b in zip(index, rows.uids, strict=True))
    ):
        raise RuntimeError(
            "the wmrl estimator was given a batch the corrector did not correct (its uids differ in number or order)"
        )
    values = torch.tensor(
        np.nan_to_num(rows.advantages, nan=0.0), dtype=torch.float32, device=response_mask.device
    )
    advantages = values.unsqueeze(-1) * response_mask.to(torch.float32)
    return advantages, advantages.clone()
