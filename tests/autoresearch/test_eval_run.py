"""``wmrl eval autoresearch`` end to end with a tiny model, policy loading (LoRA adapters merged into
their base) and the clear errors for a missing model."""

from __future__ import annotations

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
