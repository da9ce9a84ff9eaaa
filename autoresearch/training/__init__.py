"""GRPO on TRL with world-model rewards: the trainer, the K-turn rollout, the run configuration.

* :class:`~wmrl.autoresearch.training.trainer.WMRLGRPOTrainer`: TRL's ``GRPOTrainer`` whose rewards
  and advantages come from the core corrector (modes ``real``, ``world_model``, ``wmrl``).
* :mod:`~wmrl.autoresearch.training.rollout`: K-turn episodes through TRL's ``rollout_func``.
* :class:`~wmrl.autoresearch.training.config.TrainConfig` and
  :func:`~wmrl.autoresearch.training.run.run_training`: ``wmrl train autoresearch``.

Importing this package imports nothing else (the ``wmrl`` command registers from it); TRL and
transformers load with the trainer module.
"""
