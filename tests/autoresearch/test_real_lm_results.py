"""The real-LM arms of issue 32 recorded in ``benchmarks/results/real-lm-2026-12-06/`` (quoted by
``docs/benchmarks/autoresearch.md``): each summary agrees with its run's own files, and the numbers
the docs quote are the files' numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "real-lm-2026-12-06"
#: seeds 1 and 2 of the gain fusion's arm, run the next day with the same command
GAIN = ROOT / "benchmarks" / "results" / "real-lm-gain-2026-12-07"
RUNS = sorted(p.stem for p in RESULTS.glob("*-s[0-9].json"))
ALL_RUNS = [(RESULTS, name) for name in RUNS] + [(GAIN, p.stem) for p in sorted(GAIN.glob("*-s[0-9].json"))]


def test_the_recorded_runs_are_there():
    assert {"real-s0", "real_cache-s0", "paper-s0", "wmrl-s0", "wmrl_flat-s0"} <= set(RUNS)


@pytest.mark.parametrize(("folder", "name"), ALL_RUNS, ids=[f"{f.name}/{n}" for f, n in ALL_RUNS])
def test_each_summary_agrees_with_its_run(folder, name):
    summary = json.loads((folder / f"{name}.json").read_text())
    cost = json.loads((folder / name / "cost_report.json").read_text())
    report = json.loads((folder / f"{name}.eval.json").read_text())
    config = json.loads((folder / name / "config.json").read_text())
    assert summary["spent"] == cost["spent"]
    assert summary["eval"]["position"] == report["overall"]
    assert config["seed"] == summary["seed"]
    rows = [json.loads(line) for line in (folder / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "wmrl/step" in r]
    assert len(steps) == 8 and len(summary["executed_position"]) == 8
    # the fusion each arm names is the one its run resolved
    expected = {"wmrl": "gain", "wmrl_flat": "none", "paper": "paper"}.get(summary["arm"])
    if expected is not None:
        assert config["corrector"]["fusion"]["mode"] == expected


def test_the_docs_quote_the_files():
    docs = (ROOT / "docs" / "benchmarks" / "autoresearch.md").read_text()

    def position(name: str) -> str:
        return f"{json.loads((RESULTS / f'{name}.json').read_text())['eval']['position']:.3f}"

    def executions(name: str) -> int:
        return json.loads((RESULTS / f"{name}.json").read_text())["spent"]["anchor"]["items"]

    assert f"default {position('wmrl_flat-s0')}, {position('wmrl_flat-s1')}" in docs
    assert f"({executions('wmrl_flat-s0')}, {executions('wmrl_flat-s1')} executions)" in docs
    assert f"`real` {position('real-s0')}, {position('real-s1')}" in docs
    assert f"`real_cache` {position('real_cache-s0')}, {position('real_cache-s1')}" in docs
    assert f"({executions('real_cache-s0')}, {executions('real_cache-s1')})" in docs
    # seed 2, as far as it has run
    assert f"Seed 2: default {position('wmrl_flat-s2')} ± " in docs
    assert f"`real` {position('real-s2')} ± " in docs
    assert f"paper {position('paper-s2')} ± " in docs
    assert f"({executions('wmrl_flat-s2')} executions)" in docs
    assert f"`real_cache` {position('real_cache-s2')} ± " in docs
    assert f"({executions('real_cache-s2')}) |" in docs
    # the gain fusion on three seeds: each per-seed row quotes its run
    for folder, name in [(RESULTS, "wmrl-s0"), (GAIN, "wmrl-s1"), (GAIN, "wmrl-s2")]:
        run = json.loads((folder / f"{name}.json").read_text())
        row = f"| `wmrl_gain` | {run['seed']} | {run['eval']['position']:.3f} ± {run['eval']['position_sem']:.3f} |"
        assert row in docs, row
        assert f" | {run['spent']['anchor']['items']} | {int(run['memory_hits'])} | " in docs
