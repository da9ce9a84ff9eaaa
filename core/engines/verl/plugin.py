"""verl's ``verl.plugins`` entry point: registers WMRL's pieces in every process that imports verl.

* reward manager ``wmrl`` (``reward.reward_manager.name=wmrl``): :class:`~.reward.WMRLRewardManager`;
* advantage estimator ``wmrl`` (``algorithm.adv_estimator=wmrl``): :func:`~.advantage.compute_wmrl_advantage`;
* trainer ``wmrl_sync`` (``trainer.v1.trainer_mode=wmrl_sync``): :class:`~.trainer.WMRLPPOTrainer`.

verl loads entry points while it is being imported, so this module imports verl's registries
directly and must not import ``verl`` at the top of a module verl imports first.
"""

from __future__ import annotations

__all__ = ["register_all"]

_done = False


def register_all() -> None:
    """Register the reward manager, the estimator and the trainer (idempotent)."""
    global _done
    if _done:
        return
    from verl.experimental.reward_loop.reward_manager import register as register_reward_manager
    from verl.trainer.ppo.core_algos import register_adv_est

    from wmrl.core.engines.verl.advantage import compute_wmrl_advantage
    from wmrl.core.engines.verl.reward import WMRLRewardManager
    from wmrl.core.engines.verl.trainer import register as register_trainer

    register_reward_manager("wmrl")(WMRLRewardManager)
    register_adv_est("wmrl")(compute_wmrl_advantage)
    register_trainer()
    _done = True


register_all()
