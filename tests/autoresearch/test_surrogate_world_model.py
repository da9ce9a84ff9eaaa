"""A world model learned from the run beside the language model (``world_model.surrogate``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wmrl.autoresearch.worldmodel.surrogate import SurrogateConfig, code_features

HEAD = "import os\nimport pandas as pd\nd = os.environ['DATA_DIR']\ntrain = pd.read_csv(d + '/train.csv')\n"


def _script(block: str) -> str:
    return f"{HEAD}{block}\nmodel.fit(train.drop(columns=['y']), train['y'])\n"


def test_the_embedding_ignores_what_cannot_change_a_run_and_puts_variants_close():
    forest = _script(
        "from sklearn.ensemble import RandomForestRegressor\nmodel = RandomForestRegressor(max_depth=4)"
    )
    restyled = forest.replace("max_depth=4)", "max_depth = 4)  # shallow").replace("'", '"')
    deeper = forest.replace("max_depth=4", "max_depth=6")
    linear = _script("from sklearn.linear_model import Ridge\nmodel = Ridge(alpha=0.05)")
    vectors = {
        name: code_features(code)
        for name, code in [("f", forest), ("r", restyled), ("d", deeper), ("l", linear)]
    }
    assert vectors["f"].shape == (1024,) and np.linalg.norm(vectors["f"]) == pytest.approx(1.0)
    assert np.array_equal(vectors["f"], vectors["r"])  # comments, spacing, quotes: the same tree
    dist = lambda a, b: float(np.linalg.norm(vectors[a] - vectors[b]))  # noqa: E731
    assert 0 < dist("f", "d") < dist("f", "l")
    assert not code_features("(\n  \n").any()  # a broken script without a token: zeros, never NaN
    assert code_features(forest, dimensions=64, ngrams=1).shape == (64,)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("k", 0),
        ("dimensions", 4),
        ("ngrams", 0),
        ("max_points", 0),
        ("min_pairs", 1),
        ("radius", 0.0),
        ("enabled", 1),
    ],
)
def test_bad_surrogate_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=f"world_model.surrogate.{field}"):
        SurrogateConfig(**{field: value})


def test_the_surrogate_is_refused_in_modes_with_nothing_to_learn_from_or_to_grade_beside():
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.autoresearch.worldmodel import WorldModelConfig
    from wmrl.core.config import ConfigError

    section = WorldModelConfig(surrogate=SurrogateConfig(enabled=True))
    assert TrainConfig(mode="wmrl", world_model=section).world_model.surrogate.enabled
    with pytest.raises(ConfigError, match="no real execution to learn from"):
        TrainConfig(mode="world_model", world_model=section)
    with pytest.raises(ConfigError, match="no world model"):
        TrainConfig(mode="real", world_model=section)


@pytest.mark.trl
def test_the_fused_world_model_keeps_the_language_models_feedback_and_learns_variants(tmp_path):
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.tasks import Solution, load_task
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig
    from wmrl.autoresearch.worldmodel.surrogate import with_surrogate

    loaded = load_model(str(save_tiny_model(tmp_path / "tiny")))
    backend = TransformersBackend(loaded.model, loaded.tokenizer, model_id="tiny")
    language_model = WorldModel(
        backend, WorldModelConfig(overview_tokens=1500), task_resolver=load_task, tokens=loaded.tokenizer
    )
    fused = with_surrogate(language_model, SurrogateConfig(k=1, radius=0.5, min_pairs=4))
    assert fused.needs.feedback and fused.needs.text and fused.name == "world_model"
    make_toy_task(tmp_path, "toy-regression")
    make_toy_task(tmp_path, "toy-binary", kind="binary")
    tasks = [str(tmp_path / "toy-regression"), str(tmp_path / "toy-binary")]

    def depth(d):
        return _script(
            f"from sklearn.tree import DecisionTreeRegressor\nmodel = DecisionTreeRegressor(max_depth={d})"
        )

    executed = [Solution(tasks[0], depth(d)) for d in (2, 3, 4, 5)] + [Solution(tasks[0], "def broken(:")]
    grades = fused.grade(executed)
    alone = language_model.grade(executed)
    for fused_grade, own in zip(
        grades, alone, strict=True
    ):  # nothing measured yet: the language model's grade
        assert (fused_grade.value, fused_grade.status, fused_grade.feedback) == (
            own.value,
            own.status,
            own.feedback,
        )
        assert fused_grade.info["scores"]["surrogate"] is None  # nothing learned: unknown
    assert grades[-1].status == "syntax_error" and grades[-1].feedback is not None
    fused.learn(executed, [0.2, 0.4, 0.6, 0.8, 0.0])
    # a variant of an executed script, on the same task: the surrogate predicts its nearest neighbour's outcome
    variant = Solution(tasks[0], depth(5) + "# a comment\n")
    other_task = Solution(tasks[1], depth(5))
    scores = {g.info["scores"]["surrogate"] for g in fused.grade([variant])}
    assert scores == {0.8}
    assert fused.grade([other_task])[0].info["scores"]["surrogate"] is None  # tasks do not share outcomes
    metrics = fused.metrics()
    assert metrics["world_model/learned/surrogate"] == 5.0
    assert set(metrics) >= {"world_model/weight/world_model", "world_model/weight/surrogate"}


@pytest.mark.trl
@pytest.mark.bwrap
@pytest.mark.peft
@pytest.mark.matplotlib
def test_a_run_with_the_surrogate_logs_its_weights_and_resumes_what_it_learned(tmp_path, tiny_autoresearch):
    from wmrl.core.cli import main
    from wmrl.core.pipeline import WORLD_MODEL_FILE

    run = tmp_path / "run"
    args = [
        *tiny_autoresearch,
        "checkpoint.every=1",
        "logging.progress=false",
        "world_model.surrogate.enabled=true",
    ]
    assert main(["train", "autoresearch", "--out", str(run), *args, "steps=2"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["world_model"]["surrogate"]["enabled"] is True
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "wmrl/step" in r]
    # the outcomes the surrogate holds, every step; its weight is logged once measured (unknown is not 0)
    assert steps and all("world_model/learned/surrogate" in r for r in steps)
    state = json.loads((run / "checkpoints" / "checkpoint-2" / WORLD_MODEL_FILE).read_text())
    assert state["sources"] == ["world_model", "surrogate"]
    assert main(["train", "autoresearch", "--out", str(run), "--resume", *args, "steps=3"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["wmrl/step"] for r in rows if "wmrl/step" in r] == [1.0, 2.0, 3.0]
