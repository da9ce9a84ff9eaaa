"""``WMRLPPOTrainer``: verl's V1 synchronous PPO trainer with the corrector in the advantage step.

Registered as ``trainer.v1.trainer_mode=wmrl_sync``. Per step, in verl's single controller:

1. the reward loop has already scored every sample with the world model (``wmrl`` reward
   manager, :mod:`.reward`), streaming as rollouts finished;
2. ``_compute_advantage``: the rows' uids, world-model scores and responses are read from
   TransferQueue; :func:`~.advantage.correct_rows` plans the anchor groups from the uids alone,
   executes the anchor rows (the anchor source: point it at a Ray pool of sandbox nodes), and
   corrects; verl's own ``_compute_advantage`` then runs with ``algorithm.adv_estimator=wmrl``,
   whose estimator returns exactly these advantages; unknown rows leave the response mask;
3. checkpoints: the correction's files (:data:`~wmrl.core.pipeline.CORRECTOR_FILE`,
   :data:`~wmrl.core.pipeline.LEDGER_FILE`) are written into verl's ``global_step_N`` folder and
   read back on resume (:func:`save_state` / :func:`load_state`).

A whole step of this trainer runs on a CPU (``tests/verl_env/test_verl_cpu_step.py``: rollouts
through vLLM's CPU build, with :mod:`.cpu_platform`) and resumes from its checkpoint; its parts
(the correction, the estimator, the state files) are also tested one by one against the real verl
package (``tests/verl_env/test_verl_plugin.py``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

import numpy as np

from wmrl.core.engines.verl.advantage import correct_rows, publish
from wmrl.core.engines.verl.config import VerlConfig, load_object
from wmrl.core.late import refuse_asynchrony
from wmrl.core.pipeline import RewardPipeline

__all__ = ["WMRLPPOTrainer", "build_pipeline", "load_state", "save_state"]


def build_pipeline(config: VerlConfig) -> RewardPipeline:
    """The run's reward pipeline in the trainer process: the anchor source; the world model already
    scored in the reward loop, so it is not built here (a stand-in keeps the pair check honest)."""
    refuse_asynchrony(
        config.corrector.asynchrony,
        "the verl integration",
        "its wmrl_sync trainer scores a batch inside verl's synchronous PPO step, which has no place for "
        "an earlier batch's late groups",
    )
    anchor = load_object(config.anchor)() if config.anchor is not None else None

    class _ScoredInRewardLoop:
        name = "world_model(reward loop)"
        role = "world_model"

        def score(self, items: Sequence[Any]) -> NoReturn:  # pragma: no cover - the trainer never calls it
            raise RuntimeError("the world model scores in verl's reward loop, not in the trainer")

    wm = _ScoredInRewardLoop() if config.mode.value != "real" else None
    return RewardPipeline(wm, anchor, mode=config.mode, corrector=config.corrector)


def save_state(pipeline: RewardPipeline, step_folder: str | os.PathLike[str]) -> None:
    """Write the correction into verl's ``global_step_N`` checkpoint folder."""
    pipeline.save(Path(step_folder))


def load_state(pipeline: RewardPipeline, step_folder: str | os.PathLike[str]) -> None:
    """Restore the correction from verl's ``global_step_N`` folder (bit-identical corrector state)."""
    pipeline.load(Path(step_folder))


def _register() -> type:
    from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

    @register_trainer("wmrl_sync")
    # verl ships no type information, so its classes are Any
    class WMRLPPOTrainer(PPOTrainerSync):  # type: ignore[misc]
        """verl ``PPOTrainerSync`` whose advantages come from the WMRL corrector (see the module docstring)."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.trainer_mode = "sync"  # behave as verl's own "sync" mode everywhere it checks the name
            if str(config.algorithm.adv_estimator) != "wmrl":
                raise ValueError("trainer.v1.trainer_mode=wmrl_sync needs algorithm.adv_estimator=wmrl")
            if config.algorithm.use_kl_in_reward:
                raise ValueError(
                    "algorithm.use_kl_in_reward is not supported with WMRL (the corrector's advantages would "
                    "ignore the per-token penalty); use actor_rollout_ref.actor.use_kl_loss instead"
                )
            self.wmrl = VerlConfig.from_env()
            self.pipeline = build_pipeline(self.wmrl)
            self.item_fn = self.wmrl.item_function()

        def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
            import torch
            import transfer_queue as tq
            from tensordict import TensorDict

            fields = ["uid", "extra_fields", "data_source"]
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
            uids = [str(u) for u in data.pop("uid").tolist()]
            extras = [(e or {}).get("reward_extra_info", {}) for e in data.pop("extra_fields").tolist()]
            sources = data.pop("data_source").tolist() if "data_source" in data else [None] * len(uids)
            wm = [float(e.get("wmrl_wm", np.nan)) for e in extras]
            var = [float(e.get("wmrl_wm_variance", np.nan)) for e in extras]
            rows = [{"data_source": s, **e} for s, e in zip(sources, extras, strict=True)]
            items = [self.item_fn(e.get("wmrl_text", ""), row) for e, row in zip(extras, rows, strict=True)]
            corrected = correct_rows(self.pipeline, uids, wm, items, self.global_steps, var)
            publish(corrected)
            try:
                batch = super()._compute_advantage(batch, metrics)
            finally:
                publish(None)
            unknown = np.isnan(corrected.advantages)
            if unknown.any():  # unknown rows leave the loss, not only get advantage 0
                mask = tq.kv_batch_get(
                    keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"]
                )
                keep = torch.tensor(~unknown, dtype=torch.float32).unsqueeze(-1)
                from verl.workers.utils.padding import response_to_nested

                # TransferQueue holds the mask as a jagged nested tensor: pad it, zero the unknown
                # rows, and nest it again with the original's lengths (as verl's own
                # _compute_advantage writes its fields back, verl/trainer/ppo/v1/trainer_base.py:1797)
                nested = mask["response_mask"]
                padded = nested.to_padded_tensor(padding=0)
                new = {"response_mask": response_to_nested((padded * keep).to(padded.dtype), nested)}
                batch = tq.kv_batch_put(
                    keys=batch.keys,
                    partition_id=batch.partition_id,
                    fields=TensorDict(new, batch_size=len(uids)),
                )
            metrics.update({k: v for k, v in corrected.correction.metrics.items() if v is not None})
            return batch

        def _save_checkpoint(self) -> None:
            super()._save_checkpoint()
            save_state(
                self.pipeline,
                Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}",
            )

        def _load_checkpoint(self) -> None:
            super()._load_checkpoint()
            if self.global_steps > 0:
                load_state(
                    self.pipeline,
                    Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}",
                )

    return WMRLPPOTrainer


WMRLPPOTrainer: Any = None


def register() -> type:
    """Register ``wmrl_sync`` with verl (idempotent); returns the trainer class."""
    global WMRLPPOTrainer
    if WMRLPPOTrainer is None:
        WMRLPPOTrainer = _register()
    return cast(type, WMRLPPOTrainer)
