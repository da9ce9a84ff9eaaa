"""The copy-paste skeleton of docs/new-domain.md runs as it stands, and learns."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _skeleton() -> str:
    text = (ROOT / "docs" / "new-domain.md").read_text()
    section = text.split("## A complete domain in one file", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_skeleton_runs_and_writes_the_run(tmp_path):
    pytest.importorskip("matplotlib", reason="the run draws its plots (the viz extra)")
    namespace: dict = {"__name__": "skeleton"}
    exec(compile(_skeleton(), "skeleton.py", "exec"), namespace)
    config = namespace["ToyConfig"](steps=12)
    report = namespace["run"](config, str(tmp_path / "run"), progress=False)
    run = tmp_path / "run"
    assert report["steps"] == 12
    for name in ("config.json", "metrics.jsonl", "cost_report.json", "run_summary.json"):
        assert (run / name).is_file(), name
    assert (run / "plots" / "domain.png").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["toy/true_reward"] > rows[0]["toy/true_reward"]  # it learns
