"""The recorded verl asynchrony benchmark (``benchmarks/results/verl-async-cpu-2026-12-07``) is what
``docs/benchmarks/scale-out.md`` quotes, and says what the docs say of it."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "verl-async-cpu-2026-12-07" / "summary.json"
DOC = ROOT / "docs" / "benchmarks" / "scale-out.md"


def _total(runs: list[dict], lag: int, workers: int) -> float:
    totals = [sum(r["step_s"]) for r in runs if (r["lag"], r["workers"]) == (lag, workers)]
    return sum(totals) / len(totals)


def test_the_docs_quote_the_recorded_verl_asynchrony_run():
    recorded = json.loads(RESULT.read_text())
    summary, runs, doc = recorded["summary"], recorded["runs"], DOC.read_text()
    assert recorded["latency_s"] == 8.0 and recorded["steps"] == 6 and recorded["repeats"] == 2
    for name, (lag, workers) in {"lag0-w1": (0, 1), "lag1-w1": (1, 1), "lag2-w2": (2, 2)}.items():
        arm = summary[name]
        wait = "—" if arm["middle_wait_s_mean"] is None else f"{arm['middle_wait_s_mean']:.2f}"
        row = (
            f"| {arm['middle_step_s_mean']:.2f} | {wait} | {arm['sync_over_this']:.2f}x "
            f"| {_total(runs, lag, workers):.1f} | {_total(runs, 0, 1) / _total(runs, lag, workers):.2f}x |"
        )
        assert row in doc, (name, row)
    # every run finished its six steps, and the asynchronous ones trained landed rows
    assert all(r["exit_code"] == 0 and r["steps"] == [1, 2, 3, 4, 5, 6] for r in runs)
    for r in runs:
        if r["lag"] > 0:
            assert all(n and n > 0 for n in r["late_rows"][r["lag"] :]), r["late_rows"]
    # a synchronous run logs no wait: unknown, not 0
    assert summary["lag0-w1"]["middle_wait_s_mean"] is None
    # what the docs conclude: lag 1 with one worker is bounded by one pass, two workers beat it
    assert summary["lag1-w1"]["middle_step_s_mean"] > 0.9 * recorded["latency_s"]
    assert summary["lag2-w2"]["middle_step_s_mean"] < summary["lag1-w1"]["middle_step_s_mean"]
