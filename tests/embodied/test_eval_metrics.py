"""Avg / Best@k / All@k on hand-made episode tables, by split and by task, and their edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.embodied.eval.metrics import EpisodeOutcome, metrics_by_split, per_task_metrics, summarize


def _table(cells: dict[tuple[int, int], list[bool]]) -> list[EpisodeOutcome]:
    return [EpisodeOutcome(t, s, r, ok) for (t, s), runs in cells.items() for r, ok in enumerate(runs)]


T, F = True, False

# Two tasks, k = 2; states 0, 1, 3 are in-domain, state 20 is held-out.
TABLE = _table(
    {
        (0, 0): [T, F],  # some success
        (0, 1): [T, T],  # all succeed
        (0, 20): [F, F],  # none
        (1, 3): [F, T],  # some success
    }
)


def test_hand_table_overall():
    m = summarize(TABLE)
    assert (m.n_tasks, m.n_states, m.n_episodes, m.k) == (2, 4, 8, 2)
    assert m.avg == pytest.approx(4 / 8)
    assert m.best_at_k == pytest.approx(3 / 4)
    assert m.all_at_k == pytest.approx(1 / 4)


def test_hand_table_by_split():
    by = metrics_by_split(TABLE)
    ind, held = by["in_domain"], by["held_out"]
    assert (ind.n_states, ind.n_episodes) == (3, 6)
    assert ind.avg == pytest.approx(4 / 6)
    assert ind.best_at_k == pytest.approx(1.0)
    assert ind.all_at_k == pytest.approx(1 / 3)
    assert (held.n_states, held.avg, held.best_at_k, held.all_at_k) == (1, 0.0, 0.0, 0.0)
    assert by["all"] == summarize(TABLE, "all")


def test_hand_table_per_task():
    per = per_task_metrics(TABLE)
    assert sorted(per) == [0, 1]
    t0 = per[0]["all"]
    assert (t0.n_states, t0.avg, t0.best_at_k, t0.all_at_k) == (3, 3 / 6, 2 / 3, 1 / 3)
    t1 = per[1]
    assert (t1["all"].avg, t1["all"].best_at_k, t1["all"].all_at_k) == (0.5, 1.0, 0.0)
    # Task 1 has no held-out state: its held-out metrics are unknown, not zero.
    assert t1["held_out"].n_states == 0
    assert t1["held_out"].avg is None and t1["held_out"].best_at_k is None and t1["held_out"].k is None


def test_k_equal_one_makes_the_three_metrics_equal():
    table = _table({(0, s): [s % 3 == 0] for s in range(50)})
    m = summarize(table)
    assert m.k == 1
    assert m.avg == m.best_at_k == m.all_at_k == pytest.approx(17 / 50)


def test_overall_is_the_paper_weighting_of_the_splits():
    rng = np.random.default_rng(0)
    table = _table({(t, s): list(rng.random(8) < 0.4) for t in range(10) for s in range(50)})
    table = [EpisodeOutcome(o.task_id, o.init_state, o.rollout, bool(o.success)) for o in table]
    by = metrics_by_split(table)
    assert by["all"].avg == pytest.approx(0.32 * by["in_domain"].avg + 0.68 * by["held_out"].avg)


@pytest.mark.parametrize(
    ("outcomes", "message"),
    [
        ([], "no episode outcomes"),
        ([EpisodeOutcome(0, 0, 0, True), EpisodeOutcome(0, 0, 0, False)], "duplicate outcome"),
        (
            [EpisodeOutcome(0, 0, 0, True), EpisodeOutcome(0, 0, 1, True), EpisodeOutcome(0, 1, 0, True)],
            "same number of rollouts",
        ),
        ([EpisodeOutcome(0, 0, 0, True), EpisodeOutcome(0, 0, 2, True)], "must be 0..1"),
        ([EpisodeOutcome(0, 0, 0, None)], "success must be a bool"),
        ([EpisodeOutcome(0, 0, 0, 1)], "success must be a bool"),
    ],
)
def test_invalid_tables_are_rejected(outcomes, message):
    with pytest.raises(ValueError, match=message):
        summarize(outcomes)


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError, match="split must be one of"):
        summarize(TABLE, "ood")


@settings(max_examples=100, deadline=None)
@given(
    k=st.integers(1, 6),
    n_states=st.integers(1, 30),
    data=st.data(),
)
def test_metrics_against_numpy_on_random_tables(k, n_states, data):
    states = data.draw(st.lists(st.integers(0, 49), min_size=n_states, max_size=n_states, unique=True))
    grid = np.array(data.draw(st.lists(st.booleans(), min_size=n_states * k, max_size=n_states * k))).reshape(
        n_states, k
    )
    table = [EpisodeOutcome(0, s, r, bool(grid[i, r])) for i, s in enumerate(states) for r in range(k)]
    m = summarize(table)
    assert m.avg == pytest.approx(grid.mean())
    assert m.best_at_k == pytest.approx(grid.any(axis=1).mean())
    assert m.all_at_k == pytest.approx(grid.all(axis=1).mean())
    assert m.all_at_k <= m.avg + 1e-12 <= m.best_at_k + 2e-12
    ind = np.array([s < 16 for s in states])
    by = metrics_by_split(table)
    if ind.any():
        assert by["in_domain"].avg == pytest.approx(grid[ind].mean())
        assert by["in_domain"].best_at_k == pytest.approx(grid[ind].any(axis=1).mean())
    else:
        assert by["in_domain"].avg is None
    if (~ind).any():
        assert by["held_out"].all_at_k == pytest.approx(grid[~ind].all(axis=1).mean())
    else:
        assert by["held_out"].all_at_k is None
