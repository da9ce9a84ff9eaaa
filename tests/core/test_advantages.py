"""Group advantages: closed-form values and invariances."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.core.advantages import AdvantageConfig, as_reward_matrix, group_advantages

# Rewards on a 1e-3 grid: the invariances are exact maths, and float rounding of differences far
# below the offset (1 + 1e-239 == 1) is not what they are about.
grid_rewards = st.lists(
    st.lists(st.one_of(st.none(), st.integers(-5000, 5000).map(lambda i: i / 1000)), min_size=1, max_size=8),
    min_size=1,
    max_size=6,
)
rewards_strategy = st.lists(
    st.lists(st.one_of(st.none(), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=8),
    min_size=1,
    max_size=6,
)


def test_closed_form_single_group():
    out = group_advantages(np.array([[0.0, 1.0, 2.0]]), config=AdvantageConfig(eps=0.0))
    std = np.std([0.0, 1.0, 2.0])
    np.testing.assert_allclose(out.advantages, [[-1 / std, 0.0, 1 / std]])


def test_centring_only_is_reward_minus_mean():
    out = group_advantages(np.array([[1.0, 3.0, np.nan, 5.0]]), config=AdvantageConfig(standardize=False))
    np.testing.assert_allclose(out.advantages, [[-2.0, 0.0, np.nan, 2.0]])


@settings(max_examples=200, deadline=None)
@given(grid_rewards, st.floats(-10, 10))
def test_zero_mean_per_group_and_shift_invariant(groups, shift):
    r = as_reward_matrix(groups)
    base = group_advantages(r)
    shifted = group_advantages(r + shift)
    for i in range(r.shape[0]):
        a = base.advantages[i]
        known = ~np.isnan(a)
        if base.contributes[i]:
            assert abs(a[known].sum()) < 1e-6
            # Unknown rewards never get an advantage.
            assert np.isnan(a[np.isnan(r[i])]).all()
        else:
            assert np.isnan(a).all()
    np.testing.assert_allclose(base.advantages, shifted.advantages, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(grid_rewards, st.floats(0.1, 10), st.floats(-3, 3))
def test_positive_affine_map_leaves_standardised_advantages_unchanged(groups, scale, offset):
    r = as_reward_matrix(groups)
    cfg = AdvantageConfig(eps=0.0)
    base = group_advantages(r, config=cfg)
    mapped = group_advantages(scale * r + offset, config=cfg)
    np.testing.assert_allclose(base.advantages, mapped.advantages, atol=1e-6)


def test_groups_with_fewer_than_two_graded_are_skipped():
    out = group_advantages([[1.0, None, None], [None, None, None], [0.0, 1.0, None]])
    assert out.contributes.tolist() == [False, False, True]
    assert np.isnan(out.advantages[:2]).all()


def test_degenerate_group_gets_exact_zeros():
    out = group_advantages([[0.5, 0.5, None]])
    assert out.degenerate.tolist() == [True]
    assert out.advantages[0, :2].tolist() == [0.0, 0.0]


def test_weights_apply_after_normalisation():
    r = np.array([[0.0, 1.0], [0.0, 10.0]])
    out = group_advantages(r, weights=np.array([1.0, 3.0]), config=AdvantageConfig(eps=0.0))
    # Both groups normalise to (-1, 1); the weight then scales the second group by 3.
    np.testing.assert_allclose(out.advantages, [[-1.0, 1.0], [-3.0, 3.0]])


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.array([[0.0, np.inf]]), "inf"),
        ([[]], "empty group"),
        (np.zeros(3), "2-D"),
    ],
)
def test_bad_rewards_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(bad)


def test_bad_weights_are_rejected():
    with pytest.raises(ValueError, match="shape"):
        group_advantages(np.zeros((2, 2)), weights=np.ones(3))
    with pytest.raises(ValueError, match="finite"):
        group_advantages(np.zeros((1, 2)), weights=np.array([np.nan]))
