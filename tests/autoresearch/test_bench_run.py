"""``wmrl bench autoresearch`` end to end with the tiny model: the starting policy is evaluated, every
(mode, seed) run trains and is evaluated on held-out tasks, the table is written from the saved
files, and a rerun with the same settings computes nothing again."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.trl, pytest.mark.bwrap, pytest.mark.peft, pytest.mark.matplotlib]


def test_a_bench_writes_every_report_and_a_rerun_reuses_them(tmp_path, tiny_autoresearch, capsys):
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.core.cli import main

    model = next(a.split("=", 1)[1] for a in tiny_autoresearch if a.startswith("model.path="))
    overrides = [a for a in tiny_autoresearch if not a.startswith("model.path=")]
    make_toy_task(tmp_path / "held", "toy-held")
    out = tmp_path / "bench"
    argv = [
        "bench", "autoresearch", "--out", str(out), "--modes", "real,wmrl", "--seeds", "1", "--steps", "1",
        "--model", model, "--eval-samples", "1", "--eval-tasks", str(tmp_path / "held" / "toy-held"),
        "--no-progress", *overrides, "logging.progress=false",
    ]  # fmt: skip
    assert main(argv) == 0
    start = json.loads((out / "start" / "eval_report.json").read_text())
    assert [t["task_id"] for t in start["tasks"]] == ["toy-held"]
    for mode in ("real", "wmrl"):
        run = out / "runs" / f"{mode}-s0"
        assert (run / "run_summary.json").is_file() and (run / "eval_report.json").is_file()
        assert json.loads((run / "config.json").read_text())["mode"] == mode
    table = json.loads((out / "table.json").read_text())
    assert (out / "table.md").read_text().strip()
    assert json.dumps(table)  # written from the files above (recomputed by test_bench_table)
    stamp = {p: p.stat().st_mtime_ns for p in out.rglob("eval_report.json")}
    assert main(argv) == 0  # everything is finished: nothing is trained or evaluated again
    assert {p: p.stat().st_mtime_ns for p in out.rglob("eval_report.json")} == stamp
    (out / "table.json").unlink()
    assert main(["bench", "autoresearch", "--out", str(out), "--table-only"]) == 0
    assert json.loads((out / "table.json").read_text()) == table  # what it prints it also writes
    # other settings in the same folder are refused (a table mixes only like with like)
    steps = argv.index("--steps") + 1
    assert main([*argv[:steps], "2", *argv[steps + 1 :]]) == 2
    assert "other settings (resolved.train_config.steps, steps)" in capsys.readouterr().err
    # so are the same settings after what they resolve to changed: an embedded default of the
    # training config (as a bench made by an older version recorded it) ...
    bench = out / "bench.json"
    recorded = json.loads(bench.read_text())
    assert recorded["resolved"]["train_config"]["steps"] == 1
    older = json.loads(json.dumps(recorded))
    older["resolved"]["train_config"]["grpo"]["temperature"] = 1.0
    bench.write_text(json.dumps(older))
    assert main(argv) == 2
    assert "resolved.train_config.grpo.temperature" in capsys.readouterr().err
    bench.write_text(json.dumps(recorded))
    # ... or the starting policy's files (another model saved at the same path)
    from wmrl.autoresearch.llm.tiny import save_tiny_model

    save_tiny_model(model, seed=1)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "resolved.start_model" in err and "train_config" not in err


def test_a_bench_in_pieces_stops_between_runs_and_the_rerun_adds_only_the_rest(tmp_path, tiny_autoresearch):
    from wmrl.autoresearch.evaluation.bench import BenchSettings, format_table, run_bench
    from wmrl.autoresearch.tasks.toy import make_toy_task

    model = next(a.split("=", 1)[1] for a in tiny_autoresearch if a.startswith("model.path="))
    overrides = [a for a in tiny_autoresearch if not a.startswith("model.path=")]
    make_toy_task(tmp_path / "held", "toy-held")
    settings = BenchSettings(
        modes=("real",), seeds=(0, 1), steps=1, model=model, eval_samples=1,
        eval_tasks=str(tmp_path / "held" / "toy-held"),
        train_overrides=(*overrides, "logging.progress=false"),
    )  # fmt: skip
    out = tmp_path / "bench"
    quiet = {"log": lambda line: None, "progress": False}

    # no time at all: nothing starts, and the table says the benchmark is not complete
    table = run_bench(settings, out, stop_after_s=0.0, **quiet)
    assert not (out / "start" / "eval_report.json").exists() and not (out / "runs").exists()
    assert table["complete"] is False

    # the budget is spent once the first run is evaluated: the second run does not start
    first = out / "runs" / "real-s0" / "eval_report.json"
    table = run_bench(
        settings, out, stop_after_s=60.0, clock=lambda: 1e9 if first.is_file() else 0.0, **quiet
    )
    assert first.is_file() and not (out / "runs" / "real-s1").exists()
    assert table["modes"]["real"]["seeds"] == [0] and table["complete"] is False
    assert "| real | 1 of 2 |" in format_table(table)

    stamp = {p: p.stat().st_mtime_ns for p in out.rglob("eval_report.json")}
    table = run_bench(settings, out, **quiet)  # the same settings, no budget: only the rest runs
    assert all(p.stat().st_mtime_ns == t for p, t in stamp.items())
    assert table["modes"]["real"]["seeds"] == [0, 1] and table["complete"] is True
    assert "| real | 2 |" in format_table(table)
    with pytest.raises(ValueError, match="stop_after_s"):
        run_bench(settings, out, stop_after_s=-1.0, **quiet)


def test_table_only_on_a_folder_without_a_benchmark_is_a_clear_error(tmp_path, capsys):
    from wmrl.core.cli import main

    assert main(["bench", "autoresearch", "--out", str(tmp_path / "nothing"), "--table-only"]) == 2
    assert "holds no benchmark (no bench.json)" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()  # nothing written where there was nothing
