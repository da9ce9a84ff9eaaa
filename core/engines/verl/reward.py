"""The ``wmrl`` reward manager of verl's reward loop: the world model grades every sample.

verl scores each finished rollout in its reward-loop workers (``run_single`` on a one-row
``DataProto``, streaming as rollouts end). The manager decodes the response, builds the item
(:attr:`~.config.VerlConfig.item_fn`), asks the world model for its grade and returns it as the
provisional ``reward_score`` (NaN when unknown: a NaN reaching a non-WMRL estimator fails loudly,
it never trains as 0), with the fields the WMRL trainer reads in ``reward_extra_info``:
``wmrl_wm``, ``wmrl_wm_variance``, ``wmrl_status`` and ``wmrl_text`` (the response, from which
the trainer rebuilds the item for real execution of the anchor rows). Real execution does not
happen here: anchors are chosen per *batch* by the scheduler, in the trainer process.
"""

from __future__ import annotations

import math
from typing import Any, cast

from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from wmrl.core.engines.verl.config import VerlConfig, load_object
from wmrl.core.sources import collect_grades

__all__ = ["EXTRA_KEYS", "WMRLRewardManager", "sample_row"]

#: The ``reward_extra_info`` keys every sample carries (verl needs the same keys for every sample).
EXTRA_KEYS = ("wmrl_wm", "wmrl_wm_variance", "wmrl_status", "wmrl_text")


def sample_row(item: Any) -> dict[str, Any]:
    """The non-tensor fields of a one-row ``DataProto`` item, as plain values."""
    return dict(item.non_tensor_batch.items())


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


# verl ships no type information, so its classes are Any
class WMRLRewardManager(RewardManagerBase):  # type: ignore[misc]
    """verl ``RewardManagerBase`` named ``wmrl`` (``reward.reward_manager.name=wmrl``).

    Args (verl's): ``config``, ``tokenizer``, ``compute_score`` (unused: the world model scores),
    plus ``wmrl`` (a :class:`~.config.VerlConfig`; default: ``$WMRL_VERL_CONFIG``) and
    ``world_model`` (a built source, instead of the config's factory).
    """

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: Any = None,
        reward_model_tokenizer: Any = None,
        *,
        wmrl: VerlConfig | None = None,
        world_model: Any = None,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        self.wmrl = wmrl or VerlConfig.from_env()
        self.item_fn = self.wmrl.item_function()
        if world_model is None and self.wmrl.world_model is not None:
            world_model = load_object(self.wmrl.world_model)()
        self.world_model = world_model

    def response_text(self, item: Any) -> str:
        response_ids = item.batch["responses"]
        length = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        return cast(str, self.tokenizer.decode(response_ids[:length], skip_special_tokens=True))

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        item = data[-1:][0]  # multi-sequence outputs: the last sequence is graded (verl's convention)
        text = await self.loop.run_in_executor(None, self.response_text, item)
        info: dict[str, Any] = {"wmrl_wm": math.nan, "wmrl_wm_variance": math.nan, "wmrl_status": "unknown"}
        info["wmrl_text"] = text
        if self.world_model is not None:
            graded = self.item_fn(text, sample_row(item))
            (grade,) = await self.loop.run_in_executor(None, collect_grades, self.world_model, [graded])
            info["wmrl_wm"] = _nan(grade.value)
            info["wmrl_wm_variance"] = _nan(grade.variance) if grade.value is not None else math.nan
            info["wmrl_status"] = grade.status or ("unknown" if grade.value is None else "graded")
        return {"reward_score": info["wmrl_wm"], "reward_extra_info": info}
