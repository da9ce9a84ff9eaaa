"""The world model's prompt: predict the outcome of running a script, as one JSON object.

The prompt is a system message (the simulator's role, the JSON keys in a fixed order, how to
judge), one worked example as a user/assistant exchange (small models copy formats far more
reliably from an example than from a description), then the task overview and the script with
1-based line numbers. The assistant's reply is started with :data:`ASSISTANT_PREFIX`
(``{"status": "``) when the backend supports a prefix, which forces JSON from the first token.

The JSON key order puts ``position`` before the free-text ``output``: a reply cut off by the
token cap still carries everything the reward needs (the parser closes the open string).

Long scripts keep their head and their tail (where submissions are written) around a marker,
instead of losing the tail as a plain prefix cut would (the official release cut at 8000
characters, biasing the world model toward "no submission").

Change :data:`PROMPT_VERSION` with any change of the text: cached predictions are keyed by it.
"""

from __future__ import annotations

import json

__all__ = [
    "ASSISTANT_PREFIX",
    "PROMPT_VERSION",
    "SYSTEM_PROMPT",
    "build_messages",
    "clip_code",
    "number_lines",
]

# wm-v2: the task overview pays its data inventory before the description (after the metric's
# paragraph) and rounds float examples (wm-v1 at 400 tokens showed no data line).
PROMPT_VERSION = "wm-v2"
ASSISTANT_PREFIX = '{"status": "'

SYSTEM_PROMPT = """You are an execution simulator for machine-learning scripts. You never run code: you read a task and a Python script and predict what happens when the script runs in the sandbox described in the task. Reply with ONE JSON object and nothing else, with these keys in this order:
"status": one of "syntax_error", "runtime_error", "timeout", "no_submission", "invalid_submission", "valid"
"error_type": the exception class such as "KeyError", or null
"error_line": the script line where it fails, or null
"position": only for "valid": the expected leaderboard position, from 0.0 (worse than every reference entry) to 1.0 (better than all); else null
"output": the last lines the run prints (for a failure, the end of the traceback), at most 4 lines

How to judge: the script runs top to bottom and the first exception stops it (reading a missing file or column, a wrong API call, a shape mismatch). A run that ends without writing the CSV at SUBMISSION_PATH is "no_submission"; a CSV with wrong columns or row count is "invalid_submission"; too much computation for the time limit is "timeout". Many plausible-looking scripts crash. For "valid", judge the position by how strong the method is for this task."""

_EXAMPLE_OVERVIEW = """# TASK
Predict whether a passenger survived (column Survived, 0 or 1). Evaluation: accuracy.
## DATA (read-only, in DATA_DIR)
- train.csv: 891 rows x 5 columns: PassengerId (int64), Pclass (int64), Sex (object), Age (float64, 177 missing), Survived (int64)
- test.csv: 418 rows x 4 columns; same columns as train.csv without Survived
## SUBMISSION CONTRACT
Write a CSV file to the path in SUBMISSION_PATH with exactly this header: PassengerId,Survived"""

_EXAMPLE_CODE = """import os
import pandas as pd
from sklearn.linear_model import LogisticRegression

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
X = train[["Pclass", "Age"]]
model = LogisticRegression().fit(X, train["Survived"])
pred = model.predict(test[["Pclass", "Age"]])
pd.DataFrame({"PassengerId": test["PassengerId"], "Survived": pred}).to_csv(os.environ["SUBMISSION_PATH"], index=False)"""

_EXAMPLE_ANSWER = {
    "status": "runtime_error",
    "error_type": "ValueError",
    "error_line": 9,
    "position": None,
    "output": 'File "solution.py", line 9, in <module>\nValueError: Input X contains NaN.',
}


def number_lines(code: str) -> str:
    """The script with right-aligned 1-based line numbers (``  12| text``)."""
    lines = code.split("\n")
    width = len(str(len(lines)))
    return "\n".join(f"{i:>{width}}| {line}" for i, line in enumerate(lines, 1))


def clip_code(code: str, max_chars: int) -> str:
    """The numbered script (see :func:`number_lines`), cut to about ``max_chars`` characters.

    Whole lines are kept from the head (2/3 of the budget) and from the tail (1/3), with a marker
    line between them; numbering is done before the cut, so the tail keeps its true line numbers.
    """
    if max_chars < 200:
        raise ValueError(f"max_chars must be >= 200; got {max_chars}")
    numbered = number_lines(code)
    if len(numbered) <= max_chars:
        return numbered
    lines = numbered.split("\n")
    head: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > max_chars * 2 // 3:
            break
        head.append(line)
        used += len(line) + 1
    tail: list[str] = []
    used = 0
    for line in reversed(lines[len(head) :]):
        if used + len(line) + 1 > max_chars // 3:
            break
        tail.append(line)
        used += len(line) + 1
    tail.reverse()
    skipped = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"[... {skipped} lines not shown ...]", *tail])


def _user_message(overview: str, numbered_code: str) -> str:
    return f"{overview.rstrip()}\n\n## SCRIPT (solution.py)\n{numbered_code}\n\nPredict the outcome as one JSON object."


def build_messages(
    overview: str, code: str, code_max_chars: int = 8000, worked_example: bool = True
) -> list[dict[str, str]]:
    """The chat messages asking for a prediction of ``code`` on the task described by ``overview``."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    if worked_example:
        messages += [
            {"role": "user", "content": _user_message(_EXAMPLE_OVERVIEW, number_lines(_EXAMPLE_CODE))},
            {"role": "assistant", "content": json.dumps(_EXAMPLE_ANSWER)},
        ]
    messages.append({"role": "user", "content": _user_message(overview, clip_code(code, code_max_chars))})
    return messages
