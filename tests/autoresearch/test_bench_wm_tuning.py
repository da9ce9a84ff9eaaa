"""``wmrl bench autoresearch --wm-tuned-on DIR``: each seed's world model is tuned on the anchor pairs
DIR's runs recorded at the OTHER seeds (leave one seed out, so no world model saw the scripts of the
seed it judges), with the runs' own world-model prompt settings; what it was tuned on is part of the
benchmark's identity; settings that cannot be honoured are refused."""

from __future__ import annotations

import json

import pytest


def _fake_source(root, seeds_with_pairs=(0, 1, 2), without_pairs=(0,)):
    """A benchmark folder shaped like a finished one: ``real``/``wmrl`` runs with anchor pairs and
    ``world_model`` runs without (only the files the source selection reads)."""
    (root / "runs").mkdir(parents=True)
    (root / "bench.json").write_text("{}")
    for mode in ("real", "wmrl"):
        for seed in seeds_with_pairs:
            run = root / "runs" / f"{mode}-s{seed}"
            run.mkdir()
            (run / "config.json").write_text(json.dumps({"seed": seed, "mode": mode}))
            (run / "anchor_pairs.jsonl").write_text(
                json.dumps({"task_id": "t", "code": f"{mode}{seed}"}) + "\n"
            )
            (run / "run_summary.json").write_text("{}")
    for seed in without_pairs:
        run = root / "runs" / f"world_model-s{seed}"
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"seed": seed, "mode": "world_model"}))
    return root


_VALID = """import os
import pandas as pd
t = pd.read_csv(os.environ["DATA_DIR"] + "/test.csv")
t["y"] = 0.5
t[["id", "y"]].to_csv(os.environ["SUBMISSION_PATH"], index=False)
"""


def _record_pairs(run, task, tag):
    """Execute two scripts (one valid, one crashing) on ``task`` and record them in ``run``'s pairs."""
    from wmrl.autoresearch.grading import ExecutionGrader, ExecutionRewardSource
    from wmrl.autoresearch.tasks import Solution
    from wmrl.autoresearch.training.anchor_pairs import AnchorPairRecorder

    source = ExecutionRewardSource(ExecutionGrader(backend="bwrap"), max_workers=2)
    source.record = AnchorPairRecorder(run / "anchor_pairs.jsonl", step=lambda: 1)
    source.grade(
        [Solution(str(task), f"# {tag}\n{_VALID}"), Solution(str(task), f"# {tag}\nraise SystemExit(1)\n")]
    )


def test_each_seed_is_tuned_on_the_pairs_of_the_other_seeds_only(tmp_path):
    from wmrl.autoresearch.evaluation.bench_wm_tuning import source_runs

    source = _fake_source(tmp_path / "src")
    assert [r.name for r in source_runs(source, 0)] == ["real-s1", "real-s2", "wmrl-s1", "wmrl-s2"]
    assert [r.name for r in source_runs(source, 2)] == ["real-s0", "real-s1", "wmrl-s0", "wmrl-s1"]
    # a seed the source never ran takes every run; the seed is read from config.json, not the name
    assert len(source_runs(source, 7)) == 6
    renamed = source / "runs" / "real-s1"
    (renamed / "config.json").write_text(json.dumps({"seed": 0}))
    assert "real-s1" not in [r.name for r in source_runs(source, 0)]


def test_a_source_without_a_benchmark_or_without_pairs_of_other_seeds_is_refused(tmp_path):
    from wmrl.autoresearch.evaluation.bench_wm_tuning import source_runs
    from wmrl.core.config import ConfigError

    with pytest.raises(ConfigError, match="no benchmark there"):
        source_runs(tmp_path / "nothing", 0)
    only_seed0 = _fake_source(tmp_path / "one", seeds_with_pairs=(0,), without_pairs=(1,))
    with pytest.raises(ConfigError, match="no run at a seed other than 0"):
        source_runs(only_seed0, 0)


def test_a_source_run_that_has_not_finished_is_refused(tmp_path):
    """Its pairs would still grow: a tuning on it would depend on when it ran."""
    from wmrl.autoresearch.evaluation.bench_wm_tuning import source_runs
    from wmrl.core.config import ConfigError

    source = _fake_source(tmp_path / "src")
    (source / "runs" / "wmrl-s1" / "run_summary.json").unlink()
    with pytest.raises(ConfigError, match=r"\['wmrl-s1'\] have not finished"):
        source_runs(source, 0)
    assert "wmrl-s1" not in [r.name for r in source_runs(source, 1)]  # its own seed: not a source


def test_a_finished_tuning_is_reused_only_with_its_model_and_its_settings(tmp_path):
    from wmrl.autoresearch.evaluation.bench_wm_tuning import finished_tuning, tuning_config
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import ConfigError, load_config, to_dict

    train = load_config(TrainConfig, None, ["seed=1"])
    config = tuning_config(train, "/models/wm", ["/a/runs/real-s0"])
    dest = tmp_path / "s1"
    dest.mkdir()
    assert finished_tuning(dest, config) is None  # not finished: tune (or resume) now
    (dest / "config.json").write_text(json.dumps(to_dict(config)))
    (dest / "run_summary.json").write_text("{}")
    with pytest.raises(ConfigError, match="without its model"):
        finished_tuning(dest, config)
    (dest / "final").mkdir()
    (dest / "final" / "config.json").write_text("{}")
    assert finished_tuning(dest, config) == dest / "final"
    # the same runs reached by another path (the bench pins their pairs by digest): reused
    moved = tuning_config(train, "/models/wm", ["/elsewhere/runs/real-s0"])
    assert finished_tuning(dest, moved) == dest / "final"
    for other in (
        tuning_config(train, "/models/wm", ["/a/runs/real-s0"], ["epochs=2"]),
        tuning_config(train, "/models/wm", ["/a/runs/real-s2"]),
        tuning_config(train, "/models/other", ["/a/runs/real-s0"]),
    ):
        with pytest.raises(ConfigError, match="tuned with other settings"):
            finished_tuning(dest, other)


def test_the_source_identity_follows_the_pairs_bytes(tmp_path):
    from wmrl.autoresearch.evaluation.bench_wm_tuning import source_identity, source_runs

    source = _fake_source(tmp_path / "src")
    runs = source_runs(source, 0)
    before = source_identity(runs)
    assert before == source_identity(runs) and all(
        i.startswith(r.name + "#") for i, r in zip(before, runs, strict=True)
    )
    with (runs[0] / "anchor_pairs.jsonl").open("a") as f:
        f.write(json.dumps({"task_id": "t", "code": "more"}) + "\n")
    after = source_identity(runs)
    assert after[0] != before[0] and after[1:] == before[1:]


def test_the_tuning_learns_the_runs_own_world_model_prompt():
    from wmrl.autoresearch.evaluation.bench_wm_tuning import DEFAULT_TUNING, tuning_config
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import ConfigError, load_config

    train = load_config(
        TrainConfig,
        None,
        [
            "seed=2",
            "tasks.overview_tokens=300",
            "world_model.overview_tokens=250",
            "world_model.code_max_chars=3000",
            "world_model.worked_example=true",
        ],
    )
    config = tuning_config(train, "/models/wm", ["/a/real-s0", "/a/wmrl-s1"], DEFAULT_TUNING)
    c = config.corpus
    assert config.model.path == "/models/wm" and config.epochs == 1 and config.seed == 2
    assert c.anchor_runs == ("/a/real-s0", "/a/wmrl-s1") and c.ids == train.tasks.ids
    assert (c.overview_tokens, c.world_model_overview_tokens, c.world_model_code_max_chars) == (
        300,
        250,
        3000,
    )
    assert c.world_model_worked_example is True
    assert tuning_config(train, "m", [], ["learning_rate=1e-4", "epochs=2"]).learning_rate == 1e-4
    with pytest.raises(ConfigError, match="epochs"):
        tuning_config(train, "m", [], ["epochs=0"])
    # another setting keeps the default one epoch
    assert tuning_config(train, "m", [], ["max_length=4096"]).epochs == 1
    # what the bench derives itself cannot be overridden (the corpus could bring a seed's pairs back)
    for key in ("corpus.anchor_runs=[/a/real-s2]", "model.path=/other", "seed=0"):
        with pytest.raises(ConfigError, match="sets the tuning"):
            tuning_config(train, "m", [], [key])
    openai = load_config(
        TrainConfig,
        None,
        ["world_model.backend.kind=openai", "world_model.backend.endpoints=[http://h:8000/v1]"],
    )
    with pytest.raises(ConfigError, match="kind=openai"):
        tuning_config(openai, "m", [])
    with pytest.raises(ConfigError, match="mledojo_root"):
        tuning_config(load_config(TrainConfig, None, ["tasks.mledojo_root=/data"]), "m", [])


def test_bench_settings_refuse_a_tuning_that_would_not_be_used_and_keep_old_benchmarks_matching():
    from dataclasses import asdict

    from wmrl.autoresearch.evaluation.bench import BenchSettings
    from wmrl.core.config import ConfigError

    plain = BenchSettings()
    # a benchmark recorded before the tuning existed holds no tuning keys: it still matches
    assert set(plain.stored()) == set(asdict(plain)) - {"wm_tuned_on", "wm_tuning"}
    tuned = BenchSettings(wm_tuned_on="/src", wm_tuning=("epochs=2",))
    assert tuned.stored()["wm_tuned_on"] == "/src" and tuned.stored()["wm_tuning"] == ("epochs=2",)
    with pytest.raises(ConfigError, match="needs wm_tuned_on"):
        BenchSettings(wm_tuning=("epochs=2",))
    with pytest.raises(ConfigError, match="epochs"):  # the stage's settings are checked up front
        BenchSettings(wm_tuned_on="/src", wm_tuning=("epochs=0",))
    with pytest.raises(ConfigError, match="wm_tuned_on"):
        BenchSettings(wm_tuned_on="  ")
    with pytest.raises(ConfigError, match="none of the modes"):  # real never loads a world model
        BenchSettings(modes=("real",), wm_tuned_on="/src")


@pytest.mark.trl
@pytest.mark.peft
@pytest.mark.bwrap
@pytest.mark.matplotlib
def test_a_bench_judges_each_seed_with_its_own_leave_one_out_world_model(
    tmp_path, tiny_autoresearch, capsys, monkeypatch
):
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.core.cli import main

    model = next(a.split("=", 1)[1] for a in tiny_autoresearch if a.startswith("model.path="))
    overrides = [a for a in tiny_autoresearch if not a.startswith("model.path=")]
    make_toy_task(tmp_path / "held", "toy-held")
    common = [
        "--seeds", "2", "--steps", "1", "--model", model, "--eval-samples", "1",
        "--eval-tasks", str(tmp_path / "held" / "toy-held"), "--no-progress",
    ]  # fmt: skip
    settings = [*overrides, "logging.progress=false"]
    source = tmp_path / "source"
    assert main(["bench", "autoresearch", "--out", str(source), "--modes", "real", *common, *settings]) == 0
    # the tiny model's 12-token replies hold no script, so its anchors record nothing: each source run
    # gets real pairs of its own (distinct scripts, executed on the runs' training task)
    for seed in (0, 1):
        _record_pairs(source / "runs" / f"real-s{seed}", tmp_path / "toy-regression", tag=f"seed {seed}")

    out = tmp_path / "tuned"
    # the tiny tokenizer's world-model prompts are longer than the stage's default max_length
    tuned = ["--wm-tuned-on", str(source), "--wm-tuning", "max_length=4096", "--wm-tuning", "epochs=2"]
    argv = ["bench", "autoresearch", "--out", str(out), "--modes", "wmrl", *common, *tuned, *settings]
    assert main(argv) == 0
    for seed, other in ((0, 1), (1, 0)):
        tuning = json.loads((out / "wm-tuned" / f"s{seed}" / "config.json").read_text())
        assert tuning["corpus"]["anchor_runs"] == [str(source / "runs" / f"real-s{other}")]
        assert tuning["epochs"] == 2 and tuning["model"]["path"] == model  # the untuned judge: the policy
        report = json.loads((out / "wm-tuned" / f"s{seed}" / "corpus_report.json").read_text())
        assert report["world_model_examples"] >= 1 and report["executions"] == 0
        run = json.loads((out / "runs" / f"wmrl-s{seed}" / "config.json").read_text())
        assert run["world_model"]["backend"]["path"] == str(out / "wm-tuned" / f"s{seed}" / "final")
    bench = json.loads((out / "bench.json").read_text())
    assert set(bench["resolved"]["wm_tuning_sources"]) == {"0", "1"}
    assert bench["resolved"]["wm_tuning_sources"]["0"][0].startswith("real-s1#")

    stamp = {
        p: p.stat().st_mtime_ns for p in [*out.rglob("run_summary.json"), *out.rglob("eval_report.json")]
    }
    assert main(argv) == 0  # finished: nothing is tuned, trained or evaluated again
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp
    # the same source typed as a relative path is the same source (its pairs are pinned by digest)
    monkeypatch.chdir(tmp_path)
    relative = [a if a != str(source) else "source" for a in argv]
    assert main(relative) == 0 and {p: p.stat().st_mtime_ns for p in stamp} == stamp
    assert json.loads((out / "bench.json").read_text())["wm_tuned_on"] == str(source)
    # --force-settings with another tuning setting: the finished tuning is not reused as if it matched
    forced = [a if a != "epochs=2" else "epochs=3" for a in argv]
    assert main([*forced, "--force-settings"]) == 2
    assert "tuned with other settings" in capsys.readouterr().err
    # the source's pairs changed: the same command is refused instead of mixing unlike world models
    with (source / "runs" / "real-s1" / "anchor_pairs.jsonl").open("a") as f:
        f.write((source / "runs" / "real-s0" / "anchor_pairs.jsonl").read_text().splitlines()[0] + "\n")
    assert main(argv) == 2
    assert "resolved.wm_tuning_sources" in capsys.readouterr().err
    # a tuning setting without a tuned world model is refused, not ignored
    assert (
        main(["bench", "autoresearch", "--out", str(tmp_path / "x"), "--wm-tuning", "epochs=1", *settings])
        == 2
    )
    assert "needs --wm-tuned-on" in capsys.readouterr().err
    # tuning on the benchmark folder itself is refused
    itself = [
        "bench",
        "autoresearch",
        "--out",
        str(source),
        "--modes",
        "wmrl",
        *common,
        "--wm-tuned-on",
        str(source),
    ]
    assert main([*itself, *settings]) == 2
    assert "the benchmark folder itself" in capsys.readouterr().err


def test_the_tunings_source_runs_do_not_depend_on_how_the_path_was_typed(tmp_path, monkeypatch):
    """An interrupted tuning resumes only with the same corpus.anchor_runs: a relative and an
    absolute spelling of the source give the same run paths."""
    from wmrl.autoresearch.evaluation.bench import BenchSettings, _tuning_sources

    _fake_source(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    spellings = ["src", "./src", str(tmp_path / "src"), f"{tmp_path}/x/../src"]
    found = [
        _tuning_sources(BenchSettings(modes=("wmrl",), wm_tuned_on=s), tmp_path / "out") for s in spellings
    ]
    assert all(f == found[0] for f in found) and all(p.is_absolute() for p in found[0][0])
