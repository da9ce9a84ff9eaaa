"""``Scores``: every stream is an ``(n,)`` array, the repeated executions included."""

from __future__ import annotations

import numpy as np
import pytest

from wmrl.core.pipeline import Scores


def _scores(n: int, **kwargs) -> Scores:
    values = np.arange(n, dtype=float)
    return Scores(values, np.full(n, np.nan), values.copy(), [None] * n, [None] * n, **kwargs)


def test_repeats_left_out_are_all_unknown_and_every_operation_takes_them():
    a, b = _scores(3), _scores(2)
    assert a.real_repeat.shape == (3,) and np.isnan(a.real_repeat).all()
    assert a.real_repeat is not b.real_repeat  # each its own array: writing one does not write another
    a.real_repeat[0] = 1.0
    assert np.isnan(b.real_repeat).all()
    assert a.columns().shape == (3, 4)
    both = Scores.concat([a, b])
    assert (
        both.real_repeat.shape == (5,) and both.real_repeat[0] == 1.0 and np.isnan(both.real_repeat[1:]).all()
    )


def test_repeats_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match="real_repeat has 2 scores for 3 rollouts"):
        _scores(3, real_repeat=np.zeros(2))
