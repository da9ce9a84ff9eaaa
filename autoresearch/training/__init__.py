"""AutoResearch training: the run configuration and how it drives the core TRL trainer.

* :class:`~wmrl.autoresearch.training.config.TrainConfig` and
  :func:`~wmrl.autoresearch.training.run.run_training`: ``wmrl train autoresearch``, on
  :class:`wmrl.core.engines.trl.WMRLGRPOTrainer` (the domain-neutral TRL integration).
* :func:`~wmrl.autoresearch.training.streams.solution_items`: a completion -> the ``Solution`` both
  reward sources grade.
* :mod:`~wmrl.autoresearch.training.episodes`: the agent's K-turn episode for the core rollout.

Importing this package imports nothing else (the ``wmrl`` command registers from it).
"""
