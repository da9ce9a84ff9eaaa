"""Action tokens, un-normalisation and the LIBERO gripper convention, against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.embodied.policy.action_tokenizer import ActionNormalizer, ActionTokenizer, gripper_to_libero
from wmrl.embodied.policy.tiny import tiny_dataset_statistics, tiny_tokenizer

QWEN25_EXTRA_LEN = 151665 + 256  # len(Qwen2.5 tokenizer) + Prismatic's 256 <|extra_i|> tokens


def test_bins_edges_and_centres():
    tok = ActionTokenizer(vocab_len=QWEN25_EXTRA_LEN)
    assert tok.bins.shape == (256,) and tok.bins[0] == -1 and tok.bins[-1] == 1
    assert tok.bin_centers.shape == (255,)
    np.testing.assert_allclose(np.diff(tok.bin_centers), 2 / 255)
    np.testing.assert_allclose(tok.bin_centers[0], -1 + 1 / 255)


def test_qwen_action_ids_are_exactly_the_extra_tokens():
    tok = ActionTokenizer(vocab_len=QWEN25_EXTRA_LEN)
    assert tok.token_range == (151665, 151920)
    assert tok.encode(np.array([1.0]))[0] == 151665  # digitize(1) = 256 -> <|extra_0|>
    assert tok.encode(np.array([-1.0]))[0] == 151920  # digitize(-1) = 1 -> <|extra_255|>
    ids = tok.encode(np.linspace(-1, 1, 10_001))
    assert ids.min() == 151665 and ids.max() == 151920


def test_clipping_out_of_range_actions_and_ids():
    tok = ActionTokenizer(vocab_len=515)
    np.testing.assert_array_equal(tok.encode(np.array([-7.0, 3.0])), tok.encode(np.array([-1.0, 1.0])))
    # Ids below the range (non-action tokens) decode to the top bin, above it to the bottom bin, as OpenVLA.
    np.testing.assert_allclose(tok.decode(np.array([0, 514, 515 + 9])), tok.bin_centers[[254, 0, 0]])


def test_bin_centres_round_trip_exactly():
    tok = ActionTokenizer(vocab_len=515)
    np.testing.assert_array_equal(tok.decode(tok.encode(tok.bin_centers)), tok.bin_centers)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=7, max_size=7))
def test_round_trip_error_is_at_most_one_bin(values):
    tok = ActionTokenizer(vocab_len=QWEN25_EXTRA_LEN)
    a = np.array(values)
    err = np.abs(tok.decode(tok.encode(a)) - a)
    assert np.all(err <= 2 / 255 + 1e-12)


def test_tiny_tokenizer_maps_bins_onto_its_extra_tokens():
    tok = tiny_tokenizer()
    at = ActionTokenizer(vocab_len=len(tok))
    first, last = at.token_range
    assert tok.convert_ids_to_tokens([first, last]) == ["<|extra_0|>", "<|extra_255|>"]


def test_unnormalize_closed_form_and_mask():
    norm = ActionNormalizer(q01=(-2.0, 0.0, 0.0), q99=(2.0, 10.0, 1.0), mask=(True, True, False))
    x = np.array([[-1.0, 0.0, 0.3], [1.0, 0.5, -0.7], [0.0, -1.0, 0.9]])
    expected = np.stack([2 * x[:, 0], 5 * (x[:, 1] + 1), x[:, 2]], axis=1)
    np.testing.assert_allclose(norm.unnormalize(x), expected)
    np.testing.assert_allclose(norm.unnormalize(norm.normalize(expected)), expected)
    with pytest.raises(ValueError, match="last dim 3"):
        norm.unnormalize(np.zeros(7))


def test_statistics_selection_rules():
    stats = tiny_dataset_statistics("libero_10_no_noops")
    # openvla-mini's eval falls back from "libero_10" to "libero_10_no_noops".
    assert ActionNormalizer.from_statistics(stats, "libero_10").mask[-1] is False
    both = {**stats, **tiny_dataset_statistics("libero_90")}
    with pytest.raises(ValueError, match="choose one"):
        ActionNormalizer.from_statistics(both)
    with pytest.raises(KeyError, match="bridge"):
        ActionNormalizer.from_statistics(both, "bridge")
    with pytest.raises(ValueError, match="same non-zero length"):
        ActionNormalizer(q01=(0.0,), q99=(1.0, 2.0), mask=(True,))


def _openvla_mini_reference(action: np.ndarray) -> np.ndarray:
    # experiments/robot/robot_utils.py: normalize_gripper_action(binarize=True) then invert_gripper_action.
    a = action.copy()
    a[..., -1] = 2 * (a[..., -1] - 0.0) / (1.0 - 0.0) - 1
    a[..., -1] = np.sign(a[..., -1])
    a[..., -1] = a[..., -1] * -1.0
    return a


def test_gripper_conversion_matches_openvla_mini_and_sign_convention():
    tok = ActionTokenizer(vocab_len=515)
    g = tok.bin_centers  # every value the tokenizer can produce
    actions = np.zeros((len(g), 7))
    actions[:, -1] = g
    out = gripper_to_libero(actions)
    np.testing.assert_array_equal(out, _openvla_mini_reference(actions))
    assert set(np.unique(out[:, -1])) == {-1.0, 1.0}  # no bin centre is exactly 0.5
    # Data convention 0 = close, 1 = open  ->  LIBERO -1 = open, +1 = close.
    assert gripper_to_libero(np.array([0, 0, 0, 0, 0, 0, 1.0]))[-1] == -1.0
    assert gripper_to_libero(np.array([0, 0, 0, 0, 0, 0, 0.0]))[-1] == 1.0
    np.testing.assert_array_equal(actions[:, -1], g)  # input untouched
