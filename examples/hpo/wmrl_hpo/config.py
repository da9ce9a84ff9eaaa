"""``wmrl train hpo``: the shared training keys, plus this domain's few."""

from __future__ import annotations

from dataclasses import dataclass, field

from wmrl.core.config import require
from wmrl.core.corrector import CorrectorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.train_config import LoggingConfig, TrainConfigBase
from wmrl_hpo.tasks import TASKS


def _corrector() -> CorrectorConfig:
    return CorrectorConfig(debias=DebiasConfig(min_pairs=16))


@dataclass(frozen=True)
class HPOConfig(TrainConfigBase):
    """Hyperparameter search as RL: a policy proposes gradient-boosting configurations per dataset.

    Attributes:
        tasks: the datasets (any of breast_cancer, wine, diabetes, synthetic).
        workers: cross-validations run at once (real execution).
        report_greedy: log each step the true score of the policy's greedy configuration per task
            (extra real executions for the log only; they train nothing).
    """

    steps: int = 30
    groups_per_step: int = 4
    group_size: int = 8
    learning_rate: float = 0.2
    logging: LoggingConfig = field(default_factory=lambda: LoggingConfig(report_to=()))
    corrector: CorrectorConfig = field(default_factory=_corrector)
    tasks: tuple[str, ...] = TASKS
    workers: int = 2
    report_greedy: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            bool(self.tasks) and all(t in TASKS for t in self.tasks), f"tasks must be among {list(TASKS)}"
        )
        require(self.workers >= 1, f"workers must be >= 1; got {self.workers}")
