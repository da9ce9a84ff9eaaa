"""The embodied reward sources against the core contract: sparse success (anchor) and Robometer (world model)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from wmrl.core.config import ConfigError
from wmrl.core.sources import Role, SourceError, check_pair, check_source, collect_grades
from wmrl.embodied.rollout.records import EpisodeRecord, EpisodeSpec
from wmrl.embodied.sources import (
    EpisodeLike,
    RobometerSource,
    RobometerSourceConfig,
    SparseSuccessSource,
    make_robometer_source,
)
from wmrl.embodied.worldmodel.backend import FramePredictions
from wmrl.embodied.worldmodel.frames import subsample_indices
from wmrl.embodied.worldmodel.scoring import ScoreConfig, episode_score

TASK = "put both the alphabet soup and the cream cheese box in the basket"


def _episode(success: bool, n_frames: int = 20, seed: int = 0, camera: str = "agentview") -> EpisodeRecord:
    rng = np.random.default_rng(seed)
    steps = max(n_frames - 1, 0)
    return EpisodeRecord(
        spec=EpisodeSpec(task_id=0, init_state=seed, seed=seed),
        instruction=TASK,
        success=success,
        steps=steps,
        terminated=success,
        truncated=not success,
        actions=np.zeros((steps, 7), np.float32),
        rewards=np.zeros(steps, np.float32),
        token_ids=None,
        log_probs=None,
        frames={camera: rng.integers(0, 256, (n_frames, 64, 64, 3), dtype=np.uint8)} if n_frames else {},
        frame_steps=np.arange(n_frames),
    )


class _Curves:
    """A backend that answers every trajectory with the same hand-made curves and records what it was sent."""

    name = "fixed-curves"

    def __init__(self, progress, success):
        self.progress = np.asarray(progress, float)
        self.success = np.asarray(success, float)
        self.seen = []

    def predict(self, trajectories):
        self.seen.append(trajectories)
        return [FramePredictions(progress=self.progress, success=self.success) for _ in trajectories]


class _Raises:
    name = "raises"

    def predict(self, trajectories):
        raise ConnectionError("Robometer server went away")


class _WrongLength:
    name = "wrong-length"

    def predict(self, trajectories):
        return []


# -- the anchor ------------------------------------------------------------------------------------
def test_sparse_success_is_the_simulators_flag():
    source = SparseSuccessSource()
    assert source.role == Role.ANCHOR
    episodes = [_episode(True), _episode(False), _episode(True)]
    assert check_source(source, episodes, role="anchor") == []
    grades = collect_grades(source, episodes)
    assert [g.value for g in grades] == [1.0, 0.0, 1.0]
    assert [g.status for g in grades] == ["success", "failure", "success"]
    assert grades[1].info["truncated"] is True


def test_sparse_success_without_a_flag_is_unknown():
    class NoFlag:
        def __init__(self) -> None:
            self.instruction, self.frames, self.success = TASK, {}, None

    grade = SparseSuccessSource().grade([NoFlag()])[0]
    assert (
        grade.value is None and grade.status == "missing_success" and "success flag" in grade.info["reason"]
    )


# -- the world model (real tiny Robometer) ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_source() -> RobometerSource:
    return make_robometer_source(RobometerSourceConfig(backend="tiny", batch_size=2))


@pytest.mark.transformers
def test_robometer_source_meets_the_contract(tiny_source):
    episodes = [_episode(True, seed=1), _episode(False, n_frames=5, seed=2), _episode(False, n_frames=0)]
    assert tiny_source.role == Role.WORLD_MODEL
    assert check_source(tiny_source, episodes, role="world_model") == []
    check_pair(tiny_source, SparseSuccessSource())
    with pytest.raises(SourceError, match="role"):
        check_pair(SparseSuccessSource(), tiny_source)


@pytest.mark.transformers
def test_robometer_score_is_the_score_of_the_subsampled_frames(tiny_source):
    episode = _episode(True, n_frames=30, seed=3)
    grade = tiny_source.grade([episode])[0]
    idx = subsample_indices(30, 8)
    pred = tiny_source.backend.predict([(episode.frames["agentview"][idx], TASK)])[0]
    assert grade.status == "scored"
    assert grade.value == pytest.approx(episode_score(pred.progress, pred.success, ScoreConfig()))
    assert grade.info["frame_indices"] == idx.tolist() and grade.info["frame_steps"] == idx.tolist()
    assert (
        len(grade.info["progress"]) == len(grade.info["success_prob"]) == len(grade.info["progress_std"]) == 8
    )
    assert grade.variance is None  # deterministic model: no per-call noise to report


@pytest.mark.transformers
def test_missing_frames_are_unknown_with_the_reason(tiny_source):
    grades = tiny_source.grade([_episode(True, n_frames=0), _episode(True, camera="robot0_eye_in_hand")])
    assert [g.value for g in grades] == [None, None]
    assert all(g.status == "no_frames" for g in grades)
    assert "record_frames" in grades[0].info["reason"] and "robot0_eye_in_hand" in grades[1].info["reason"]


# -- score modes through the source (a fixed-curve backend) -----------------------------------------
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("potential", (0.6 + 0.8 + 1.0) / 3 - (0.0 + 0.1 + 0.2) / 3),
        ("final", 1.0),
        ("max", 1.0),
        ("success", 0.9),
    ],
)
def test_source_applies_the_configured_mode(mode, expected):
    backend = _Curves([0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.8, 1.0], [0.0] * 7 + [0.9])
    source = RobometerSource(backend, score_config=ScoreConfig(mode=mode))
    assert source.score([_episode(True)]) == [pytest.approx(expected)]


def test_world_model_never_sees_the_success_flag():
    backend = _Curves([0.2] * 8, [0.5] * 8)
    source = RobometerSource(backend)
    a, b = _episode(True, seed=4), _episode(False, seed=4)
    assert source.score([a]) == source.score([b])
    frames, task = backend.seen[0][0]
    assert frames.shape == (8, 64, 64, 3) and task == TASK


# -- failures are unknown, never a default -----------------------------------------------------------
def test_a_broken_backend_gives_none_with_the_reason():
    grades = RobometerSource(_Raises()).grade([_episode(True), _episode(False, seed=1)])
    assert [g.value for g in grades] == [None, None]
    assert all(g.status == "backend_error" and "server went away" in g.info["reason"] for g in grades)
    grades = RobometerSource(_WrongLength()).grade([_episode(True)])
    assert grades[0].value is None and "0 predictions for 1" in grades[0].info["reason"]


def test_a_per_item_backend_failure_fails_only_that_episode():
    class OneFails(_Curves):
        def predict(self, trajectories):
            preds = super().predict(trajectories)
            return [FramePredictions.failed("decode error"), *preds[1:]]

    grades = RobometerSource(OneFails([0.1] * 8, [0.1] * 8)).grade([_episode(True), _episode(True, seed=1)])
    assert grades[0].value is None and grades[0].info["reason"] == "decode error"
    assert grades[1].value == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("progress", "success", "rule"),
    [
        ([], [], "empty"),
        ([0.1, float("nan")] * 4, [0.1] * 8, "non-finite"),
        ([0.5, 3.0] * 4, [0.1] * 8, r"\[0, 1\]"),
    ],
)
def test_invalid_curves_are_unknown(progress, success, rule):
    grade = RobometerSource(_Curves(progress, success)).grade([_episode(True)])[0]
    assert grade.value is None and grade.status == "invalid_output"
    assert re.search(rule, grade.info["reason"])


def test_an_unreachable_http_backend_is_unknown(unused_port):
    port = unused_port()  # nobody listens on it
    source = make_robometer_source(
        RobometerSourceConfig(backend="http", url=f"http://127.0.0.1:{port}", timeout_s=5)
    )
    grades = source.grade([_episode(True)])
    assert (
        grades[0].value is None
        and grades[0].status == "backend_error"
        and "unreachable" in grades[0].info["reason"]
    )
    assert check_source(source, [_episode(True)]) == []  # None is a valid answer under the contract


def test_episode_record_satisfies_the_protocol():
    assert isinstance(_episode(True), EpisodeLike)


def test_source_config_is_validated():
    with pytest.raises(ConfigError, match="model_path"):
        RobometerSourceConfig(backend="local")
    with pytest.raises(ConfigError, match="url"):
        RobometerSourceConfig(backend="http")
    with pytest.raises(ConfigError, match="mode"):
        RobometerSourceConfig(backend="tiny", mode="average")
    with pytest.raises(ConfigError, match="k"):
        RobometerSourceConfig(backend="tiny", k=0)
    with pytest.raises(TypeError, match="predict"):
        RobometerSource(object())  # type: ignore[arg-type]
    # it is a typed config: a training config can nest it and load it from TOML/JSON
    from wmrl.core.config import from_dict, to_dict

    config = RobometerSourceConfig(backend="http", url="http://gpu:8001", mode="final", k=2)
    assert from_dict(RobometerSourceConfig, to_dict(config)) == config
    with pytest.raises(ConfigError, match="unknown config key"):
        from_dict(RobometerSourceConfig, {"backend": "tiny", "frames": 8})


@pytest.mark.libero
@pytest.mark.slow
@pytest.mark.transformers
def test_both_sources_grade_real_libero_episodes_of_the_tiny_minivla(tiny_source):
    """End to end: the tiny MiniVLA acts in the real simulator, then both sources grade the records."""
    from wmrl.embodied.env import LiberoEnvConfig
    from wmrl.embodied.policy.minivla_policy import MiniVLAPolicy, MiniVLAPolicyConfig
    from wmrl.embodied.rollout import RolloutConfig, RolloutRunner, episode_seed

    env = LiberoEnvConfig(task_id=0, cameras=("agentview",), image_height=128, image_width=128, max_steps=6)
    policy = MiniVLAPolicy.tiny(seed=0, config=MiniVLAPolicyConfig(temperature=1.0))
    specs = [EpisodeSpec(0, s, episode_seed(0, 0, s, 0), 0, record_frames=True) for s in (0, 1)]
    with RolloutRunner(env, RolloutConfig(workers=0)) as runner:
        records = runner.run(policy, specs)
    anchor = collect_grades(SparseSuccessSource(), records)
    assert [g.value for g in anchor] == [float(r.success) for r in records]
    grades = collect_grades(tiny_source, records)
    for record, grade in zip(records, grades, strict=True):
        frames = record.frames["agentview"]
        assert frames.shape == (record.steps + 1, 128, 128, 3)
        assert grade.status == "scored" and -1.0 <= grade.value <= 1.0
        assert grade.info["frame_indices"] == subsample_indices(len(frames), 8).tolist()
        assert grade.info["frame_steps"] == record.frame_steps[grade.info["frame_indices"]].tolist()
