"""Engine integrations: where WMRL plugs into existing RL engines.

Each subpackage needs its engine installed (an extra) and is imported only by code that uses it:
``wmrl.core.engines.trl`` (TRL's ``GRPOTrainer``, single machine and accelerate/DeepSpeed). The loop
trainer for policies TRL does not host (robot policies, small custom policies) is
:mod:`wmrl.core.loop`. All of them drive the same :class:`~wmrl.core.pipeline.RewardPipeline`.
"""
