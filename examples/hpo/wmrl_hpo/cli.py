"""``wmrl train hpo``: registered through the ``wmrl.cli`` entry point of this package, like any domain."""

from __future__ import annotations


def register(root) -> None:
    root.train(
        "hpo",
        "example domain: RL over gradient-boosting hyperparameters, graded by a subsample proxy and cross-validation",
        config="wmrl_hpo.config:HPOConfig",
        run="wmrl_hpo.cli:run",
    )


def run(config, run_dir, *, progress: bool) -> list[str]:
    from wmrl.core import RewardPipeline
    from wmrl.core.loop import LoopTrainer
    from wmrl_hpo.domain import HPODomain
    from wmrl_hpo.tasks import CrossValidation, SubsampleProxy

    pipeline = RewardPipeline(
        SubsampleProxy(), CrossValidation(config.workers), mode=config.mode, corrector=config.corrector
    )
    trainer = LoopTrainer(HPODomain(config), pipeline, config, run_dir, progress=progress)
    try:
        report = trainer.run()
    finally:
        trainer.close()
    return [f"run directory: {run_dir.path}; cost: {report['total']['wall_s']:.1f} s ({report['mode']})"]
