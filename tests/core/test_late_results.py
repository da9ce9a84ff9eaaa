"""The asynchronous-anchor results recorded in ``benchmarks/results/async-anchors-2026-12-06/`` (quoted by
``docs/benchmarks/method.md``): the files are the sweep's, on the seeds the docs name, and the docs quote
their numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "async-anchors-2026-12-06"
DOC = ROOT / "docs" / "benchmarks" / "method.md"


def _rows(name: str) -> dict[str, dict]:
    return {
        row["label"]: row for row in json.loads((RESULTS / f"{name}.json").read_text())["lag_sweep"]["rows"]
    }


@pytest.mark.parametrize(
    ("name", "first_seed", "n", "variants"), [("tune", 400, 10, 1), ("v1", 500, 20, 1), ("v0", 500, 20, 0)]
)
def test_each_file_is_the_sweep_on_its_seeds(name, first_seed, n, variants):
    data = json.loads((RESULTS / f"{name}.json").read_text())
    assert data["seeds"] == list(range(first_seed, first_seed + n))
    assert data["config"]["variants"] == variants
    rows = _rows(name)
    assert rows["lag 0"]["paired_vs_lag0"] == 0.0
    assert all(v == 1.0 for v in rows["lag 0"]["modelled_speedup_vs_sync"].values())
    # the tuning run chose the default: it ran the previous one ("correction") on every lag
    default, other = ("correction", "executed") if name == "tune" else ("executed", "correction")
    assert rows["lag 0"]["late_update"] == default and rows[f"lag 2, {other}"]["late_update"] == other
    assert rows["lag 2, full"]["late_update"] == "full" and rows["lag 2, IS clip 2"]["importance_clip"] == 2.0


@pytest.mark.parametrize("name", ["v1", "v0"])
def test_the_docs_quote_the_files(name):
    doc = DOC.read_text()
    for label, row in _rows(name).items():
        paired = (
            "—" if label == "lag 0" else f"{row['paired_vs_lag0']:+.3f} ± {row['paired_vs_lag0_ci95']:.3f}"
        )
        line = (
            f"| {label} | {row['final_true_reward']:.3f} ± {row['final_true_reward_ci95']:.3f} | {paired} |"
        )
        assert line in doc, line


def test_the_docs_quote_the_tuning_choice():
    doc = DOC.read_text()
    rows = _rows("tune")
    for label in ("lag 2", "lag 2, executed", "lag 2, full", "lag 2, IS clip 2"):
        row = rows[label]
        assert f"{row['paired_vs_lag0']:+.3f} ± {row['paired_vs_lag0_ci95']:.3f}" in doc, label


def test_the_docs_quote_the_measured_hpo_runs():
    arms = json.loads((RESULTS / "hpo" / "summary.json").read_text())["arms"]
    doc = DOC.read_text()
    assert set(arms) == {"real", "world_model", "wmrl", "wmrl_lag1", "wmrl_lag2"}
    for name, arm in arms.items():
        assert len(arm["runs"]) == 3 and {r["seed"] for r in arm["runs"]} == {0, 1, 2}
        assert f"| `{name}` | {arm['wall_s']:.1f} ± {arm['wall_s_ci95']:.1f} |" in doc, name
    lag1 = arms["wmrl_lag1"]
    assert f"{lag1['speedup_vs_wmrl']:.2f}× ± {lag1['speedup_vs_wmrl_ci95']:.2f}" in doc
