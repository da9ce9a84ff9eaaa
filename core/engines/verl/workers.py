"""The world model as a verl worker group: one scorer per GPU, a batch split across them.

The paper served one world-model replica per GPU. In a verl run the same shape is a
``RayWorkerGroup`` of :class:`WorldModelWorker`: each worker builds the world-model source once
(``VerlConfig.world_model``'s factory, or the one given) and ``score`` takes a ``DataProto`` that
verl splits across the workers (``Dispatch.DP_COMPUTE_PROTO``) and gathers back in order: per row
the world model's score (NaN: unknown) and variance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

from wmrl.core.engines.verl.config import load_object
from wmrl.core.sources import collect_grades

__all__ = ["WorldModelWorker"]


# verl ships no type information, so its classes are Any
class WorldModelWorker(Worker):  # type: ignore[misc]
    """A verl ``Worker`` holding one world-model source.

    Args:
        factory: ``"module:factory"`` (or the factory itself) returning the source.
        item_field: the non-tensor field of each row that holds the item to grade.
    """

    def __init__(self, factory: str | Callable[[], Any], item_field: str = "wmrl_item") -> None:
        super().__init__()
        self.source = (load_object(factory) if isinstance(factory, str) else factory)()
        self.item_field = item_field

    # verl's decorator is unannotated
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)  # type: ignore[untyped-decorator]
    def score(self, data: DataProto) -> DataProto:
        items = list(data.non_tensor_batch[self.item_field])
        grades = collect_grades(self.source, items)
        wm = np.array([math.nan if g.value is None else g.value for g in grades], dtype=np.float64)
        var = np.array(
            [math.nan if g.value is None or g.variance is None else g.variance for g in grades],
            dtype=np.float64,
        )
        rank = np.full(len(items), self.rank, dtype=np.int64)
        return DataProto.from_dict(non_tensors={"wmrl_wm": wm, "wmrl_wm_variance": var, "wmrl_rank": rank})
