"""The warm start: a corpus of executed working solutions of the TRAINING tasks only, and the SFT
stage (TRL's SFTTrainer, LoRA) that lowers the loss and raises the valid rate of the tiny model.

Every script that enters the corpus was run in the real sandbox; nothing here stands in for it.
"""

from __future__ import annotations

import json

import pytest

from wmrl.autoresearch.tasks.model import TaskError


@pytest.mark.pandas
def test_every_bundled_task_gets_scripts_of_its_whole_pool():
    """The schema comes from the task itself; every recipe of every task renders a script that compiles,
    in the agent's reply format (a plan naming the method, one fenced python block)."""
    from wmrl.autoresearch.agent.actions import parse_action
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS, TRAIN_TASKS, load_bundled
    from wmrl.autoresearch.training.corpus import TaskSchema, recipes_for, render_plan, render_reply

    kinds = set()
    for task_id in (*TRAIN_TASKS, *EVAL_TASKS):
        task = load_bundled(task_id)
        schema = TaskSchema.from_task(task)
        kinds.add(schema.kind)
        assert schema.target not in task.public_dir.joinpath("test.csv").read_text().splitlines()[0].split(
            ","
        )
        recipes = recipes_for(schema)
        assert len({r.model for r in recipes}) >= 6, task_id  # the pool's spread of families survives
        for recipe in recipes:
            action = parse_action(render_reply(schema, recipe))
            assert action.fence == "closed_python" and action.plan == render_plan(schema, recipe)
            compile(action.code, f"{task_id}:{recipe.name}", "exec")
            assert 'os.environ["SUBMISSION_PATH"]' in action.code and 'os.environ["DATA_DIR"]' in action.code
    assert kinds == {
        "binary_proba",
        "binary_label",
        "multiclass_proba",
        "multiclass_label",
        "ordinal",
        "regression",
    }


@pytest.mark.bwrap
@pytest.mark.pandas
def test_the_corpus_never_holds_a_held_out_task(tmp_path):
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS, load_bundled
    from wmrl.autoresearch.training.corpus import build_corpus
    from wmrl.autoresearch.training.sft import CorpusSection, WarmStartConfig, run_sft

    grader = ExecutionGrader(backend="bwrap", time_limit_s=60)
    # a held-out task is refused, alone or among training tasks, and so is one the caller holds out
    for tasks, exclude in (
        ([EVAL_TASKS[0]], ()),
        (["penguin-body-mass", EVAL_TASKS[1]], ()),
        (["penguin-body-mass"], ("penguin-body-mass",)),
    ):
        with pytest.raises(TaskError, match="held out"):
            build_corpus([(t, load_bundled(t)) for t in tasks], grade=grader.grade, exclude=exclude)
    # the SFT stage refuses it before anything runs or is written
    with pytest.raises(TaskError, match="held-out"):
        run_sft(WarmStartConfig(corpus=CorpusSection(ids=(EVAL_TASKS[0],))), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # a real corpus: every example is from the training task, executed, and names no held-out task
    train = ["penguin-body-mass"]
    corpus = build_corpus(
        [(t, load_bundled(t)) for t in train],
        agent_per_task=3,
        world_model_per_task=3,
        grade=grader.grade,
        exclude=EVAL_TASKS,
    )
    assert corpus.of_role("agent") and corpus.of_role("world_model")
    assert corpus.executions == len({e.code for e in corpus.examples})
    for example in corpus.examples:
        assert example.task_id in train and example.reward is not None
        assert not any(held in example.code or held in example.completion for held in EVAL_TASKS)
        if example.role == "agent":  # only scripts whose real run was valid teach the agent
            assert example.status == "valid" and 0 <= example.position <= 1
            assert example.completion.endswith("```") and example.code in example.completion
        else:  # the world model's JSON of the real outcome
            answer = json.loads(example.completion)
            assert answer["status"] == ("timeout" if example.status == "killed" else example.status)
            assert (answer["position"] is None) == (example.status != "valid")


def _tiny_config(root, task, **changes):
    from wmrl.autoresearch.llm.tiny import build_tiny_model
    from wmrl.autoresearch.training.config import ModelSection, SandboxSection
    from wmrl.autoresearch.training.sft import CorpusSection, WarmStartConfig
    from wmrl.core.train_config import LoggingConfig, LoraConfig

    model, tokenizer = build_tiny_model(hidden_size=64)
    model.save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    values = {
        "epochs": 60,
        "batch_size": 1,
        "learning_rate": 1e-2,
        "lora": LoraConfig(enabled=False),
        "model": ModelSection(path=str(root / "tiny")),
        "corpus": CorpusSection(ids=(task,), agent_per_task=1, world_model_per_task=0, overview_tokens=600),
        "sandbox": SandboxSection(time_limit_s=30),
        "max_length": 4096,
        "logging": LoggingConfig(report_to=(), progress=False, plots=False),
    }
    values.update(changes)
    return WarmStartConfig(**values)


@pytest.mark.trl
@pytest.mark.bwrap
@pytest.mark.peft
def test_sft_with_lora_lowers_the_loss_and_writes_a_policy_every_command_takes(tmp_path, capsys):
    """A short LoRA run through the CLI: the run directory's layout, the loss falls, a checkpoint is
    complete (stage marker), the final folder is a merged plain model that records its lineage."""
    from wmrl.autoresearch.evaluation.run import load_policy, training_tasks_of
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.core.cli import main
    from wmrl.core.rundir import STAGE_FILE, list_checkpoints
    from wmrl.core.runlog import read_metrics

    make_toy_task(tmp_path / "tasks")
    task = str(tmp_path / "tasks" / "toy-regression")
    _tiny_config(tmp_path, task)  # writes the tiny model
    out = tmp_path / "run"
    argv = [
        "train", "autoresearch-sft", "--out", str(out), "--no-progress",
        f"model.path={tmp_path / 'tiny'}", f"corpus.ids=[{task}]", "corpus.agent_per_task=1",
        "corpus.world_model_per_task=1", "corpus.overview_tokens=600", "corpus.world_model_overview_tokens=600",
        "epochs=6", "batch_size=2", "learning_rate=1e-2", "lora.r=8", "max_length=4096",
        "logging.report_to=[]", "sandbox.time_limit_s=30",
    ]  # fmt: skip
    assert main(argv) == 0
    losses = [r["loss"] for r in read_metrics(out) if r.get("loss") is not None]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert {"config.json", "corpus.jsonl", "corpus_report.json", "run_summary.json"} <= {
        p.name for p in out.iterdir()
    }
    assert (list_checkpoints(out, STAGE_FILE)[-1] / STAGE_FILE).is_file()
    assert not list_checkpoints(out)  # not an RL checkpoint: an RL trainer would not resume from it
    # the CLI knows the stage's checkpoints are complete: the same command again points at --resume
    assert main(argv) != 0
    assert "continue it with --resume" in capsys.readouterr().err
    final = out / "final"
    assert not (final / "adapter_config.json").exists()  # merged: a plain model folder
    policy = json.loads((final / "wmrl_policy.json").read_text())
    assert policy["stage"] == "sft" and policy["train_tasks"] == ["toy-regression"]
    assert training_tasks_of(final)[0] == ["toy-regression"]
    load_policy(final)  # what `wmrl eval` and `wmrl train autoresearch model.path=...` load


@pytest.mark.slow
@pytest.mark.trl
@pytest.mark.bwrap
def test_sft_raises_the_valid_rate_of_the_tiny_model_on_its_training_task(tmp_path):
    """The tiny model memorises its one training script (loss near zero) and then writes scripts that
    run; before, it writes none. Sampling gets room for the whole script: the corpus's script is
    whatever the task's pool holds first, so its length is read from the corpus, not assumed."""
    from transformers import AutoTokenizer

    from wmrl.autoresearch.evaluation.run import evaluate_policy
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.training.sft import run_sft

    make_toy_task(tmp_path / "tasks")
    task = str(tmp_path / "tasks" / "toy-regression")
    # 60 epochs left the loss at ~0.5 nats a token on some pool scripts: not memorised, and a
    # ~450-token script sampled at that loss always breaks somewhere. 150 reach < 0.01.
    config = _tiny_config(tmp_path, task, epochs=150)
    result = run_sft(config, tmp_path / "run", log=lambda *_: None)
    assert result.loss_last < 0.05 < result.loss_first, (result.loss_first, result.loss_last)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny")
    corpus = [json.loads(line) for line in (tmp_path / "run" / "corpus.jsonl").read_text().splitlines()]
    longest = max(len(tokenizer(example["completion"])["input_ids"]) for example in corpus)
    settings = {
        "tasks": task,
        "samples": 4,
        "seeds": [0],
        "in_sample": True,
        "max_new_tokens": longest + 64,
        "overview_tokens": 600,
        "temperature": 0.7,
        "time_limit_s": 30,
        "train_tasks": task,
    }
    before = evaluate_policy(str(tmp_path / "tiny"), **settings)
    after = evaluate_policy(str(result.final_model), **settings)
    assert before.valid_rate == 0 and after.valid_rate > before.valid_rate
    assert after.in_sample and "IN-SAMPLE" in after.format()
