"""Evaluation maths (valid rate, avg@k, category means, overall = mean over categories) and the
held-out check (evaluated tasks disjoint from the training tasks, or a loud error)."""

from __future__ import annotations

import json

import pytest

from wmrl.autoresearch.evaluation.report import RolloutGrade, aggregate, task_report
from wmrl.autoresearch.evaluation.run import EvalError, check_disjoint, resolve_eval_tasks, training_tasks_of


def g(status, position=None, reward=None):
    return RolloutGrade(status, position, reward)


def test_task_report_by_hand():
    grades = [
        g("valid", 0.8, 0.9),
        g("valid", 0.4, 0.7),
        g("runtime_error", None, 0.1),
        g("harness_error"),  # unknown: in neither denominator
        g("malformed", None, 0.0),
    ]
    r = task_report("t", "binary", grades)
    assert (r.samples, r.graded) == (5, 4)
    assert r.valid_rate == 0.5
    assert r.avg_position == pytest.approx((0.8 + 0.4) / 4)  # invalid rollouts count 0
    assert r.avg_position == pytest.approx(r.valid_rate * r.mean_valid_position)
    assert r.mean_valid_position == pytest.approx(0.6)
    assert r.mean_reward == pytest.approx((0.9 + 0.7 + 0.1 + 0.0) / 4)
    assert r.statuses == {"valid": 2, "runtime_error": 1, "harness_error": 1, "malformed": 1}
    none_valid = task_report("u", "regression", [g("syntax_error", None, 0.0)] * 3)
    assert (
        none_valid.valid_rate == 0 and none_valid.avg_position == 0 and none_valid.mean_valid_position is None
    )
    unknown = task_report("v", "regression", [g("harness_error")] * 2)
    assert unknown.valid_rate is None and unknown.avg_position is None
    with pytest.raises(ValueError, match="position"):
        g("valid")
    with pytest.raises(ValueError, match="no rollouts"):
        task_report("w", "binary", [])


def test_overall_is_the_mean_over_categories_not_over_tasks():
    tasks = [
        task_report("b1", "binary", [g("valid", 1.0, 1.0)]),  # 1.0
        task_report("b2", "binary", [g("valid", 0.5, 0.75)]),  # 0.5
        task_report("b3", "binary", [g("valid", 0.0, 0.5)]),  # 0.0  -> binary mean 0.5
        task_report("r1", "regression", [g("valid", 0.9, 0.95), g("runtime_error", None, 0.1)]),  # 0.45
        task_report("r2", "regression", [g("valid", 0.2, 0.6), g("harness_error")]),  # 0.2: 1 graded
    ]
    report = aggregate(tasks, model="m", split="eval", samples=2)
    assert report.categories == {"binary": pytest.approx(0.5), "regression": pytest.approx((0.45 + 0.2) / 2)}
    assert report.overall == pytest.approx((0.5 + 0.325) / 2)
    assert report.overall_task_mean == pytest.approx((1.0 + 0.5 + 0.0 + 0.45 + 0.2) / 5)
    data = report.to_dict()
    assert "mean over categories" in data["averages"]
    json.dumps(data)  # serialisable
    assert "overall (mean over categories):  41.2 %" in report.format()


def test_a_seed_with_an_ungraded_task_has_unknown_headline_numbers():
    """Seed 1 graded nothing on b2 (harness failures only): its overall over the other tasks would be a
    number of another task set, so it is unknown, and the means over seeds are seed 0's and 2's."""

    def seed_rows(seed, b2):
        return [
            task_report("b1", "binary", [g("valid", 0.8, 0.9)], seed=seed),
            task_report("b2", "binary", b2, seed=seed),
            task_report("r1", "regression", [g("valid", 0.4, 0.7), g("syntax_error", None, 0.0)], seed=seed),
        ]

    rows = [
        *seed_rows(0, [g("valid", 0.6, 0.8)]),
        *seed_rows(1, [g("harness_error"), g("harness_error")]),
        *seed_rows(2, [g("runtime_error", None, 0.1)]),
    ]
    report = aggregate(rows, model="m", split="eval", samples=1)
    one = report.per_seed[1]
    assert one.ungraded_tasks == ["b2"]
    assert (one.overall, one.overall_task_mean, one.valid_rate, one.medal_rate) == (None, None, None, None)
    assert one.categories == {"regression": pytest.approx(0.2)}  # binary lacks b2: unknown
    overall = {0: (0.7 + 0.2) / 2, 2: (0.4 + 0.2) / 2}
    assert [s.overall for s in report.per_seed] == [
        pytest.approx(overall[0]),
        None,
        pytest.approx(overall[2]),
    ]
    assert report.overall == pytest.approx((overall[0] + overall[2]) / 2)
    assert report.valid_rate == pytest.approx(((1 + 1 + 0.5) / 3 + (1 + 0 + 0.5) / 3) / 2)
    assert report.categories["regression"] == pytest.approx(0.2)  # every seed knows it
    assert report.categories["binary"] == pytest.approx((0.7 + 0.4) / 2)
    assert "seed 1: no graded trajectory on b2" in report.format()
    json.dumps(report.to_dict())  # serialisable


def test_disjointness_check_fails_loudly(tmp_path):
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS, TRAIN_TASKS

    name, refs = resolve_eval_tasks("eval")
    assert name == "eval" and refs == list(EVAL_TASKS)
    check_disjoint(EVAL_TASKS, TRAIN_TASKS, "the bundled training split")  # the suite's split is disjoint
    with pytest.raises(EvalError, match=r"overlap.*wine-cultivar"):
        check_disjoint(["wine-cultivar", "taxi-tip"], TRAIN_TASKS, "x")
    # the training tasks of a run are read from its config.json
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"tasks": {"ids": ["taxi-tip"], "split": "train"}}))
    ids, source = training_tasks_of(run / "final")
    assert ids == ["taxi-tip"] and source.endswith("config.json")
    with pytest.raises(EvalError, match="taxi-tip"):
        check_disjoint(EVAL_TASKS, ids, source)
    # an explicit list wins
    assert training_tasks_of(run / "final", "wine-cultivar,penguin-body-mass")[0] == [
        "wine-cultivar",
        "penguin-body-mass",
    ]
    # no run config: the bundled training split
    assert training_tasks_of(tmp_path / "nowhere") == (list(TRAIN_TASKS), "the bundled training split")
    with pytest.raises(EvalError, match="no tasks"):
        resolve_eval_tasks(" , ")


def test_the_medal_share_is_unknown_not_zero_when_nothing_says_the_task_has_medals():
    """A task without a leaderboard awards no medals: its medal share is unknown (None), also for a
    seed in which nothing was valid; a task with one counts a seed without valid rollouts as 0."""
    failed = [g("runtime_error", None, 0.1)] * 2
    assert task_report("gap", "regression", failed).medal_rate is None  # cannot tell: unknown
    assert task_report("gap", "regression", failed, has_medals=False).medal_rate is None
    assert task_report("board", "regression", failed, has_medals=True).medal_rate == 0.0
    won = [RolloutGrade("valid", 0.9, 0.9, medal="gold"), RolloutGrade("valid", 0.5, 0.6, medal="none")]
    board = task_report("board", "binary", [*won, *failed], has_medals=True)
    assert board.medal_rate == pytest.approx(1 / 4) and board.above_median_rate == pytest.approx(1 / 4)
    # without has_medals, valid grades with medal values say the task has thresholds
    assert task_report("board", "binary", won).medal_rate == pytest.approx(1 / 2)
    no_thresholds = [RolloutGrade("valid", 0.7, 0.8)]
    assert task_report("gap", "binary", no_thresholds).medal_rate is None


def test_a_task_named_twice_is_refused_not_counted_twice():
    from wmrl.autoresearch.evaluation.run import evaluate_policy
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS

    with pytest.raises(EvalError, match="more than once"):  # refused before any model loads
        evaluate_policy("no-such-model", tasks=[EVAL_TASKS[0], EVAL_TASKS[1], EVAL_TASKS[0]])


def test_a_training_task_that_needs_its_data_folder_is_compared_by_its_id(tmp_path, monkeypatch):
    """An MLE-bench competition loads only with its data folder: the run's own ``tasks.data_dir``
    (or the evaluation's) loads it, so it is compared by id and the overlap is caught."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_tasks_loaders import _mlebench

    monkeypatch.delenv("MLEBENCH_DATA_DIR", raising=False)
    comp, data = _mlebench(tmp_path)
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"tasks": {"ids": [str(comp)], "data_dir": str(data)}}))
    ids, _ = training_tasks_of(run / "final")
    assert ids == ["spaceship-lite"]
    with pytest.raises(EvalError, match="spaceship-lite"):
        check_disjoint(["spaceship-lite"], ids, "the run")
    # --train-tasks with the evaluation's data folder
    assert training_tasks_of(run / "final", [str(comp)], data_dir=data)[0] == ["spaceship-lite"]


@pytest.mark.parametrize(
    ("override", "match"),
    [("sandbox.pool=ray", "a Ray pool is a training setting"), ("sandbox.cache=false", "result cache")],
)
def test_sandbox_settings_the_evaluation_cannot_honour_are_refused(override, match):
    from wmrl.autoresearch.evaluation.config import EvalConfig
    from wmrl.core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=match):
        # sandbox.ray.slots = workers: a Ray section the training config itself accepts
        load_config(
            EvalConfig, None, ["model=smollm2", override, "sandbox.backend=bwrap", "sandbox.ray.slots=2"]
        )
    assert load_config(EvalConfig, None, ["model=smollm2"]).sandbox.pool == "local"


def test_greedy_decoding_with_several_draws_is_refused():
    """temperature=0 repeats one reply: several samples or seeds would report a spread of copies."""
    from wmrl.autoresearch.evaluation.config import EvalConfig
    from wmrl.core.config import ConfigError, load_config

    for extra in (["samples=2", "seeds=[0]"], ["samples=1", "seeds=[0,1,2]"]):
        with pytest.raises(ConfigError, match="greedy"):
            load_config(EvalConfig, None, ["model=smollm2", "temperature=0", *extra])
    assert (
        load_config(EvalConfig, None, ["model=smollm2", "temperature=0", "samples=1", "seeds=[0]"]).samples
        == 1
    )
