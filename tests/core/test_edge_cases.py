"""The core's edge cases of issue 11 §2, one test each (each failed on the code before the fix)."""

import math

import numpy as np
import pytest
from group_design import groups_config
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.isotonic import IsotonicRegression

from wmrl.core.advantages import AdvantageConfig, as_reward_matrix, group_advantages
from wmrl.core.config import ConfigError
from wmrl.core.corrector import Corrector, CorrectorConfig
from wmrl.core.debias import DebiasConfig, IsotonicMap, OnlineDebiaser, within_group_bias_reduction
from wmrl.core.fusion import FusionConfig
from wmrl.core.sources import Grade, SourceError, as_source, collect_grades


def _anchored(corrector, n=2, width=2):
    plan = corrector.plan([f"{corrector.step_count}:{i}" for i in range(n)])
    real = np.where(plan.anchor[:, None], np.full((n, width), 0.5), np.nan)
    return plan, real


# -- fusion inputs and config ---------------------------------------------------------------
def test_correct_rejects_a_negative_world_model_variance():
    c = Corrector(groups_config())
    plan, real = _anchored(c)
    with pytest.raises(ValueError, match="negative"):
        c.correct(plan, np.zeros((2, 2)), real, wm_variance=np.full((2, 2), -0.1))


def test_an_infinite_bias_horizon_is_refused_not_turned_into_nan():
    with pytest.raises(ConfigError, match="bias_horizon"):
        CorrectorConfig(fusion=FusionConfig(bias_horizon=math.inf))


# -- debiaser ---------------------------------------------------------------------------------
def test_recency_weights_that_underflow_leave_the_map_usable():
    d = OnlineDebiaser(DebiasConfig(min_pairs=2, half_life_steps=0.05))
    d.observe(0, np.array([0.1, 0.5, 0.9]), np.array([0.0, 0.5, 1.0]), np.arange(3))
    d.refit(60)  # every weight is 0.5**1200 == 0.0
    assert d.calibrate(np.array([0.5])).tolist() == [0.5]  # the identity: nothing to fit on


def test_one_positively_weighted_knot_does_not_make_a_constant_map():
    d = OnlineDebiaser(DebiasConfig(min_pairs=2, half_life_steps=0.05))
    d.observe(0, np.array([0.1, 0.9]), np.array([0.0, 1.0]), np.arange(2))
    d.observe(60, np.array([0.5, 0.5]), np.array([0.2, 0.4]), np.arange(2))
    d.refit(60)  # only the two pairs at x = 0.5 keep a weight: one knot
    assert not d.calibrated


def test_ties_are_pooled_as_scikit_learn_pools_them():
    x, y = np.array([0.3, 0.1 + 0.2, 0.0, 1.0]), np.array([0.0, 1.0, 0.0, 1.0])
    expected = IsotonicRegression(out_of_bounds="clip").fit(x, y).predict(x)
    np.testing.assert_allclose(IsotonicMap.fit(x, y)(x), expected)
    assert IsotonicMap.fit(x, y)(np.array([0.3]))[0] == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(
    base=st.lists(st.floats(0, 1), min_size=2, max_size=12),
    jitter=st.lists(st.integers(0, 3), min_size=12, max_size=12),
    y=st.lists(st.floats(0, 1), min_size=12, max_size=12),
    w=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=12, max_size=12),
)
def test_isotonic_fit_equals_scikit_learn_on_near_ties_and_zero_weights(base, jitter, y, w):
    m = len(base)
    x = np.array(base) + np.array(jitter[:m]) * 6e-16  # chains of values closer than sklearn's 1e-15
    yv, wv = np.array(y[:m]), np.array(w[:m])
    if not (wv > 0).any():
        return
    ref = IsotonicRegression(out_of_bounds="clip").fit(x, yv, sample_weight=wv)
    probe = np.linspace(-0.1, 1.1, 25)
    np.testing.assert_allclose(IsotonicMap.fit(x, yv, wv)(probe), ref.predict(probe), atol=1e-12)


def test_bias_reduction_does_not_depend_on_the_reward_scale():
    rng = np.random.default_rng(0)
    real = rng.random(16)
    raw = real**2
    cal = real + rng.normal(0, 0.01, 16)
    groups = np.arange(16) // 4
    ref = within_group_bias_reduction(raw, cal, real, groups)[0]
    scaled = within_group_bias_reduction(1e-7 * raw, 1e-7 * cal, 1e-7 * real, groups)[0]
    assert scaled is not None and scaled == pytest.approx(ref)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s | {"x": np.array([0.1, np.nan, 0.5])}, "non-finite"),
        (lambda s: s | {"x": np.array([0.5, 0.1, 0.9])}, "sorted"),
        (lambda s: s | {"y": np.array([0.1, 0.2])}, "one entry per pair"),
    ],
)
def test_debiaser_state_is_validated(change, message):
    d = OnlineDebiaser(DebiasConfig(min_pairs=2))
    d.observe(0, np.array([0.1, 0.5, 0.9]), np.array([0.0, 0.5, 1.0]), np.arange(3))
    d.refit(0)
    with pytest.raises(ValueError, match=message):
        OnlineDebiaser(DebiasConfig(min_pairs=2)).load_state_dict(change(d.state_dict()))


# -- input leniency ---------------------------------------------------------------------------
def test_the_split_api_refuses_text_scores():
    c = Corrector(groups_config())
    plan = c.plan(["a"])
    with pytest.raises(ValueError, match="real numbers"):
        c.correct(plan, [["0.5", "0.7"]], [[None, None]] if not plan.anchor[0] else [[0.5, 0.7]])
    with pytest.raises(ValueError, match="dtype"):
        as_reward_matrix(np.array([["0.5", "0.7"]]))
    with pytest.raises(ValueError, match="real numbers"):
        as_reward_matrix([[True, 0.5]])


@pytest.mark.parametrize(
    ("returned", "error"),
    [
        ([np.bool_(True), 0.5], "real numbers"),
        ([np.str_("0.5"), 0.5], "real numbers"),
        ({0.1: "a", 0.2: "b"}, "ordered sequence"),
        ([np.array([0.1, 0.2]), 0.5], "real numbers"),
    ],
)
def test_sources_returning_non_numbers_are_refused_with_a_source_error(returned, error):
    src = as_source(lambda items: returned, "world_model", "wm")
    with pytest.raises(SourceError, match=error):
        collect_grades(src, ["a", "b"])


def test_a_text_variance_is_a_source_error():
    src = as_source(lambda items: [Grade(0.5, variance="0.1")], "world_model", "wm")
    src.grade = lambda items: [Grade(0.5, variance="0.1")]
    with pytest.raises(SourceError, match="variance"):
        collect_grades(src, ["a"])


def test_correct_refuses_an_empty_plan_and_empty_groups():
    c = Corrector(groups_config())
    with pytest.raises(ValueError, match="at least one group"):
        c.plan([])
    plan = c.plan(["a"])
    with pytest.raises(ValueError, match="at least one rollout"):
        c.correct(plan, np.zeros((1, 0)), np.zeros((1, 0)))


def test_a_missing_task_is_not_a_task_called_none():
    c = Corrector(groups_config())
    with pytest.raises(ValueError, match="not a task called 'None'"):
        c.plan(["a", "b"], [None, "t1"])
    assert c.plan(["a", "b"], [None, None]).task_keys is None


def test_advantages_list_takes_an_array_of_sizes():
    c = Corrector(groups_config())
    plan, real = _anchored(c, n=2, width=3)
    out = c.correct(plan, np.array([[0.1, 0.5, 0.9], [0.2, 0.4, 0.8]]), real)
    rows = out.advantages_list(np.array([2, 3]))
    assert [len(r) for r in rows] == [2, 3]


# -- the std convention -------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(known=st.integers(2, 8), seed=st.integers(0, 10_000))
def test_mean_squared_advantage_per_known_rollout_is_one_whatever_the_count(known, seed):
    """Population std: a group with 3 known rewards pushes each rollout as hard as one with 8."""
    rng = np.random.default_rng(seed)
    rewards = np.full((1, 8), np.nan)
    rewards[0, :known] = rng.random(known)
    adv = group_advantages(rewards, config=AdvantageConfig(eps=0.0)).advantages
    assert np.nanmean(adv**2) == pytest.approx(1.0)
