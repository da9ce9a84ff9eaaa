"""The benchmark results recorded in ``benchmarks/results/`` (the files
``docs/benchmarks/autoresearch.md`` quotes) are what their saved runs say: the table recomputed from
the run folders matches the committed ``table.json``, and each mode's held-out valid rate is the
mean of its runs' own evaluation reports."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
FOLDERS = sorted(p.parent for p in RESULTS.glob("*/bench.json"))


def test_there_are_recorded_results():
    assert FOLDERS, f"no benchmark folder with a bench.json under {RESULTS}"


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_the_committed_table_is_recomputed_from_the_saved_runs(folder):
    from wmrl.autoresearch.evaluation.bench import bench_table

    committed = json.loads((folder / "table.json").read_text())
    table = bench_table(folder)
    assert table["complete"] == committed["complete"]
    assert table["start"] == committed["start"]
    for mode, entry in committed["modes"].items():
        again = table["modes"][mode]
        assert again["seeds"] == entry["seeds"]
        for key in ("heldout_valid_rate", "heldout_avg_at_k", "reward_end", "measured_wall_s"):
            assert again[key] == pytest.approx(entry[key]), (mode, key)
        reports = [
            json.loads((folder / "runs" / f"{mode}-s{seed}" / "eval_report.json").read_text())
            for seed in entry["seeds"]
        ]
        if reports:
            assert entry["heldout_valid_rate"] == pytest.approx(
                statistics.fmean(r["valid_rate"] for r in reports)
            )
