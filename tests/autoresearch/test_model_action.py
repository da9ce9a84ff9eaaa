"""The ``model`` action: the agent writes the model block of a fixed pipeline (``tasks.action=model``).

The pipeline around the block is derived from each task; what both reward streams grade is the
assembled script, and it runs in the real sandbox like any script.
"""

from __future__ import annotations

import pytest

from wmrl.core.config import ConfigError


@pytest.mark.pandas
def test_every_bundled_task_gets_a_pipeline_the_model_blocks_of_its_pool_complete():
    from wmrl.autoresearch.agent.actions import parse_action
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS, TRAIN_TASKS, load_bundled
    from wmrl.autoresearch.training.corpus import TaskSchema, recipes_for
    from wmrl.autoresearch.training.model_slot import (
        SLOT_BEGIN,
        SLOT_END,
        assemble,
        model_block,
        pipeline_head,
        pipeline_tail,
        render_model_reply,
        slot_recipes,
    )

    for task_id in (*TRAIN_TASKS, *EVAL_TASKS):
        schema = TaskSchema.from_task(load_bundled(task_id))
        recipes = slot_recipes(recipes_for(schema))
        assert len({r.model for r in recipes}) >= 5, task_id  # the block still has families to choose from
        assert all(not r.numeric_only and r.train_fraction == 1 and not r.log_target for r in recipes)
        head, tail = pipeline_head(schema), pipeline_tail(schema)
        assert 'os.environ["DATA_DIR"]' in head and 'os.environ["SUBMISSION_PATH"]' in tail
        assert "model" not in head.replace("model_", "") and tail.startswith("model.fit(")
        for recipe in recipes:
            action = parse_action(render_model_reply(schema, recipe))
            assert action.fence == "closed_python" and action.code == model_block(schema, recipe)
            assert action.plan.startswith("Plan: ") and len(action.code.splitlines()) <= 4
            script = assemble(head, action.code, tail)
            assert script.index(SLOT_BEGIN) < script.index(action.code) < script.index(SLOT_END)
            compile(script, f"{task_id}:{recipe.name}", "exec")


@pytest.mark.pandas
def test_prompt_rows_of_the_model_action_carry_the_pipeline_and_the_item_is_the_assembled_script():
    from wmrl.autoresearch.agent.prompts import first_user_message
    from wmrl.autoresearch.training.data import build_prompt_rows, resolve_training_tasks
    from wmrl.autoresearch.training.model_slot import assemble
    from wmrl.autoresearch.training.streams import solution_items
    from wmrl.core.rollouts import Exact

    tasks = resolve_training_tasks(("penguin-body-mass", "wine-cultivar"), None, 60.0, 2048)
    rows = build_prompt_rows(tasks, action="model")
    scripts = build_prompt_rows(tasks)
    assert [r["task_id"] for r in rows] == ["penguin-body-mass", "wine-cultivar"]
    for row, script_row in zip(rows, scripts, strict=True):
        system, user = (m["content"] for m in row["prompt"])
        assert "choosing the model of a fixed pipeline" in system
        assert row["slot_head"] in user and row["slot_tail"].strip() in user
        assert "Predict " in user and "Training data: " in user  # the brief, not the overview
        assert "slot_head" not in script_row and script_row["prompt"][1]["content"].startswith("# TASK")
        assert len(user) < len(script_row["prompt"][1]["content"])
    item = solution_items()
    block = "from sklearn.ensemble import RandomForestRegressor\nmodel = RandomForestRegressor()"
    reply = f"Plan: a forest.\n\n```python\n{block}\n```"
    solution = item(reply, rows[0])
    assert solution.task_id == "penguin-body-mass"
    assert solution.code == assemble(rows[0]["slot_head"], block, rows[0]["slot_tail"])
    assert item(reply, scripts[0]).code == block  # the script action: the reply's code as it is
    assert isinstance(item("no code here", rows[0]), Exact)  # malformed in both actions
    with pytest.raises(ValueError, match="single-turn"):
        build_prompt_rows(tasks, action="model", turns=2)
    with pytest.raises(ValueError, match="action must be one of"):
        build_prompt_rows(tasks, action="notebook")
    assert first_user_message("x").startswith("x")


def test_configs_refuse_a_multi_turn_model_action():
    from wmrl.autoresearch.agent.episode import EpisodeConfig
    from wmrl.autoresearch.evaluation.config import EvalConfig
    from wmrl.autoresearch.training.config import TasksSection, TrainConfig
    from wmrl.autoresearch.training.sft import CorpusSection

    assert TrainConfig(tasks=TasksSection(action="model")).tasks.action == "model"
    with pytest.raises(ConfigError, match="single-turn"):
        TrainConfig(tasks=TasksSection(action="model"), episode=EpisodeConfig(turns=2))
    with pytest.raises(ConfigError, match=r"tasks\.action"):
        TasksSection(action="notebook")
    with pytest.raises(ConfigError, match="single-turn"):
        EvalConfig(model="smollm2", action="model", turns=3)
    with pytest.raises(ConfigError, match="single-turn"):
        CorpusSection(action="model", turns=2)


@pytest.mark.pandas
def test_each_action_has_its_own_embedded_warm_start(tmp_path, monkeypatch):
    from wmrl.autoresearch.training.warm import WARM_SPEC, WARM_SPECS, resolve_spec, warm_start_dir

    monkeypatch.setenv("WMRL_CACHE", str(tmp_path))
    script, model = warm_start_dir(WARM_SPEC), warm_start_dir("smollm2-warm-model")
    assert WARM_SPECS == {"smollm2-warm": "script", "smollm2-warm-model": "model"}
    assert script != model and script.parent == model.parent == tmp_path / "warm"
    assert model.name.startswith("smollm2-135m-sft-model-") and "model" not in script.name
    assert resolve_spec("some/folder") == "some/folder"
    with pytest.raises(ValueError, match="no embedded warm start"):
        warm_start_dir("smollm2-warm-notebook")


@pytest.mark.bwrap
@pytest.mark.pandas
def test_assembled_scripts_run_in_the_sandbox_and_score_as_the_whole_script_of_the_same_recipe():
    """A block of the pool scores exactly what the script action's script of the same recipe scores
    (same features, same estimator); a block that sets no ``model`` fails at run time."""
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.tasks.suite import load_bundled
    from wmrl.autoresearch.training.corpus import TaskSchema, recipes_for, render_script
    from wmrl.autoresearch.training.model_slot import (
        assemble,
        model_block,
        pipeline_head,
        pipeline_tail,
        slot_recipes,
    )

    grader = ExecutionGrader(backend="bwrap", time_limit_s=60)
    for task_id in ("penguin-body-mass", "leaf-species", "food-review-rating"):
        task = load_bundled(task_id)
        schema = TaskSchema.from_task(task)
        head, tail = pipeline_head(schema), pipeline_tail(schema)
        recipe = next(r for r in slot_recipes(recipes_for(schema)) if r.model in ("rf", "logreg", "ridge"))
        slot = grader.grade(task, assemble(head, model_block(schema, recipe), tail))
        whole = grader.grade(task, render_script(schema, recipe))
        assert slot.status == whole.status == "valid", (task_id, slot.stderr_tail)
        assert slot.score == pytest.approx(whole.score), task_id
    broken = grader.grade(task, assemble(head, "estimator = None", tail))
    assert broken.status == "runtime_error" and "NameError" in (broken.stderr_tail or "")


@pytest.mark.bwrap
@pytest.mark.pandas
def test_the_model_action_corpus_teaches_blocks_and_executes_the_assembled_scripts():
    from wmrl.autoresearch.agent.actions import parse_action
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS, load_bundled
    from wmrl.autoresearch.training.corpus import TaskSchema, build_corpus
    from wmrl.autoresearch.training.model_slot import assemble, pipeline_head, pipeline_tail

    grader = ExecutionGrader(backend="bwrap", time_limit_s=60)
    task = load_bundled("wine-cultivar")
    corpus = build_corpus(
        [("wine-cultivar", task)],
        agent_per_task=3,
        world_model_per_task=3,
        grade=grader.grade,
        exclude=EVAL_TASKS,
        action="model",
    )
    schema = TaskSchema.from_task(task)
    head, tail = pipeline_head(schema), pipeline_tail(schema)
    agent, judge = corpus.of_role("agent"), corpus.of_role("world_model")
    assert len(agent) == 3 and len(judge) == 3
    for example in agent:  # the reply is the block; what ran is the pipeline around it
        block = parse_action(example.completion).code
        assert example.code == assemble(head, block, tail) and example.status == "valid"
    assert any(e.status != "valid" for e in judge)  # a broken variant of the assembled script, run for real
    assert all(e.code.startswith(head) for e in judge)
    with pytest.raises(ValueError, match="action must be one of"):
        build_corpus([("wine-cultivar", task)], grade=grader.grade, action="notebook")


def test_evaluation_writes_what_the_policy_was_trained_to_write(tmp_path):
    import json

    from wmrl.autoresearch.training.policy_action import trained_action_of

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    assert trained_action_of(run / "final") == ("script", "the default")  # nothing recorded
    (run / "config.json").write_text(json.dumps({"tasks": {"ids": [], "action": "model"}}))
    assert trained_action_of(run / "final") == ("model", str(run / "config.json"))
    (run / "config.json").write_text(json.dumps({"corpus": {"ids": []}}))  # a warm start before the key
    assert trained_action_of(run / "final")[0] == "script"
    assert trained_action_of("smollm2-warm-model") == ("model", "smollm2-warm-model")
    assert trained_action_of("smollm2-warm")[0] == "script"


def test_training_refuses_a_policy_of_the_other_action_before_writing_a_run(tmp_path):
    import json

    from wmrl.autoresearch.training.config import ModelSection, TasksSection, TrainConfig
    from wmrl.autoresearch.training.run import run_training
    from wmrl.core.config import ConfigError

    warm = tmp_path / "warm"
    (warm / "final").mkdir(parents=True)
    (warm / "config.json").write_text(json.dumps({"corpus": {"action": "script"}}))
    config = TrainConfig(model=ModelSection(path=str(warm / "final")))
    assert config.tasks.action == "model"
    with pytest.raises(ConfigError, match=r"trained for tasks\.action=script"):
        run_training(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    # the action it was trained for passes the check (and fails later: the folder holds no model)
    ok = TrainConfig(
        model=config.model, tasks=TasksSection(ids=config.tasks.ids, prompts_per_task=2, action="script")
    )
    from wmrl.autoresearch.llm.models import ModelNotFoundError

    with pytest.raises(ModelNotFoundError):
        run_training(ok, tmp_path / "out2", progress=False)


@pytest.mark.pandas
def test_the_warm_starts_cache_keys_stay_put(tmp_path, monkeypatch):
    """A changed key rebuilds every user's cached warm start (16-25 min on 2 cores) and leaves the old
    one orphaned: a setting added with an inert default must stay out of the key (``sandbox.cores`` did
    not, once). Change these names only when the warm start itself changes, on purpose."""
    from wmrl.autoresearch.training.warm import WARM_SPEC, warm_start_dir

    monkeypatch.setenv("WMRL_CACHE", str(tmp_path))
    assert warm_start_dir(WARM_SPEC).name == "smollm2-135m-sft-6149377682a68fcee2"
    assert warm_start_dir("smollm2-warm-model").name == "smollm2-135m-sft-model-c301e59c52e51342f3"
