"""The AutoResearch agent: task overview, prompts, action parsing, multi-turn episodes and feedback.

* :func:`parse_action`: plan + one fenced Python script per reply (robust to cut-off fences).
* :func:`build_overview` / :func:`overview_from_task`: the task brief within a token budget.
* :func:`system_prompt`: goal, answer format and the solution contract (DATA_DIR, SUBMISSION_PATH).
* :class:`ExecutionFeedback` / :func:`format_feedback`: one feedback format for real and predicted runs.
* :class:`Episode`: K turns with feedback; reward = best turn by default.
"""

from wmrl.autoresearch.agent.actions import Action, parse_action
from wmrl.autoresearch.agent.environment import SandboxEnvironment, detect_libraries
from wmrl.autoresearch.agent.episode import Episode, EpisodeConfig, trajectory_reward
from wmrl.autoresearch.agent.feedback import FEEDBACK_STATUSES, ExecutionFeedback, format_feedback
from wmrl.autoresearch.agent.overview import OverviewConfig, OverviewError, build_overview
from wmrl.autoresearch.agent.overview import from_task as overview_from_task
from wmrl.autoresearch.agent.prompts import (
    PROMPT_VERSION,
    first_user_message,
    next_user_message,
    system_prompt,
)
from wmrl.autoresearch.agent.tokens import ApproxTokens, HFTokens, TokenCounter, truncate_middle

__all__ = [
    "FEEDBACK_STATUSES",
    "PROMPT_VERSION",
    "Action",
    "ApproxTokens",
    "Episode",
    "EpisodeConfig",
    "ExecutionFeedback",
    "HFTokens",
    "OverviewConfig",
    "OverviewError",
    "SandboxEnvironment",
    "TokenCounter",
    "build_overview",
    "detect_libraries",
    "first_user_message",
    "format_feedback",
    "next_user_message",
    "overview_from_task",
    "parse_action",
    "system_prompt",
    "trajectory_reward",
    "truncate_middle",
]
