"""The reward-source contract: wrapper, checker, pair validation, strict score collection."""

import math

import pytest

from wmrl.core.sources import Grade, Role, SourceError, as_source, check_pair, check_source, collect_grades


def test_one_line_wrapper():
    src = as_source(lambda items: [len(x) / 10 for x in items], role="world_model", name="len")
    assert src.role is Role.WORLD_MODEL and src.name == "len"
    assert [g.value for g in collect_grades(src, ["ab", "abcd"])] == [0.2, 0.4]


def test_none_means_unknown_and_survives():
    src = as_source(lambda items: [None, 1.0], "anchor", "real")
    assert [g.value for g in collect_grades(src, [1, 2])] == [None, 1.0]


@pytest.mark.parametrize(
    "reply, match",
    [
        ([1.0], "1 scores for 2 items"),
        ([1.0, math.nan], "non-finite"),
        ([1.0, math.inf], "non-finite"),
        ([1.0, "x"], "real numbers"),
        ([True, 1.0], "real numbers"),
        (None, "sequence"),
    ],
)
def test_contract_violations_are_named(reply, match):
    src = as_source(lambda items: reply, "world_model", "bad")
    with pytest.raises(SourceError, match=match):
        collect_grades(src, [1, 2])


def test_grade_method_carries_status_and_variance():
    class Rich:
        name, role = "rich", Role.WORLD_MODEL

        def score(self, items):
            return [0.5 for _ in items]

        def grade(self, items):
            return [Grade(0.5, status="valid", variance=0.01, info={"n": 4}) for _ in items]

    grades = collect_grades(Rich(), [1])
    assert grades[0].status == "valid" and grades[0].variance == 0.01

    class NegativeVariance(Rich):
        def grade(self, items):
            return [Grade(0.5, variance=-1.0) for _ in items]

    with pytest.raises(SourceError, match="variance"):
        collect_grades(NegativeVariance(), [1])


def test_checker_reports_what_is_wrong():
    class NoRole:
        name = "x"

        def score(self, items):
            return [0.0 for _ in items]

    problems = check_source(NoRole())
    assert any("role" in p for p in problems)
    assert check_source(object()) and any("score" in p for p in check_source(object()))
    good = as_source(lambda items: [0.0] * len(items), "anchor", "ok")
    assert check_source(good, sample_items=[1, 2]) == []
    crashing = as_source(lambda items: 1 / 0, "anchor", "boom")
    assert any("ZeroDivisionError" in p for p in check_source(crashing, sample_items=[1]))


def test_swapped_pair_is_rejected():
    wm = as_source(lambda items: [0.0] * len(items), "world_model", "wm")
    real = as_source(lambda items: [0.0] * len(items), "anchor", "real")
    check_pair(wm, real)
    with pytest.raises(SourceError, match="used as"):
        check_pair(real, wm)
    with pytest.raises(SourceError, match="same object"):
        check_pair(wm, wm)


def test_bad_role_and_name():
    with pytest.raises(ValueError, match="role must be one of"):
        as_source(lambda items: [], "oracle")
    with pytest.raises(ValueError, match="name"):
        as_source(lambda items: [], "anchor", name="")
