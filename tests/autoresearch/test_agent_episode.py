"""Feedback formatting (one format for real and predicted runs), token caps, prompts and K-turn episodes."""

from __future__ import annotations

import pytest

from wmrl.autoresearch.agent.environment import SandboxEnvironment
from wmrl.autoresearch.agent.episode import Episode, EpisodeConfig, trajectory_reward
from wmrl.autoresearch.agent.feedback import FEEDBACK_STATUSES, ExecutionFeedback, format_feedback
from wmrl.autoresearch.agent.prompts import first_user_message, next_user_message, system_prompt
from wmrl.autoresearch.agent.tokens import ApproxTokens, truncate_middle

F = "```"
ENV = SandboxEnvironment(time_limit_s=600, memory_mb=4096, libraries=("numpy 1.26.4",))


def test_every_status_formats_and_states_its_meaning():
    for status in FEEDBACK_STATUSES:
        fb = ExecutionFeedback(status, position=0.5 if status == "valid" else None)
        text = format_feedback(fb)
        assert text.startswith(f"Execution status: {status} (")


def test_valid_feedback_shows_position_not_raw_score():
    fb = ExecutionFeedback("valid", stdout_tail="cv auc 0.81\n", score=0.8123, position=0.625, reward=0.8125)
    text = format_feedback(fb)
    assert "Leaderboard position: 0.625" in text and "Submission: valid" in text and "cv auc 0.81" in text
    assert "0.8123" not in text  # the raw metric would not exist in predicted feedback
    assert "Metric value: 0.8123" in format_feedback(fb, show_raw_score=True)


def test_failure_feedback_lines():
    crash = format_feedback(
        ExecutionFeedback("runtime_error", stdout_tail="loading\n", stderr_tail="Traceback...\nKeyError: 'y'")
    )
    assert crash.index("--- stderr (end) ---") < crash.index("--- stdout (end) ---")
    assert "KeyError: 'y'" in crash and "Submission: none" in crash and "position" not in crash
    rejected = format_feedback(
        ExecutionFeedback("invalid_submission", validation_error="expected 100 rows, got 99")
    )
    assert "Submission: rejected: expected 100 rows, got 99" in rejected
    syntax = format_feedback(
        ExecutionFeedback("syntax_error", stderr_tail="SyntaxError: invalid syntax (line 3)")
    )
    assert "Submission" not in syntax and "line 3" in syntax


def test_feedback_validation():
    with pytest.raises(ValueError, match="status must be one of"):
        ExecutionFeedback("exploded")
    with pytest.raises(ValueError, match="needs a position"):
        ExecutionFeedback("valid")
    with pytest.raises(ValueError, match="position must be in"):
        ExecutionFeedback("valid", position=1.5)


def test_token_cap_keeps_head_two_thirds_and_tail_one_third():
    counter = ApproxTokens()
    lines = [f"line {i:04d}" for i in range(2000)]
    fb = ExecutionFeedback("runtime_error", stderr_tail="\n".join([*lines, "ValueError: the real cause"]))
    text = format_feedback(fb, max_tokens=300)
    assert counter.count(text) <= 300
    assert text.startswith("Execution status: runtime_error") and text.endswith(
        "ValueError: the real cause\nSubmission: none"
    )
    stream = text.split("--- stderr (end) ---\n")[1].removesuffix("\nSubmission: none")
    head, tail = stream.split("tokens omitted ...]")
    head_tokens, tail_tokens = counter.count(head), counter.count(tail)
    assert head_tokens / (head_tokens + tail_tokens) == pytest.approx(2 / 3, abs=0.05)
    both = ExecutionFeedback("runtime_error", stdout_tail="\n".join(lines), stderr_tail="\n".join(lines))
    text = format_feedback(both, max_tokens=400)
    assert counter.count(text) <= 400 and "--- stdout (end) ---" in text and "--- stderr (end) ---" in text
    with pytest.raises(ValueError, match="too small"):
        format_feedback(both, max_tokens=30)
    short = "short text"
    assert truncate_middle(short, 100) == short
    with pytest.raises(ValueError):
        truncate_middle(short, 0)


def test_from_result_matches_the_real_graders_record():
    from wmrl.autoresearch.grading.grader import GradeResult

    valid = GradeResult(
        task_id="t", status="valid", reward=0.8, score=0.93, position=0.6, stdout_tail="acc 0.93"
    )
    fb = ExecutionFeedback.from_result(valid)
    assert (fb.status, fb.position, fb.score, fb.reward, fb.stdout_tail) == (
        "valid",
        0.6,
        0.93,
        0.8,
        "acc 0.93",
    )
    syntax = GradeResult(
        task_id="t", status="syntax_error", reward=0.0, reason="SyntaxError: invalid syntax (line 2)"
    )
    assert ExecutionFeedback.from_result(syntax).stderr_tail == "SyntaxError: invalid syntax (line 2)"
    rejected = GradeResult(
        task_id="t",
        status="invalid_submission",
        reward=0.2,
        reason="missing column 'y'",
        submission_error="columns",
    )
    fb = ExecutionFeedback.from_result(rejected)
    assert fb.validation_error == "missing column 'y'" and fb.stderr_tail == ""


def test_prompts_state_the_contract():
    text = system_prompt(ENV, turns=3)
    for needle in (
        'os.environ["DATA_DIR"]',
        'os.environ["SUBMISSION_PATH"]',
        "read-only",
        "fresh, empty scratch folder",
        "time limit 10 min",
        "memory 4 GiB",
        "numpy 1.26.4",
        "up to 3 attempts",
        f"{F}python",
    ):
        assert needle in text
    assert "one attempt" in system_prompt(ENV, turns=1)
    assert first_user_message("OVERVIEW").startswith("OVERVIEW\n\n")
    assert "2 attempts left" in next_user_message("fb", 1, 3) and "1 attempt left" in next_user_message(
        "fb", 2, 3
    )
    with pytest.raises(ValueError):
        next_user_message("fb", 3, 3)
    with pytest.raises(ValueError):
        system_prompt(ENV, turns=0)


def test_three_turn_episode():
    ep = Episode(system_prompt(ENV, 3), first_user_message("OVERVIEW"), EpisodeConfig(turns=3))
    assert [m["role"] for m in ep.messages] == ["system", "user"]
    a1 = ep.add_reply("no code at all")
    assert a1.malformed
    nxt = ep.add_feedback(ExecutionFeedback("malformed", reward=0.0))
    assert nxt is not None and "Result of attempt 1 of 3" in nxt and "malformed" in nxt
    a2 = ep.add_reply(f"Plan.\n{F}python\nprint(1)\n{F}")
    assert a2.code == "print(1)"
    with pytest.raises(RuntimeError, match="add_feedback"):
        ep.add_reply("again")
    ep.add_feedback(ExecutionFeedback("valid", position=0.4, reward=0.7))
    ep.add_reply(f"{F}python\nprint(2)\n{F}")
    assert ep.add_feedback(ExecutionFeedback("runtime_error", stderr_tail="boom", reward=0.1)) is None
    assert ep.done and ep.rewards == [0.0, 0.7, 0.1] and ep.reward() == 0.7
    assert [m["role"] for m in ep.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    with pytest.raises(RuntimeError, match="over"):
        ep.add_reply("more")


def test_single_turn_episode_has_no_feedback_message():
    ep = Episode("sys", "task", EpisodeConfig(turns=1))
    ep.add_reply(f"{F}python\nx=1\n{F}")
    assert ep.add_feedback(ExecutionFeedback("no_submission", reward=0.2)) is None
    assert len(ep.messages) == 3 and ep.reward() == 0.2


def test_trajectory_reward_rules():
    assert trajectory_reward([0.1, 0.7, 0.2]) == 0.7
    assert trajectory_reward([0.1, 0.7, 0.2], "last") == 0.2
    assert trajectory_reward([0.1, 0.7, 0.4], "mean") == pytest.approx(0.4)
    assert trajectory_reward([0.1, None, 0.2]) is None  # the unknown turn might have been the best
    assert trajectory_reward([0.1, None, 0.2], unknown="ignore") == 0.2
    assert trajectory_reward([None, None], unknown="ignore") is None
    assert trajectory_reward([]) is None
    with pytest.raises(ValueError):
        trajectory_reward([0.1], "median")
    with pytest.raises(ValueError, match="turns"):
        EpisodeConfig(turns=0)
    with pytest.raises(ValueError, match="aggregation"):
        EpisodeConfig(aggregation="worst")
