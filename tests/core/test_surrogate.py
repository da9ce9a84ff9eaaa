"""The surrogate world model and the fusion of several world models (core/surrogate.py)."""

import json

import numpy as np
import pytest

from wmrl.core.rollouts import Group, RolloutNeeds
from wmrl.core.sources import Grade, as_source
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


class _Primary:
    """A world model that predicts more than a number: a status, feedback and a per-call variance."""

    name = "primary"
    role = "world_model"
    needs = RolloutNeeds(text=True, feedback=True)

    def __init__(self, scale: float = 1.0, variance: float | None = 0.01) -> None:
        self.scale, self.variance = scale, variance

    def score(self, items):
        return [g.value for g in self.grade(items)]

    def grade(self, items):
        return [
            Grade(self.scale * x, "valid", self.variance, {"reason": "modelled"}, f"feedback {x}")
            for x in items
        ]


def _trained(fused, rng, steps=20, truth=lambda x: x):
    for _ in range(steps):
        items = list(rng.random(8))
        fused.grade(items)
        fused.learn(items, [truth(x) for x in items])


def test_a_fused_grade_keeps_the_primary_status_information_and_feedback():
    fused = FusedWorldModel([_Primary(), as_source(lambda items: [0.3] * len(items), "world_model", "flat")])
    (before,) = fused.grade([0.4])
    # nothing measured yet: the primary as it is
    assert (before.value, before.status, before.variance, before.feedback) == (
        0.4,
        "valid",
        0.01,
        "feedback 0.4",
    )
    assert before.info["reason"] == "modelled" and before.info["scores"] == {"primary": 0.4, "flat": 0.3}
    assert fused.needs == RolloutNeeds(text=True, feedback=True)


def test_the_fused_variance_is_the_weighted_sum_of_the_sources_variances():
    rng = np.random.default_rng(2)
    # the primary at twice the truth's scale: calibrated with slope 1/2, so its variance counts a quarter
    primary = _Primary(scale=2.0, variance=0.04)
    fused = FusedWorldModel([primary], min_pairs=4)
    _trained(fused, rng)
    (grade,) = fused.grade([0.5])
    assert grade.value == pytest.approx(0.5)
    assert grade.variance == pytest.approx(0.25 * 0.04)
    unknown_variance = FusedWorldModel([_Primary(variance=None)], min_pairs=4)
    _trained(unknown_variance, rng)
    assert unknown_variance.grade([0.5])[0].variance is None  # unknown, not 0


def test_a_per_group_positive_affine_world_model_is_returned_on_the_truths_scale():
    rng = np.random.default_rng(3)
    affine = as_source(lambda items: [3.0 * x - 1.0 for x in items], "world_model", "affine")
    fused = FusedWorldModel([affine], min_pairs=4)
    _trained(fused, rng)
    probe = list(rng.random(5))
    assert fused.score(probe) == pytest.approx(probe)


def test_a_partitioned_surrogate_learns_only_from_its_own_partition():
    surrogate = SurrogateSource(
        lambda item: np.array([item[1]]), NearestNeighbours(k=1), partition=lambda item: item[0]
    )
    surrogate.learn([("a", 0.0), ("b", 0.0)], [1.0, 0.0])
    assert surrogate.score([("a", 0.1), ("b", 0.1), ("c", 0.1)]) == [1.0, 0.0, None]
    assert len(surrogate) == 2
    grades = surrogate.grade([("a", 0.1), ("c", 0.1)])
    assert (grades[0].variance, grades[1].variance) == (0.0, None)  # deterministic where it predicts


def test_state_round_trips_through_json():
    rng = np.random.default_rng(4)
    surrogate = SurrogateSource(
        lambda x: np.array([x, x * x]), NearestNeighbours(k=2, radius=0.5), partition=lambda x: x > 0.5
    )
    fused = FusedWorldModel([_Primary(), surrogate], min_pairs=4)
    _trained(fused, rng, truth=lambda x: x * x)
    state = json.loads(json.dumps(fused.state_dict()))
    twin_surrogate = SurrogateSource(
        lambda x: np.array([x, x * x]), NearestNeighbours(k=2, radius=0.5), partition=lambda x: x > 0.5
    )
    twin = FusedWorldModel([_Primary(), twin_surrogate], min_pairs=4)
    twin.load_state_dict(state)
    probe = list(rng.random(6))
    assert twin.score(probe) == pytest.approx(fused.score(probe))
    assert twin.weights() == pytest.approx(fused.weights())
    other = SurrogateSource(lambda x: np.array([x, x * x]), NearestNeighbours(k=3, radius=0.5))
    with pytest.raises(ValueError, match="same settings"):
        FusedWorldModel([_Primary(), other], min_pairs=4).load_state_dict(state)


def test_fusion_refuses_bad_settings():
    with pytest.raises(ValueError, match="min_pairs"):
        FusedWorldModel([_Primary()], min_pairs=1)
    with pytest.raises(ValueError, match="half_life"):
        FusedWorldModel([_Primary()], half_life=0)


def test_a_pipeline_checkpoint_keeps_what_the_world_model_learned(tmp_path):
    from wmrl.core.pipeline import WORLD_MODEL_FILE, RewardPipeline

    truth = {k: k / 10 for k in range(10)}

    def build():
        surrogate = SurrogateSource(lambda item: np.array([float(item)]), NearestNeighbours(k=1, radius=0.1))
        fused = FusedWorldModel([as_source(lambda items: [0.5] * len(items), "world_model"), surrogate])
        return RewardPipeline(fused, as_source(lambda items: [truth[i] for i in items], "anchor")), surrogate

    pipe, surrogate = build()
    for step in range(3):
        pipe.step([Group(f"{step}:{g}", [g, g + 1, (g + 5) % 10, (g + 7) % 10]) for g in range(4)])
    pipe.save(tmp_path)
    assert (tmp_path / WORLD_MODEL_FILE).exists()
    resumed, twin = build()
    resumed.load(tmp_path)
    assert len(twin) == len(surrogate) > 0
    assert twin.score(list(range(10))) == surrogate.score(list(range(10)))
    (tmp_path / WORLD_MODEL_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="learns from the run"):
        build()[0].load(tmp_path)


class _Box:
    """An item an engine rebuilds between scoring and execution (equal content, another object)."""

    def __init__(self, x: float) -> None:
        self.x = x


def test_a_content_key_measures_sources_on_items_rebuilt_between_scoring_and_learning():
    rng = np.random.default_rng(5)
    source = as_source(lambda items: [2 * b.x for b in items], "world_model", "doubled")
    by_object = FusedWorldModel([source], min_pairs=4)
    by_content = FusedWorldModel([source], min_pairs=4, item_key=lambda b: b.x)
    alive = []  # every box kept, so that no new box takes a freed one's id
    for _ in range(5):
        xs = list(rng.random(4))
        for fused in (by_object, by_content):
            scored, learned = [_Box(x) for x in xs], [_Box(x) for x in xs]  # new objects: the same solutions
            alive += scored + learned
            fused.grade(scored)
            fused.learn(learned, xs)
    assert by_object.weights() == [None]  # never matched: nothing measured
    assert by_content.weights() == [1.0]
    assert by_content.score([_Box(0.3)]) == pytest.approx([0.3])  # calibrated: slope 1/2


def test_a_calibrated_score_stays_within_the_outcomes_seen():
    # scores that barely vary: the fitted line is steep, and a score beyond theirs would be carried far
    rng = np.random.default_rng(6)
    flat = as_source(lambda items: [0.5 + 0.001 * x for x in items], "world_model", "flat")
    fused = FusedWorldModel([flat], min_pairs=4)
    _trained(fused, rng)  # outcomes x in [0, 1], scores 0.5 + 0.001 x
    (far,) = fused.score([300.0])  # a score 0.3 above any seen: the line says 300
    assert far == pytest.approx(max(fused._residuals[0].hi, 0.0)) and far <= 1.0
    (low,) = fused.score([-300.0])
    assert low == pytest.approx(fused._residuals[0].lo) and low >= 0.0
