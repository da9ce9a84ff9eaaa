"""Action parsing: plan + one fenced script; closed/unclosed, python/generic fences; malformed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.autoresearch.agent.actions import FENCE_KINDS, parse_action

F = "```"


@pytest.mark.parametrize(
    ("text", "code", "fence", "plan"),
    [
        (
            f"Plan: fit a model.\n{F}python\nimport os\nprint(1)\n{F}\nDone.",
            "import os\nprint(1)",
            "closed_python",
            "Plan: fit a model.",
        ),
        (f"{F}py\nx = 1\n{F}", "x = 1", "closed_python", ""),
        (f"{F}Python3 title='s'\nx = 1\n{F}", "x = 1", "closed_python", ""),
        (f"{F}\nx = 1\n{F}", "x = 1", "closed_generic", ""),
        (f"Plan\n{F}python\nimport os\nprint(", "import os\nprint(", "unclosed_python", "Plan"),
        (f"{F}\ny = 2", "y = 2", "unclosed_generic", ""),
        # a closed python block beats a closed generic one, whatever the order
        (f"{F}\nA = 1\n{F}\n{F}python\nB = 2\n{F}", "B = 2", "closed_python", f"{F}\nA = 1\n{F}"),
        # closed generic beats unclosed python
        (f"{F}\nA = 1\n{F}\n{F}python\nB = 2", "A = 1", "closed_generic", ""),
        # other languages never count; the python block after them does
        (
            f"{F}bash\npip install x\n{F}\n{F}python\nprint(2)\n{F}",
            "print(2)",
            "closed_python",
            f"{F}bash\npip install x\n{F}",
        ),
        # the longest of several python blocks is the script
        (
            f"{F}python\nx = 1\n{F}\nthen\n{F}python\nimport os\nx = 1\nprint(x)\n{F}",
            "import os\nx = 1\nprint(x)",
            "closed_python",
            f"{F}python\nx = 1\n{F}\nthen",
        ),
        # a fence glued after prose and a closing fence glued to the last code line (small models do this)
        (f"Here is the code: {F}python\nprint(1){F}", "print(1)", "closed_python", "Here is the code:"),
        # a longer fence is closed only by as many ticks: inner ``` lines are code
        (f"````python\ns = '''\n{F}\n'''\n````", f"s = '''\n{F}\n'''", "closed_python", ""),
        # backticks inside a string literal do not close the block
        (f'{F}python\nprint("{F}")\nz = 3\n{F}', f'print("{F}")\nz = 3', "closed_python", ""),
        # CRLF line endings, leading blank lines, trailing spaces, indentation kept
        (
            f"{F}python\r\n\r\n  if True:\r\n    pass   \r\n{F}\r\n",
            "  if True:\n    pass",
            "closed_python",
            "",
        ),
        # an empty python block is skipped in favour of a generic one with code
        (f"{F}python\n\n{F}\n{F}\ny = 2\n{F}", "y = 2", "closed_generic", f"{F}python\n\n{F}"),
    ],
)
def test_code_is_found(text, code, fence, plan):
    action = parse_action(text)
    assert action.kind == "code" and not action.malformed
    assert action.code == code
    assert action.fence == fence
    assert action.plan == plan
    assert action.reason is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I would train a random forest.", "no code block"),
        ("import pandas as pd\nprint(pd.__version__)", "no code block"),  # bare code is not the format
        ("", "no code block"),
        (f"{F}bash\nls\n{F}", "another language"),
        (f"{F}python\n   \n{F}", "empty"),
        (f"{F}json\n{{}}\n{F}\n{F}python\n{F}", "empty"),
        ("inline `code` only", "no code block"),
    ],
)
def test_malformed_replies(text, reason):
    action = parse_action(text)
    assert action.malformed and action.kind == "malformed"
    assert action.code is None and action.fence is None
    assert reason in action.reason
    assert action.plan == text.strip()


def test_non_string_is_a_type_error():
    with pytest.raises(TypeError, match="string"):
        parse_action(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------- properties

_plain = st.text(
    alphabet=st.characters(blacklist_characters="`\r", blacklist_categories=("Cs",)), max_size=200
)
_code_line = st.text(
    alphabet=st.characters(blacklist_characters="`\r\n", blacklist_categories=("Cs",)), max_size=40
)
_code = st.lists(_code_line, min_size=1, max_size=12).map("\n".join).filter(lambda c: c.strip() != "")


def _expected(code: str) -> str:
    lines = code.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines).rstrip()


@settings(max_examples=300, deadline=None)
@given(plan=_plain, code=_code, after=_plain, tag=st.sampled_from(["python", "py", "PYTHON", ""]))
def test_closed_block_round_trip(plan, code, after, tag):
    action = parse_action(f"{plan}\n{F}{tag}\n{code}\n{F}\n{after}")
    assert action.code == _expected(code)
    assert action.fence == ("closed_python" if tag else "closed_generic")
    assert action.plan == plan.strip()


@settings(max_examples=300, deadline=None)
@given(plan=_plain, code=_code, tag=st.sampled_from(["python", ""]))
def test_unclosed_block_runs_to_the_end(plan, code, tag):
    action = parse_action(f"{plan}\n{F}{tag}\n{code}")
    assert action.code == _expected(code)
    assert action.fence == ("unclosed_python" if tag else "unclosed_generic")


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=400))
def test_never_raises_and_is_consistent(text):
    action = parse_action(text)
    assert action.kind in ("code", "malformed")
    if action.kind == "code":
        assert action.code and action.code.strip() and action.fence in FENCE_KINDS
        assert action.code == action.code.rstrip()
    else:
        assert action.code is None and action.reason


@settings(max_examples=300, deadline=None)
@given(text=_plain)
def test_text_without_fences_is_malformed(text):
    assert parse_action(text).malformed


@settings(max_examples=200, deadline=None)
@given(first=_code, second=_code)
def test_python_beats_generic_regardless_of_order(first, second):
    for text in (
        f"{F}\n{first}\n{F}\n{F}python\n{second}\n{F}",
        f"{F}python\n{second}\n{F}\n{F}\n{first}\n{F}",
    ):
        action = parse_action(text)
        assert action.fence == "closed_python" and action.code == _expected(second)
