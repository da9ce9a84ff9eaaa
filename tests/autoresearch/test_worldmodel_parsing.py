"""World-model output parsing: every failure mode is a PredictionParseError (the caller's None), never a number."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.autoresearch.worldmodel.prediction import (
    WM_STATUSES,
    Prediction,
    PredictionParseError,
    candidate_objects,
    parse_prediction,
)

GOOD = {
    "status": "runtime_error",
    "error_type": "KeyError",
    "error_line": 12,
    "position": None,
    "output": "Traceback\nKeyError: 'y'",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (json.dumps(GOOD), Prediction("runtime_error", "KeyError", 12, None, "Traceback\nKeyError: 'y'")),
        (
            '{"status": "valid", "position": 0.4, "output": "ok"}',
            Prediction("valid", position=0.4, output="ok"),
        ),
        # think blocks and code fences around the answer
        (
            '<think>maybe {"status": "valid", "position": 1}</think>\n```json\n{"status": "no_submission"}\n```',
            Prediction("no_submission"),
        ),
        # the LAST object that parses wins; prose braces before it are ignored
        (
            'Consider {x}. {"status": "timeout", "output": "killed"} and also {"status": "valid", "position": 0.9}',
            Prediction("valid", position=0.9),
        ),
        # ... but a later object without a valid schema falls back to an earlier valid one
        (
            '{"status": "syntax_error", "error_line": 3} {"note": "extra"}',
            Prediction("syntax_error", error_line=3),
        ),
        # trailing commas, raw newlines in strings, numeric strings
        (
            '{"status": "runtime_error", "error_line": "7", "output": "line1\nline2",}',
            Prediction("runtime_error", error_line=7, output="line1\nline2"),
        ),
        # a Python-literal dict
        (
            "{'status': 'valid', 'position': 0.25, 'output': None, 'error_type': None}",
            Prediction("valid", position=0.25),
        ),
        # aliases of the official release's status names
        ('{"status": "runtime_err"}', Prediction("runtime_error")),
        ('{"status": "RAN_NO_SUB"}', Prediction("no_submission")),
        ('{"status": "Syntax Error"}', Prediction("syntax_error")),
        # percent positions
        ('{"status": "valid", "position": "35%"}', Prediction("valid", position=0.35)),
        # braces inside strings do not confuse the scanner
        (
            '{"status": "runtime_error", "output": "f\\"{x}\\" } {"}',
            Prediction("runtime_error", output='f"{x}" } {'),
        ),
        # ill-formed optional fields are dropped, not fatal
        ('{"status": "runtime_error", "error_line": -4, "error_type": 17}', Prediction("runtime_error")),
        # a valid outcome never carries an error
        (
            '{"status": "valid", "position": 0.5, "error_type": "KeyError", "error_line": 3}',
            Prediction("valid", position=0.5),
        ),
        # "feedback" is accepted for "output"
        ('{"status": "no_submission", "feedback": "done"}', Prediction("no_submission", output="done")),
    ],
)
def test_parses(text, expected):
    assert parse_prediction(text) == expected


def test_truncated_output_is_closed_and_marked():
    text = '{"status": "valid", "error_type": null, "error_line": null, "position": 0.7, "output": "Fold 1 auc 0.8\nFold 2'
    got = parse_prediction(text)
    assert got == Prediction("valid", position=0.7, output="Fold 1 auc 0.8\nFold 2", repaired=True)
    cut_after_key = '{"status": "runtime_error", "error_line":'
    assert parse_prediction(cut_after_key) == Prediction("runtime_error", repaired=True)
    cut_in_list = '{"status": "runtime_error", "notes": ["a", "b'
    assert parse_prediction(cut_in_list).status == "runtime_error"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no JSON object"),
        ("The script will crash.", "no JSON object"),
        ('{"status": "', "is not one of"),
        ('{"status": "exploded"}', "is not one of"),
        ('{"status": 3}', "must be a string"),
        ('{"outcome": "valid"}', "no 'status'"),
        ('{"status": "valid"}', "needs a numeric 'position'"),
        ('{"status": "valid", "position": "high"}', "not a number"),
        ('{"status": "valid", "position": 1.5}', "must be in [0, 1]"),
        ('{"status": "valid", "position": NaN}', "position"),
        ('{"status": "valid", "position": true}', "position"),
        (
            '<think>the answer is {"status": "valid", "position": 0.5}',
            "no JSON object",
        ),  # never stopped thinking
        ("{{{{ }", "no 'status'"),
        ('{"status": valid}', "malformed JSON"),
        ("[1, 2, 3]", "no JSON object"),
    ],
)
def test_failures_raise_with_a_reason(text, reason):
    with pytest.raises(PredictionParseError) as err:
        parse_prediction(text)
    assert reason in str(err.value)


def test_non_text_is_a_parse_error():
    with pytest.raises(PredictionParseError):
        parse_prediction(None)  # type: ignore[arg-type]


def test_candidate_objects_order():
    assert candidate_objects('a {"x": {"y": 1}} b {"z": 2}') == ['{"z": 2}', '{"x": {"y": 1}}', '{"y": 1}']
    assert candidate_objects("no braces") == []
    assert candidate_objects('{"s": "}"}') == ['{"s": "}"}']


# ---------------------------------------------------------------- properties

_prediction = st.builds(
    lambda status, pos, etype, line, out: {
        "status": status,
        "error_type": None if status == "valid" else etype,
        "error_line": None if status == "valid" else line,
        "position": pos if status == "valid" else None,
        "output": out,
    },
    st.sampled_from(WM_STATUSES),
    st.floats(0, 1),
    st.one_of(st.none(), st.from_regex(r"[A-Z][A-Za-z]{1,20}Error", fullmatch=True)),
    st.one_of(st.none(), st.integers(1, 10_000)),
    st.text(max_size=200),
)


@settings(max_examples=300, deadline=None)
@given(
    data=_prediction,
    before=st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=80),
    after=st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=80),
)
def test_any_valid_prediction_survives_noise_around_it(data, before, after):
    got = parse_prediction(f"{before}{json.dumps(data)}{after}")
    assert got.status == data["status"]
    assert got.position == data["position"]
    assert got.error_line == data["error_line"]
    assert got.error_type == (data["error_type"][:80] if data["error_type"] else None)
    assert got.output == data["output"]


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_either_parses_to_a_valid_prediction_or_raises_the_parse_error(text):
    try:
        got = parse_prediction(text)
    except PredictionParseError:
        return
    assert got.status in WM_STATUSES
    assert (got.position is not None) == (got.status == "valid")
    assert got.position is None or 0 <= got.position <= 1


@settings(max_examples=200, deadline=None)
@given(data=_prediction, cut=st.integers(min_value=1, max_value=400))
def test_any_truncation_never_crashes_and_keeps_what_it_reads(data, cut):
    text = json.dumps(data)[:cut]
    try:
        got = parse_prediction(text)
    except PredictionParseError:
        return
    assert got.status == data["status"]
