"""``WMRLPPOTrainer``: verl's V1 synchronous PPO trainer with the corrector in the advantage step.

Registered as ``trainer.v1.trainer_mode=wmrl_sync``. Per step, in verl's single controller:

1. the reward loop has already scored every sample with the world model (``wmrl`` reward
   manager, :mod:`.reward`), streaming as rollouts finished;
2. ``_compute_advantage``: the rows' uids, world-model scores and responses are read from
   TransferQueue; :func:`~.advantage.correct_rows` plans the anchor groups from the uids alone,
   executes the anchor rows (the anchor source: point it at a Ray pool of sandbox nodes), and
   corrects; verl's own ``_compute_advantage`` then runs with ``algorithm.adv_estimator=wmrl``,
   whose estimator returns exactly these advantages; unknown rows leave the response mask, and the
   rows verl added as padding (tagged ``is_padding``) are neither graded nor executed;
3. with asynchronous anchors (``corrector.asynchrony.max_anchor_lag > 0``) the correction runs earlier,
   in ``_balance_batch`` (before verl pads the batch and computes its log-probabilities): the executions
   due land, this batch's are submitted and not awaited, the rows of the groups submitted are kept out
   of TransferQueue, and the landed rows with a late advantage join this batch
   (:mod:`.late_rows`); the estimator then applies every row's advantage by its key. Checkpoint
   steps and the last step drain, so a checkpoint holds nothing in flight;
4. checkpoints: the correction's files (:data:`~wmrl.core.pipeline.CORRECTOR_FILE`,
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

from wmrl.core.engines.verl.advantage import RowAdvantages, RowCorrection, correct_rows, publish
from wmrl.core.engines.verl.config import VerlConfig, load_object
from wmrl.core.engines.verl.late_rows import LateRow, LateRows, asynchronous_step
from wmrl.core.pipeline import RewardPipeline

__all__ = ["WMRLPPOTrainer", "build_pipeline", "drains", "load_state", "save_state"]


def build_pipeline(config: VerlConfig) -> RewardPipeline:
    """The run's reward pipeline in the trainer process: the anchor source; the world model already
    scored in the reward loop, so it is not built here (a stand-in keeps the pair check honest)."""
    anchor = load_object(config.anchor)() if config.anchor is not None else None

    class _ScoredInRewardLoop:
        name = "world_model(reward loop)"
        role = "world_model"

        def score(self, items: Sequence[Any]) -> NoReturn:  # pragma: no cover - the trainer never calls it
            raise RuntimeError("the world model scores in verl's reward loop, not in the trainer")

    wm = _ScoredInRewardLoop() if config.mode.value != "real" else None
    return RewardPipeline(wm, anchor, mode=config.mode, corrector=config.corrector)


def drains(step: int, total_steps: int, save_freq: int) -> bool:
    """Whether verl step ``step`` waits for every execution in flight and runs its own synchronously:
    a step that writes a checkpoint (``PPOTrainer.fit`` saves at every ``save_freq``-th step and at the
    last, when ``save_freq > 0``) and the last step, so that a checkpoint holds nothing in flight and
    the run's last executions still train."""
    return step >= total_steps or (save_freq > 0 and step % save_freq == 0)


def save_state(pipeline: RewardPipeline, step_folder: str | os.PathLike[str]) -> None:
    """Write the correction into verl's ``global_step_N`` checkpoint folder."""
    pipeline.save(Path(step_folder))


def load_state(pipeline: RewardPipeline, step_folder: str | os.PathLike[str]) -> None:
    """Restore the correction from verl's ``global_step_N`` folder (bit-identical corrector state)."""
    pipeline.load(Path(step_folder))


def put_late_rows(batch: Any, late: Sequence[LateRow]) -> Any:
    """Write the landed rows into ``batch``'s TransferQueue partition under fresh keys; the batch with them
    appended (tagged ``wmrl_late_from_step``)."""
    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.utils.transferqueue_utils import KVBatchMeta

    keys = [row.key for row in late]
    tags = [{**row.row.tag, "wmrl_late_from_step": row.step} for row in late]
    tq.kv_batch_put(
        keys=keys,
        partition_id=batch.partition_id,
        fields=list_of_dict_to_tensordict([dict(row.row.sample) for row in late]),
        tags=tags,
    )
    return KVBatchMeta(
        keys=list(batch.keys) + keys,
        tags=list(batch.tags) + tags,
        partition_id=batch.partition_id,
        fields=batch.fields,
        extra_info=batch.extra_info,
    )


def mask_rows(batch: Any, unknown: Any) -> Any:
    """Zero the response mask of the ``unknown`` rows (``(B,)`` bool) in TransferQueue: they leave the loss."""
    import torch
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    mask = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
    keep = torch.tensor(~unknown, dtype=torch.float32).unsqueeze(-1)
    # TransferQueue holds the mask as a jagged nested tensor: pad it, zero the unknown rows, and nest it
    # again with the original's lengths (as verl's own _compute_advantage writes its fields back,
    # verl/trainer/ppo/v1/trainer_base.py:1797)
    nested = mask["response_mask"]
    padded = nested.to_padded_tensor(padding=0)
    new = {"response_mask": response_to_nested((padded * keep).to(padded.dtype), nested)}
    return tq.kv_batch_put(
        keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(new, batch_size=len(unknown))
    )


class WMRLSteps:
    """The WMRL steps of :class:`WMRLPPOTrainer`, a mixin ahead of verl's ``PPOTrainerSync`` (whose
    methods :meth:`_verl` reaches): the correction before verl pads the batch (asynchronous anchors) or in
    its advantage step (synchronous), checkpoints with the correction's state."""

    # verl's attributes this mixin reads (set by PPOTrainer.__init__)
    config: Any
    global_steps: int
    total_training_steps: int
    parameter_sync_step: int

    def _verl(self) -> Any:
        """verl's ``PPOTrainerSync``, next in the MRO: its methods, reached as ``Any`` (verl ships no types)."""
        return super()

    def __init__(self, config: Any) -> None:
        self._verl().__init__(config)
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
        #: asynchronous anchors (corrector.asynchrony.max_anchor_lag > 0): the rows kept while their
        #: executions run, and each row's advantage for the step's update (by TransferQueue key)
        self.late_rows: LateRows | None = None
        self._row_advantages: dict[str, float] = {}
        if self.wmrl.corrector.asynchrony.enabled:
            if self.parameter_sync_step != 1:
                raise ValueError(
                    "corrector.asynchrony.max_anchor_lag > 0 needs one update per verl step "
                    f"(trainer.v1.wmrl_sync.parameter_sync_step=1; got {self.parameter_sync_step}): the "
                    "landing and the drain are per step"
                )
            self.late_rows = LateRows()

    def _rows(self, batch: Any, keep: Any = None) -> tuple[list[str], list[float], list[float], list[Any]]:
        """``(uids, world-model scores, their variances, items)`` of ``batch``'s rows (``keep``: a
        bool mask of the rows to read; default every row), as the reward loop left them."""
        import transfer_queue as tq

        fields = ["uid", "extra_fields", "data_source"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        uids = [str(u) for u in data.pop("uid").tolist()]
        extras = [(e or {}).get("reward_extra_info", {}) for e in data.pop("extra_fields").tolist()]
        sources = data.pop("data_source").tolist() if "data_source" in data else [None] * len(uids)
        if keep is not None:
            uids, extras, sources = (
                [v for v, k in zip(col, keep, strict=True) if k] for col in (uids, extras, sources)
            )
        wm = [float(e.get("wmrl_wm", np.nan)) for e in extras]
        var = [float(e.get("wmrl_wm_variance", np.nan)) for e in extras]
        rows = [{"data_source": s, **e} for s, e in zip(sources, extras, strict=True)]
        items = [self.item_fn(e.get("wmrl_text", ""), row) for e, row in zip(extras, rows, strict=True)]
        return uids, wm, var, items

    def _balance_batch(
        self,
        batch: Any,
        metrics: dict[str, Any],
        logging_prefix: str = "global_seqlen",
        keep_minibatch: bool = False,
    ) -> Any:
        if self.late_rows is not None:  # before verl pads the batch and computes its log-probabilities
            batch = self._correct_asynchronously(batch, metrics)
        return self._verl()._balance_batch(
            batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch
        )

    def _correct_asynchronously(self, batch: Any, metrics: dict[str, Any]) -> Any:
        """The corrector's step with executions off the critical path (:mod:`wmrl.core.late`): land
        what is due, plan and submit this batch's executions, correct; keep the rows of the groups
        submitted; put the landed rows with a late advantage into the batch."""
        import transfer_queue as tq

        assert self.late_rows is not None
        uids, wm, var, items = self._rows(batch)

        def fetch(keys: list[str]) -> list[Any]:
            # one row at a time, as verl's own padding helper reads a row (verl/trainer/ppo/padding_utils.py:176)
            return [tq.kv_batch_get(keys=[key], partition_id=batch.partition_id)[0] for key in keys]

        done = asynchronous_step(
            self.pipeline,
            self.late_rows,
            list(zip(batch.keys, uids, items, wm, var, strict=True)),
            dict(zip(batch.keys, batch.tags, strict=True)),
            self.global_steps,
            drains(self.global_steps, self.total_training_steps, int(self.config.trainer.save_freq)),
            fetch,
        )
        result, late = done.result, done.late
        self._row_advantages = dict(done.advantages)
        if late:
            batch = put_late_rows(batch, late)
            self._row_advantages.update({row.key: row.advantage for row in late})
        metrics.update({k: v for k, v in result.metrics.items() if v is not None})
        metrics["wmrl/late_rows"] = float(len(late))
        metrics["wmrl/kept_rows"] = float(len(self.late_rows))
        return batch

    def _correct_synchronously(self, batch: Any, metrics: dict[str, Any]) -> RowCorrection | RowAdvantages:
        """The corrector's step on the batch's own rows, executions awaited (``max_anchor_lag = 0``);
        rows verl added as padding (``is_padding``) are not graded and get no advantage."""
        padding = np.array([bool(tag.get("is_padding", False)) for tag in batch.tags], dtype=bool)
        uids, wm, var, items = self._rows(batch, ~padding)
        corrected = correct_rows(self.pipeline, uids, wm, items, self.global_steps, var)
        metrics.update({k: v for k, v in corrected.correction.metrics.items() if v is not None})
        if not padding.any():
            return corrected
        return self._published(
            batch, dict(zip(np.asarray(batch.keys)[~padding], corrected.advantages, strict=True))
        )

    def _published(self, batch: Any, advantages: dict[str, float]) -> RowAdvantages:
        """The batch's rows in its order (verl balanced and padded it) with their advantages by key
        (a row without one, verl's padding, gets NaN)."""
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid"])
        return RowAdvantages(
            uids=np.asarray([str(u) for u in data.pop("uid").tolist()], dtype=object),
            advantages=np.asarray([advantages.get(key, np.nan) for key in batch.keys], dtype=np.float64),
        )

    def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        if self.late_rows is None:
            rows: RowCorrection | RowAdvantages = self._correct_synchronously(batch, metrics)
        else:
            rows = self._published(batch, self._row_advantages)
            self._row_advantages = {}
        publish(rows)
        try:
            batch = self._verl()._compute_advantage(batch, metrics)
        finally:
            publish(None)
        unknown = np.isnan(rows.advantages)
        if unknown.any():  # unknown rows leave the loss, not only get advantage 0
            batch = mask_rows(batch, unknown)
        return batch

    def on_train_end(self) -> None:
        self._verl().on_train_end()
        if self.late_rows is not None:  # data ran out before the last step: calibration only
            self.pipeline.drain()
            self.late_rows.forget_before(self.pipeline.corrector.step_count + 1)

    def _save_checkpoint(self) -> None:
        self._verl()._save_checkpoint()
        save_state(
            self.pipeline,
            Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}",
        )

    def _load_checkpoint(self) -> None:
        self._verl()._load_checkpoint()
        if self.global_steps > 0:
            load_state(
                self.pipeline,
                Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}",
            )


def _register() -> type:
    from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

    @register_trainer("wmrl_sync")
    # verl ships no type information, so its classes are Any
    class WMRLPPOTrainer(WMRLSteps, PPOTrainerSync):  # type: ignore[misc]
        """verl ``PPOTrainerSync`` whose advantages come from the WMRL corrector (see the module docstring)."""

    return WMRLPPOTrainer


WMRLPPOTrainer: Any = None


def register() -> type:
    """Register ``wmrl_sync`` with verl (idempotent); returns the trainer class."""
    global WMRLPPOTrainer
    if WMRLPPOTrainer is None:
        WMRLPPOTrainer = _register()
    return cast(type, WMRLPPOTrainer)
