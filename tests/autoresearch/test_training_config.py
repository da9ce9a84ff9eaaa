"""The training configuration: embedded defaults, strict loading, overrides, validation, the prompt dataset."""

from __future__ import annotations

import json

import pytest

from wmrl.autoresearch.training.config import TrainConfig
from wmrl.core.config import ConfigError, from_dict, load_config, to_dict


def test_defaults_are_the_embedded_quickstart():
    c = TrainConfig()
    assert c.mode == "wmrl"
    # the model action's warm start, and a frozen copy of it as the world model
    assert c.tasks.action == "model" and c.model.path == "smollm2-warm-model"
    assert c.world_model.backend.path is None
    assert c.model.device == "cpu" and c.sandbox.backend == "bwrap"
    # one bundled training task, never a held-out one; the reply budget is the action's
    from wmrl.autoresearch.tasks.suite import suite_split

    assert len(c.tasks.ids) == 1 and {suite_split(t) for t in c.tasks.ids} == {"train"}
    assert c.grpo.max_completion_tokens == 96 and c.lora.last_layers == 8
    assert c.world_model.scoring == "status_probs"  # one prefill per script
    assert 1 <= c.steps <= 10 and c.group_size >= 2 and c.episode.turns == 1
    # the core default: per-rollout anchors (a quota of half of each group), the execution memory, weights of 1
    sched = c.corrector.scheduler
    assert sched.rollout_share == 1.0 and sched.floor == 0 and sched.fraction * c.group_size == 4
    assert c.corrector.memory.enabled is True and c.corrector.fusion.mode == "none"
    # the paper's configuration is one preset away; real with a result cache is a setting of mode real
    paper = load_config(TrainConfig, None, ["corrector_preset=paper"]).corrector
    assert paper.fusion.mode == "paper" and paper.scheduler.fraction == 0.1 and paper.memory.enabled is False
    cached = load_config(TrainConfig, None, ["mode=real", "corrector.memory.enabled=true"]).corrector
    assert cached.memory.enabled is True and cached.scheduler.fraction == 1.0
    assert load_config(TrainConfig, None, ["mode=real"]).corrector.memory.enabled is False
    with pytest.raises(ConfigError, match="corrector_preset"):
        load_config(TrainConfig, None, ["corrector_preset=real"])
    assert from_dict(TrainConfig, json.loads(json.dumps(to_dict(c)))) == c


def test_overrides_and_the_mode_preset():
    c = load_config(TrainConfig, None, ["mode=real", "steps=5"])
    assert c.mode == "real" and c.steps == 5
    assert c.corrector.scheduler.fraction == 1.0  # resolved: real executes every group
    assert c.corrector.fusion.mode == "none"
    wm = load_config(TrainConfig, None, ["mode=world_model"]).corrector
    assert wm.scheduler.fraction == 0.0 and wm.scheduler.floor == 0 and not wm.debias.enabled
    # a setting the mode contradicts is refused, not silently overwritten
    with pytest.raises(ConfigError, match="contradicts"):
        load_config(TrainConfig, None, ["mode=real", "corrector.scheduler.fraction=0.25"])
    with pytest.raises(ConfigError, match="contradicts"):
        load_config(TrainConfig, None, ["mode=world_model", "corrector.fusion.mode=paper"])
    # ...and the same from a config file that names both (it ran with fraction 1.0 before)
    with pytest.raises(ConfigError, match="contradicts"):
        load_config(TrainConfig, {"mode": "real", "corrector": {"scheduler": {"fraction": 0.25}}})
    # a mode given over a file that names none still overrides the file's corrector settings
    over = load_config(TrainConfig, {"corrector": {"scheduler": {"fraction": 0.25}}}, ["mode=real"])
    assert over.corrector.scheduler.fraction == 1.0
    # a run's own config.json resumes under its mode
    assert load_config(TrainConfig, load_config(TrainConfig, None, ["mode=real"]).to_dict()).mode == "real"
    # the domain's own corrector defaults survive the preset
    assert c.corrector.debias.min_pairs == TrainConfig().corrector.debias.min_pairs == 8


SCRIPTS = ["tasks.action=script", "model.path=smollm2-warm"]


def test_files_and_strictness(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('mode = "world_model"\nsteps = 2\ngroup_size = 3\n[tasks]\nids = ["wine-cultivar"]\n')
    c = load_config(TrainConfig, path, ["steps=4"])
    assert (c.mode, c.steps, c.group_size, c.tasks.ids) == ("world_model", 4, 3, ("wine-cultivar",))
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("mode: world_model\nsteps: 2\ngroup_size: 3\ntasks:\n  ids: [wine-cultivar]\n")
    assert load_config(TrainConfig, yaml_path, ["steps=4"]) == c
    with pytest.raises(ConfigError, match=r"grpo\.stepz.*did you mean steps"):
        load_config(TrainConfig, None, ["grpo.stepz=3"])
    with pytest.raises(ConfigError, match="group_size must be an integer >= 2"):
        load_config(TrainConfig, None, ["group_size=1"])
    with pytest.raises(ConfigError, match="mode"):
        load_config(TrainConfig, None, ["mode=both"])
    with pytest.raises(ConfigError, match="duplicates"):
        load_config(TrainConfig, None, ['tasks.ids=["a", "a"]'])
    assert load_config(TrainConfig, None, ["tasks.ids=[iris, wine]"]).tasks.ids == ("iris", "wine")
    with pytest.raises(ConfigError, match=r"active_share must be 0 with episode\.turns > 1"):
        load_config(TrainConfig, None, [*SCRIPTS, "episode.turns=2", "corrector.scheduler.active_share=0.5"])
    with pytest.raises(ConfigError, match=r"tasks\.action=script model\.path=smollm2-warm"):
        load_config(TrainConfig, None, ["episode.turns=2"])  # the default action is single-turn
    assert load_config(TrainConfig, None, [*SCRIPTS, "episode.turns=2"]).episode.turns == 2
    # a policy warm-started for one action is refused for the other
    with pytest.raises(ConfigError, match="warm start of the model action"):
        load_config(TrainConfig, None, ["tasks.action=script"])
    script = load_config(TrainConfig, None, SCRIPTS)
    assert script.grpo.max_completion_tokens == 352  # the action's reply budget
    with pytest.raises(ConfigError, match=r"sandbox\.cache=false"):  # repeats must really re-execute
        load_config(TrainConfig, None, ["corrector.scheduler.repeat_share=0.2"])
    assert load_config(TrainConfig, None, ["corrector.scheduler.repeat_share=0.2", "sandbox.cache=false"])
    with pytest.raises(ConfigError, match=r"sandbox\.backend"):
        load_config(TrainConfig, None, ["sandbox.backend=chroot"])
    assert load_config(TrainConfig, None, ["sandbox.cores=[0]"]).sandbox.cores == (0,)
    for cores in ("[0,0]", "[-1]"):
        with pytest.raises(ConfigError, match=r"sandbox\.cores must be distinct core indices"):
            load_config(TrainConfig, None, [f"sandbox.cores={cores}"])
    with pytest.raises(ConfigError, match=r"sandbox\.cores names cores of this machine"):
        load_config(
            TrainConfig,
            None,
            ["sandbox.cores=[0]", "sandbox.pool=ray", "sandbox.backend=bwrap", "sandbox.ray.slots=2"],
        )


def test_cli_prints_the_resolved_config_and_rejects_bad_ones(capsys, tmp_path):
    import yaml

    from wmrl.core.cli import main

    assert main(["train", "autoresearch", "--print-config", "--json", "steps=2", "mode=real"]) == 0
    printed = json.loads(capsys.readouterr().out)
    resolved = load_config(TrainConfig, None, ["steps=2", "mode=real"])
    assert from_dict(TrainConfig, printed) == resolved
    assert printed["corrector"]["scheduler"]["fraction"] == 1.0  # what runs, after the mode
    # the annotated YAML is the same config, with each key documented, and loads back through --config
    assert main(["train", "autoresearch", "--print-config", "steps=2", "mode=real"]) == 0
    text = capsys.readouterr().out
    assert "# training steps" in text and "[default: 8]" in text
    assert from_dict(TrainConfig, yaml.safe_load(text)) == resolved
    (tmp_path / "printed.yaml").write_text(text)
    assert (
        main(
            ["train", "autoresearch", "--config", str(tmp_path / "printed.yaml"), "--print-config", "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == printed
    # one-line errors with exit code 2: an unknown key, a malformed file, a directory as --config
    assert main(["train", "autoresearch", "grpo.nope=1"]) == 2
    assert "grpo.nope" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("steps: [1,\n")
    assert main(["train", "autoresearch", "--config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        "bad.yaml is not valid YAML" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    )
    assert main(["train", "autoresearch", "--config", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    # --help lists every key with its documentation
    with pytest.raises(SystemExit):
        main(["train", "autoresearch", "--help"])
    assert "corrector.scheduler.fraction (float)" in capsys.readouterr().out


@pytest.mark.pandas
def test_training_tasks_and_prompt_rows():
    from wmrl.autoresearch.tasks import TaskError
    from wmrl.autoresearch.tasks.suite import TRAIN_TASKS
    from wmrl.autoresearch.training.data import build_prompt_rows, resolve_training_tasks

    tasks = resolve_training_tasks(limit=2, time_limit_s=30.0, memory_limit_mb=1024)
    assert [t.ref for t in tasks] == list(TRAIN_TASKS[:2])
    assert all(t.task.time_limit_s == 30.0 and t.task.memory_limit_mb == 1024 for t in tasks)
    with pytest.raises(TaskError, match="held-out evaluation task"):
        resolve_training_tasks(["wine-cultivar", "taxi-tip"])
    rows = build_prompt_rows(tasks, turns=3, prompts_per_task=2, libraries=("numpy",))
    assert [r["prompt_id"] for r in rows] == [f"{t.task.id}#{k}" for t in tasks for k in range(2)]
    assert len({r["prompt_id"] for r in rows}) == 4
    system, user = rows[0]["prompt"]
    assert system["role"] == "system" and "up to 3 attempts" in system["content"]
    assert user["role"] == "user" and "SUBMISSION CONTRACT" in user["content"] and "30 s" in user["content"]
    assert rows[0]["task_ref"] == TRAIN_TASKS[0] and rows[0]["task_id"] == TRAIN_TASKS[0]


def test_lora_last_layers_puts_adapters_in_the_top_layers_only():
    pytest.importorskip("peft")
    from wmrl.autoresearch.llm.tiny import build_tiny_model
    from wmrl.autoresearch.training.builders import peft_config
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import ConfigError
    from wmrl.core.train_config import LoraConfig

    model, _ = build_tiny_model()
    total = model.config.num_hidden_layers
    assert peft_config(TrainConfig(lora=LoraConfig()), model).layers_to_transform is None  # 0: every layer
    top = peft_config(TrainConfig(lora=LoraConfig(last_layers=1)), model)
    assert top.layers_to_transform == [total - 1]
    # no more layers than that: every layer
    assert peft_config(TrainConfig(lora=LoraConfig(last_layers=total)), model).layers_to_transform is None
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        peft_config(TrainConfig(lora=LoraConfig(last_layers=1)), object())
    with pytest.raises(ConfigError, match="last_layers"):
        LoraConfig(last_layers=-1)


@pytest.mark.parametrize(
    ("sandbox", "held"),
    [
        ({}, 0.0),
        ({"gpus": [0, 1, 2, 3], "gpus_per_slot": 2, "workers": 2}, 4.0),
        (
            {
                "pool": "ray",
                "backend": "subprocess",
                "workers": 4,
                "ray": {"slots": 4, "gpus_per_slot": 0.5},
            },
            2.0,
        ),
    ],
    ids=["cpu", "local-gpus", "ray-shared-gpus"],
)
def test_the_sandboxs_gpus_are_the_anchor_streams_accelerators(sandbox, held):
    from wmrl.autoresearch.training.config import SandboxSection

    assert from_dict(SandboxSection, sandbox).gpus_held == held
