"""``wmrl train hpo``: registered through the ``wmrl.cli`` entry point of this package, like any domain."""

from __future__ import annotations

import time


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
    started = time.perf_counter()
    try:
        report = trainer.run()
    finally:
        trainer.close()
    wall = time.perf_counter() - started
    # The streams run concurrently (the world model scores while the sandbox executes), so their
    # seconds add up to more than the wall time: say which is which.
    return [
        f"run directory: {run_dir.path} ({report['mode']}, {wall:.1f} s of wall time)",
        f"compute: {report['total']['wall_s']:.1f} s summed over the streams (they overlap, so the sum can "
        "exceed the wall time; per stream in cost_report.json)",
    ]
