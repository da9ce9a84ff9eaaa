"""The GPU runs recorded in ``benchmarks/results/gpu-*/`` (quoted by ``docs/benchmarks/gpu.md``, "The GPU
check") say what their raw files say: every step's executed valid rate is the share of valid scripts
among that step's recorded executions, and every evaluation's valid rate is the share of valid
trajectories in its ``trajectories.jsonl``, seed by seed."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RUNS = sorted(p.parent for p in RESULTS.glob("gpu-*/*/gpu_check.json"))


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_there_are_recorded_gpu_runs():
    assert RUNS, f"no recorded GPU run under {RESULTS}"


@pytest.mark.parametrize("run", RUNS, ids=[f"{r.parent.name}/{r.name}" for r in RUNS])
def test_step_valid_rates_are_the_recorded_executions(run):
    for mode_dir in sorted(p.parent for p in (run / "real_lm").glob("*/anchor_pairs.jsonl")):
        valid = Counter(
            int(p["recipe"].split("@step")[1])
            for p in _rows(mode_dir / "anchor_pairs.jsonl")
            if p["status"] == "valid"
        )
        steps = [r for r in _rows(mode_dir / "metrics.jsonl") if r.get("executed/valid_rate") is not None]
        assert steps, mode_dir
        for r in steps:
            assert r["executed/valid_rate"] == pytest.approx(valid[r["step"]] / r["wmrl/executions"]), (
                mode_dir,
                r,
            )


@pytest.mark.parametrize("run", RUNS, ids=[f"{r.parent.name}/{r.name}" for r in RUNS])
def test_evaluation_valid_rates_are_the_recorded_trajectories(run):
    reports = sorted((run / "real_lm" / "eval").glob("*/eval_report.json"))
    assert reports
    for path in reports:
        report = json.loads(path.read_text())
        turns = _rows(path.parent / "trajectories.jsonl")
        by_seed = {
            seed: statistics.fmean(
                statistics.fmean(
                    t["status"] == "valid" for t in turns if t["seed"] == seed and t["task_id"] == task
                )
                for task in {t["task_id"] for t in turns if t["seed"] == seed}
            )
            for seed in report["seeds"]
        }
        assert report["valid_rate"] == pytest.approx(statistics.fmean(by_seed.values())), path
