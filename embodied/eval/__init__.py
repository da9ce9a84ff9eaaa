"""LIBERO evaluation: success metrics (Avg, Best@k, All@k by split), the JSON report, videos, policy loading."""

from wmrl.embodied.eval.libero_eval import LiberoEvalConfig, format_summary, make_specs, run_libero_eval
from wmrl.embodied.eval.metrics import (
    EpisodeOutcome,
    SuccessMetrics,
    metrics_by_split,
    per_task_metrics,
    summarize,
)
from wmrl.embodied.eval.policy_loader import POLICY_TYPES, load_policy, register_policy_type

__all__ = [
    "POLICY_TYPES",
    "EpisodeOutcome",
    "LiberoEvalConfig",
    "SuccessMetrics",
    "format_summary",
    "load_policy",
    "make_specs",
    "metrics_by_split",
    "per_task_metrics",
    "register_policy_type",
    "run_libero_eval",
    "summarize",
]
