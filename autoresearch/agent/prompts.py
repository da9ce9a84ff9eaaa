"""The agent's prompts: the system prompt (goal, action format, solution contract) and the turn messages.

The system prompt states the contract every sandbox backend implements:

* ``DATA_DIR``: environment variable holding the public data folder (read-only);
* ``SUBMISSION_PATH``: environment variable holding the path of the CSV to write;
* the working directory is a fresh, empty scratch folder;
* time and memory limits, CPUs, the GPUs assigned to the run (or none), no network, the available libraries.

Prompt text is versioned (:data:`PROMPT_VERSION`); change the version with the text, because
rollouts are only comparable under the same prompt.
"""

from __future__ import annotations

from wmrl.autoresearch.agent.environment import SandboxEnvironment

__all__ = [
    "MODEL_PROMPT_VERSION",
    "PROMPT_VERSION",
    "first_user_message",
    "model_system_prompt",
    "model_user_message",
    "next_user_message",
    "system_prompt",
]

# agent-v2: the overview leaves out the library list the system prompt already gives, and its data
# inventory comes before the description (agent-v1 showed no data line at 400 tokens).
PROMPT_VERSION = "agent-v2"

#: The prompts of the ``model`` action (the agent writes the model of a fixed pipeline).
MODEL_PROMPT_VERSION = "model-slot-v1"


def system_prompt(environment: SandboxEnvironment, turns: int = 1) -> str:
    """The agent's system prompt for an episode of ``turns`` attempts."""
    if turns < 1:
        raise ValueError(f"turns must be >= 1; got {turns}")
    attempts = "one attempt" if turns == 1 else f"up to {turns} attempts; your best attempt counts"
    strategy = (
        "Write a simple, robust solution that surely produces a valid submission."
        if turns == 1
        else "On the first attempt land a simple valid submission. After each result, change one thing at a "
        "time, keep what worked, and fix errors before improving accuracy."
    )
    return f"""You are an expert machine-learning engineer. You solve a Kaggle-style prediction task by writing one complete Python script. The script is run and its submission is scored against a leaderboard of reference entries. Goal: the best leaderboard position (1.0 = better than every reference entry), with {attempts}.

Answer format (every turn):
1. A short plan: 2 to 4 sentences on what the script does (or, after a result, what you change and why).
2. ONE complete Python script in a single ```python fenced block. It runs on its own from top to bottom; no placeholders.

How the script is run:
- os.environ["DATA_DIR"] is the folder with the task's files (read-only). Read every input from there.
- Write the predictions as a CSV file to os.environ["SUBMISSION_PATH"], in the format of the sample submission.
- The working directory is a fresh, empty scratch folder; you may write temporary files there.
- Limits: {environment.limits_line()}.
- Libraries: {environment.libraries_line()}.

{strategy} Print a validation score so results can be compared."""


def first_user_message(overview: str) -> str:
    """The first observation: the task overview and the request for a plan and a script."""
    return f"{overview.rstrip()}\n\nReply with your plan and one complete ```python script."


def next_user_message(feedback_text: str, turn: int, turns: int) -> str:
    """The observation after attempt ``turn`` (1-based) of ``turns``: the feedback and what to do next."""
    if not 1 <= turn < turns:
        raise ValueError(f"a next message exists only after attempt 1..{turns - 1}; got turn {turn}")
    left = turns - turn
    return (
        f"Result of attempt {turn} of {turns}:\n{feedback_text.rstrip()}\n\n"
        f"{left} attempt{'s' if left > 1 else ''} left. Reply with a short plan and one complete ```python script."
    )


def model_system_prompt(environment: SandboxEnvironment) -> str:
    """The system prompt of the ``model`` action: the agent writes only the model of a fixed pipeline
    (:mod:`wmrl.autoresearch.training.model_slot`); one attempt."""
    return f"""You are an expert machine-learning engineer. You solve a Kaggle-style prediction task by choosing the model of a fixed pipeline. The pipeline is run and its submission is scored against a leaderboard of reference entries. Goal: the best leaderboard position (1.0 = better than every reference entry), with one attempt.

The pipeline reads the data, builds the feature matrix X and the target y, runs your block, then fits `model` on the training rows and writes the predictions. Your block must set `model` to an estimator with fit and predict (predict_proba where the pipeline asks for probabilities).

Answer format: one sentence naming your choice, then ONE ```python block of a few lines that imports what it uses and sets `model`.
Limits: {environment.limits_line()}. Libraries: {environment.libraries_line()}."""


def model_user_message(overview: str, head: str, tail: str) -> str:
    """The first observation of the ``model`` action: the overview and the pipeline around the slot."""
    return (
        f"{overview.rstrip()}\n\nThe pipeline:\n```python\n{head.rstrip()}\n# <- your block: set `model`\n"
        f"{tail.strip()}\n```\n\nReply with one sentence and one ```python block that sets `model`."
    )
