"""The surrogate world model and the fusion of several world models (core/surrogate.py)."""

import numpy as np
import pytest

from wmrl.core.rollouts import Group
from wmrl.core.sources import as_source
from wmrl.core.surrogate import FusedWorldModel, NearestNeighbours, SurrogateSource


def test_nearest_neighbours_average_within_the_radius_and_say_unknown_beyond():
    nn = NearestNeighbours(k=2, radius=1.0)
    assert np.isnan(nn.predict(np.zeros((1, 2)))).all()  # nothing learned: unknown, never 0
    nn.add(np.array([[0.0, 0.0], [0.5, 0.0], [10.0, 0.0]]), np.array([1.0, 0.0, 5.0]))
    out = nn.predict(np.array([[0.1, 0.0], [10.2, 0.0], [5.0, 5.0]]))
    assert out[0] == pytest.approx(0.5) and out[1] == pytest.approx(5.0) and np.isnan(out[2])
    with pytest.raises(ValueError, match="dimensions"):
        nn.add(np.zeros((1, 3)), np.zeros(1))


def test_the_surrogate_learns_a_solution_from_one_of_its_variants():
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (20, 8))
    truth = rng.random(20)
    surrogate = SurrogateSource(lambda item: centres[item[0]] + item[1], NearestNeighbours(k=1, radius=0.5))
    variant = lambda k: (k, rng.normal(0, 0.02, 8))  # noqa: E731
    seen = [variant(k) for k in range(10)]
    assert surrogate.score(seen) == [None] * 10
    surrogate.learn(seen, truth[:10].tolist())
    again = [variant(k) for k in range(20)]  # other variants of the same solutions, and new solutions
    scores = surrogate.score(again)
    assert scores[:10] == pytest.approx(truth[:10].tolist())
    assert scores[10:] == [None] * 10


def test_fusion_weights_each_world_model_by_its_measured_error():
    rng = np.random.default_rng(1)
    good = as_source(lambda items: [t + rng.normal(0, 0.05) for t in items], "world_model", "good")
    bad = as_source(lambda items: [2 * t + rng.normal(0, 0.5) for t in items], "world_model", "bad")
    fused = FusedWorldModel([bad, good], min_pairs=8)
    for _ in range(30):
        items = list(rng.random(16))
        fused.score(items)
        fused.learn(items, items)  # the truth is the item itself
    weights = fused.weights()
    assert weights[1] > 0.9  # the good one carries nearly all of the weight (its error is ~100x smaller)
    probe = [0.2, 0.8]
    assert fused.score(probe) == pytest.approx(probe, abs=0.1)  # calibrated: on the truth's scale


def test_the_pipeline_teaches_a_learning_world_model_what_execution_said():
    truth = {k: k / 10 for k in range(10)}
    surrogate = SurrogateSource(lambda item: np.array([float(item)]), NearestNeighbours(k=1, radius=0.1))
    world_model = FusedWorldModel([as_source(lambda items: [0.5] * len(items), "world_model"), surrogate])
    anchor = as_source(lambda items: [truth[i] for i in items], "anchor")
    from wmrl.core.pipeline import RewardPipeline

    pipe = RewardPipeline(world_model, anchor, solution_key=str)
    for step in range(3):
        pipe.step([Group(f"{step}:{g}", [g, g + 1, (g + 5) % 10, (g + 7) % 10]) for g in range(4)])
    assert len(surrogate.model) > 0  # it learned from the executed rollouts
