"""WMRL core: the domain-agnostic correction method (anchor scheduling, isotonic debiasing,
inverse-variance fusion, group advantages) and its contracts. Depends only on numpy,
scikit-learn and torch; never imports ``wmrl.autoresearch`` or ``wmrl.embodied``."""

from wmrl.core.modes import Mode
from wmrl.core.pipeline import RewardPipeline, StepResult
from wmrl.core.rollouts import Exact, Group, RolloutNeeds, needs_of
from wmrl.core.sources import (
    FunctionSource,
    Grade,
    RewardSource,
    Role,
    SourceError,
    as_source,
    check_pair,
    check_source,
    collect_grades,
)

__all__ = [
    "Exact",
    "FunctionSource",
    "Grade",
    "Group",
    "Mode",
    "RewardPipeline",
    "RewardSource",
    "Role",
    "RolloutNeeds",
    "SourceError",
    "StepResult",
    "as_source",
    "check_pair",
    "check_source",
    "collect_grades",
    "needs_of",
]
