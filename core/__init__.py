"""WMRL core: the domain-agnostic correction method (anchor scheduling, isotonic debiasing,
inverse-variance fusion, group advantages) and its contracts. Depends only on numpy,
scikit-learn and torch; never imports ``wmrl.autoresearch`` or ``wmrl.embodied``."""

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
    "FunctionSource",
    "Grade",
    "RewardSource",
    "Role",
    "SourceError",
    "as_source",
    "check_pair",
    "check_source",
    "collect_grades",
]
