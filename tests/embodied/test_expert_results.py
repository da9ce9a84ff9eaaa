"""The scripted expert's numbers recorded in ``benchmarks/results/expert-parity-2026-12-06/`` and
``expert-sft-2026-12-06/`` are the ones ``docs/benchmarks/embodied.md`` quotes."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARITY = ROOT / "benchmarks" / "results" / "expert-parity-2026-12-06"
SFT = ROOT / "benchmarks" / "results" / "expert-sft-2026-12-06"


def _rate(k: int, n: int, interval: list[float]) -> str:
    return f"{k}/{n} = {100 * k / n:.0f}% [{100 * interval[0]:.0f}, {100 * interval[1]:.0f}]"


def test_the_parity_table_is_the_recorded_runs():
    docs = (ROOT / "docs" / "benchmarks" / "embodied.md").read_text()
    ours = json.loads((PARITY / "ours.json").read_text())["episodes"]
    upstream = {
        (e["task"], e["state"]): e for e in json.loads((PARITY / "upstream.json").read_text())["episodes"]
    }
    assert len(ours) == len(upstream) == 350
    differ = [e for e in ours if e["success"] != upstream[(e["task"], e["state"])]["success"]]
    assert f"{len(ours) - len(differ)} of {len(ours)} paired episodes" in docs  # 347 of 350
    for row in json.loads((PARITY / "parity.json").read_text())["rows"]:
        line = next(x for x in docs.splitlines() if x.startswith(f"| {row['task']} ") and "%" in x)
        assert _rate(row["success_a"], row["n"], row["wilson_a"]) in line, line
        assert _rate(row["success_b"], row["n"], row["wilson_b"]) in line, line
        kept = sum(e["success"] for e in ours if e["task"] == row["task"])
        assert kept == row["success_a"]
    # the three unscripted tasks, through wmrl eval libero
    report = json.loads((PARITY / "eval-unscripted" / "eval_info.json").read_text())
    assert report["overall"]["pc_success"] == 0.0 and report["overall"]["n_episodes"] == 30


def test_the_sft_paragraph_is_the_recorded_run():
    docs = (ROOT / "docs" / "benchmarks" / "embodied.md").read_text()
    record = json.loads((SFT / "record.json").read_text())
    kept, total = record["kept"], len(record["episodes"])
    assert f"kept {kept} of {total}" in docs
    report = json.loads((SFT / "eval_info.json").read_text())
    successes = sum(e["success"] for e in report["per_episode"])
    assert f"succeeded {successes} times" in docs and report["overall"]["n_episodes"] == 10
