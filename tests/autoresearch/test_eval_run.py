"""``wmrl eval autoresearch`` end to end with a tiny model, policy loading (LoRA adapters merged into
their base) and the clear errors for a missing model."""

from __future__ import annotations

import dataclasses
import json

import pytest


@pytest.mark.transformers
def test_missing_model_errors_say_how_to_provide_one(capsys, tmp_path):
    from wmrl.core.cli import main

    assert main(["eval", "autoresearch"]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and "final/" in err and "smollm2" in err
    assert main(["eval", "autoresearch", "--model", str(tmp_path / "no-such-model")]) == 2
    err = capsys.readouterr().err
    assert "no such file or folder" in err and "never from a hub" in err


@pytest.mark.peft
def test_load_policy_merges_a_lora_adapter_into_its_base(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from wmrl.autoresearch.evaluation.run import load_policy
    from wmrl.autoresearch.llm.models import ModelNotFoundError, load_model
    from wmrl.autoresearch.llm.tiny import save_tiny_model

    base = save_tiny_model(tmp_path / "base")
    model = get_peft_model(load_model(base).model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # make the adapter non-trivial (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    adapter = tmp_path / "final"
    model.save_pretrained(adapter)
    ids = torch.tensor([[1, 5, 9, 20]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        merged = load_policy(adapter)
        got = merged.model(input_ids=ids).logits
        plain = load_model(base).model(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5) and not torch.allclose(plain, expected, atol=1e-3)
    # the base folder is gone: the base spec recorded by the run is used instead
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "moved")
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelNotFoundError, match="LoRA adapter"):
        load_policy(adapter)
    (adapter / "wmrl_policy.json").write_text(json.dumps({"base": str(base)}))
    with torch.no_grad():
        assert torch.allclose(load_policy(adapter).model(input_ids=ids).logits, expected, atol=1e-5)


@pytest.mark.transformers
@pytest.mark.bwrap
def test_eval_end_to_end_on_toy_tasks(tmp_path, capsys):
    """The random tiny model writes no script: every rollout is malformed, valid rate 0, and the
    report still covers every task with k samples each."""
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.core.cli import main

    model = save_tiny_model(tmp_path / "tiny")
    make_toy_task(tmp_path, "toy-regression")
    make_toy_task(tmp_path, "toy-binary", kind="binary")
    tasks = f"{tmp_path / 'toy-regression'},{tmp_path / 'toy-binary'}"
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            "autoresearch",
            "--model",
            str(model),
            "--tasks",
            tasks,
            "--samples",
            "3",
            "--max-new-tokens",
            "8",
            "--overview-tokens",
            "1500",
            "--train-tasks",
            "wine-cultivar",
            "--seeds",
            "[0,1]",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    report = json.loads((out / "eval_report.json").read_text())
    assert json.loads(capsys.readouterr().out) == report
    assert [t["task_id"] for t in report["tasks"]] == ["toy-regression", "toy-binary"]
    assert report["seeds"] == [0, 1] and len(report["per_seed_tasks"]) == 4
    # every graded turn is kept: 2 seeds x 2 tasks x 3 samples, each with its reply and grade
    turns = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted((t["seed"], t["task_id"], t["sample"]) for t in turns) == sorted(
        (seed, task, k) for seed in (0, 1) for task in ("toy-regression", "toy-binary") for k in range(3)
    )
    assert all(t["turn"] == 0 and t["status"] == "malformed" and t["position"] is None for t in turns)
    for task in report["per_seed_tasks"]:  # the report's statuses are the recorded turns'
        recorded = [
            t["status"] for t in turns if (t["seed"], t["task_id"]) == (task["seed"], task["task_id"])
        ]
        assert {s: recorded.count(s) for s in set(recorded)} == task["statuses"]
    for t in report["tasks"]:  # pooled over the two seeds
        assert t["samples"] == 3 and t["graded"] == 6 and t["valid_rate"] == 0 and t["avg_position"] == 0
        assert sum(t["statuses"].values()) == 6 and t["avg_position_sem"] == 0
    assert report["categories"] == {"binary": 0.0, "regression": 0.0} and report["overall"] == 0.0
    assert report["train_tasks"] == ["wine-cultivar"]
    # evaluating a task the policy was trained on is refused
    assert (
        main(
            [
                "eval",
                "autoresearch",
                "--model",
                str(model),
                "--tasks",
                tasks,
                "--train-tasks",
                str(tmp_path / "toy-binary"),
            ]
        )
        == 2
    )
    assert "overlap" in capsys.readouterr().err


@pytest.mark.transformers
@pytest.mark.bwrap
def test_multi_turn_eval_shows_the_agent_exactly_trainings_feedback(tmp_path, monkeypatch):
    """The second turn of an evaluation trajectory is the first conversation, the reply, and the user
    message training's K-turn rollout builds from the same grade: ``next_user_message`` of
    ``format_feedback`` of the sandbox's result (or of an unparsable reply's exact grade), at the same
    token cap. Recomputed here from the recorded replies, independently of the evaluation."""
    from wmrl.autoresearch.agent.feedback import ExecutionFeedback, format_feedback
    from wmrl.autoresearch.agent.prompts import next_user_message
    from wmrl.autoresearch.agent.tokens import HFTokens
    from wmrl.autoresearch.evaluation.run import evaluate_policy
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.llm import TransformersBackend
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.training.streams import solution_items
    from wmrl.autoresearch.training.tiny_coder import train_tiny_coder
    from wmrl.core.rollouts import Exact

    make_toy_task(tmp_path, "toy-regression", time_limit_s=30)
    coder = tmp_path / "coder"
    prompt = [{"role": "system", "content": "You write scripts."}, {"role": "user", "content": "Task."}]
    train_tiny_coder([prompt], save_to=coder)
    calls = []
    complete = TransformersBackend.complete

    def recording(self, conversations, sampling):
        replies = complete(self, conversations, sampling)
        calls.append(([list(c) for c in conversations], [r[0].text for r in replies], self.tokenizer))
        return replies

    monkeypatch.setattr(TransformersBackend, "complete", recording)
    task_dir = str(tmp_path / "toy-regression")
    cap = 120
    recorded = []
    evaluate_policy(
        str(coder), tasks=task_dir, samples=3, turns=2, in_sample=True, train_tasks=task_dir,
        max_new_tokens=200, overview_tokens=600, feedback_max_tokens=cap, time_limit_s=30,
        record=recorded.append,
    )  # fmt: skip
    assert len(calls) == 2, "one generation call per turn"
    (first, replies, tokenizer), (second, _, _) = calls
    assert len(first) == len(second) == 3
    grader, item_of, tokens = ExecutionGrader(backend="bwrap"), solution_items(), HFTokens(tokenizer)
    row = {"task_ref": task_dir, "task_id": "toy-regression", "prompt_id": "toy-regression"}
    executed, feedbacks = 0, []
    for before, reply, after in zip(first, replies, second, strict=True):
        item = item_of(reply, row)
        if isinstance(item, Exact):
            feedback = item.feedback
        else:
            executed += 1
            feedback = ExecutionFeedback.from_result(grader.grade(load_task(task_dir), item.code))
        feedbacks.append(feedback)
        expected = next_user_message(format_feedback(feedback, cap, tokens), 1, 2)
        assert after == [
            *before,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": expected},
        ]
    assert executed, "at least one reply was a script the sandbox ran (not only unparsable replies)"
    # the record of the first turn: each trajectory's reply and its feedback, in order
    first_turn = [r for r in recorded if r["turn"] == 0]
    assert [r["sample"] for r in first_turn] == [0, 1, 2] and [r["reply"] for r in first_turn] == replies
    assert [r["feedback"] for r in first_turn] == [dataclasses.asdict(f) for f in feedbacks]


@pytest.mark.transformers
@pytest.mark.parametrize("graded", [0, 2])
def test_ctrl_c_during_an_evaluation_says_what_was_kept(tmp_path, capsys, monkeypatch, graded):
    """An evaluation stopped with Ctrl-C exits 130 and says exactly what is on disk: the turns graded
    so far (kept in ``trajectories.jsonl``) or nothing; it never offers a ``--resume`` it refuses."""
    import wmrl.autoresearch.evaluation.run as run
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.core.cli import main

    def stopped(*args, record, **kwargs):
        for k in range(graded):
            record({"seed": 0, "task_id": "wine-cultivar", "sample": k, "turn": 0, "status": "valid"})
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "evaluate_policy", stopped)
    out = tmp_path / "eval"
    argv = ["eval", "autoresearch", "--model", str(save_tiny_model(tmp_path / "tiny")), "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"after {graded} graded turn(s)" in err and "--resume" not in err
    assert not (out / "eval_report.json").exists()
    if graded:
        assert len((out / "trajectories.jsonl").read_text().splitlines()) == graded
    else:
        assert "nothing was written" in err and not out.exists()
