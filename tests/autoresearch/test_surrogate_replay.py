"""``benchmarks/surrogate_replay.py``: the prequential replay on closed-form sources, and the recorded
reports are the numbers ``docs/benchmarks/method.md`` quotes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "surrogate_replay.py"
RESULTS = ROOT / "benchmarks" / "results" / "surrogate-replay-2026-12-07"
DOCS = ROOT / "docs" / "benchmarks" / "method.md"


def _script():
    spec = importlib.util.spec_from_file_location("surrogate_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Parity:
    """A language world model that reads only whether the depth is odd (0.8) or even (0.2)."""

    name = "world_model"
    role = "world_model"

    def score(self, items):
        return [0.8 if int(item.code.split("max_depth=")[1][0]) % 2 else 0.2 for item in items]


def _rows(step: int, depths: list[int], task: str = "t") -> list[dict]:
    return [
        {
            "task_ref": task,
            "code": f"from sklearn.tree import DecisionTreeRegressor\nmodel = DecisionTreeRegressor(max_depth={d})\n",
            "recipe": f"anchor@step{step}",
            "reward": d / 10,
        }
        for d in depths
    ]


def test_the_replay_grades_new_scripts_before_learning_them_and_pools_distinct_runs(tmp_path):
    from wmrl.autoresearch.worldmodel.surrogate import SurrogateConfig

    module = _script()
    steps = [_rows(1, [1, 2, 3, 4]), _rows(2, [1, 2, 5, 6]), _rows(3, [3, 4, 7, 8]), _rows(4, [5, 6, 9, 8])]
    result = module.replay(_Parity(), steps, SurrogateConfig(enabled=True, k=1, min_pairs=4))
    rows = result["rows"]
    assert len(rows) == 9  # the repeats (depths 1, 2 at step 2; 3, 4 at step 3...) are the memory's
    assert [r["step"] for r in rows] == [1, 1, 1, 1, 2, 2, 3, 3, 4]
    # the language model is measured after the first step's 4 executions (min_pairs)
    assert all(not r["measured"] for r in rows[:4]) and all(r["measured"] for r in rows[4:])
    assert rows[0]["surrogate_raw"] is None  # nothing learned before the first step: unknown
    assert result["summary"]["graded"] == 5
    assert rows[4]["surrogate_raw"] is not None  # learned from step 1's scripts
    # a run recorded twice (steps with no new script aside) counts once when pooled
    for name, data in (("a", steps), ("b", [*steps[:2], _rows(3, [1]), *steps[2:]])):
        folder = tmp_path / name
        folder.mkdir()
        lines = [json.dumps(row) for step in data for row in step]
        (folder / "anchor_pairs.jsonl").write_text("\n".join(lines) + "\n")
    assert module.fingerprint(module.load_pairs(tmp_path / "a")) == module.fingerprint(
        module.load_pairs(tmp_path / "b")
    )
    pooled = module.summarise({str(tmp_path / "a"): result, str(tmp_path / "b"): result})
    assert pooled["distinct_runs"] == [str(tmp_path / "a")]
    assert module.pooled([0.1, 0.3])["mean"] == pytest.approx(0.2)


def _interval(entry: dict) -> str:
    low, high = entry["ci95"]
    sign = lambda x: f"+{x:.3f}" if x >= 0 else f"−{-x:.3f}"  # noqa: E731
    return f"{sign(entry['mean'])} [{sign(low)}, {sign(high)}] ({entry['runs']} runs)"


@pytest.mark.parametrize("report", ["warm", "base"])
def test_the_documented_replay_is_the_recorded_one(report):
    path = RESULTS / f"{report}.json"
    recorded = json.loads(path.read_text())
    docs = DOCS.read_text()
    mse = recorded["mse_fused_minus_lm"]
    assert _interval(mse) in docs.replace("**", ""), _interval(mse)
    assert len(recorded["distinct_runs"]) == 10
    if report == "warm":
        assert f"10 distinct runs, {recorded['graded']}\nscripts graded" in docs


def test_the_documented_training_run_is_the_recorded_one():
    """docs/benchmarks/method.md's table of the surrogate in training quotes the recorded runs."""
    import numpy as np

    from wmrl.core.bench.intervals import ci95

    docs = (ROOT / "docs" / "benchmarks" / "method.md").read_text()
    section = docs[docs.index("### In training: the surrogate on the real LM") :]
    section = section[: section.index("\n### ")] if "\n### " in section else section
    recorded = {
        "wmrl_surrogate": ROOT / "benchmarks" / "results" / "real-lm-surrogate-2026-12-07",
        "wmrl_flat": ROOT / "benchmarks" / "results" / "real-lm-2026-12-06",
        "real_cache": ROOT / "benchmarks" / "results" / "real-lm-2026-12-06",
    }
    runs = {
        arm: [json.loads((folder / f"{arm}-s{seed}.json").read_text()) for seed in range(3)]
        for arm, folder in recorded.items()
    }
    position = {arm: [r["eval"]["position"] for r in rs] for arm, rs in runs.items()}
    for arm, rs in runs.items():
        line = next(x for x in section.splitlines() if x.startswith(f"| `{arm}`"))
        assert ", ".join(f"{p:.3f}" for p in position[arm]) in line, line
        assert f"| {np.mean(position[arm]):.3f} |" in line, line
        executions = ", ".join(str(int(r["spent"]["anchor"]["items"])) for r in rs)
        assert executions in line, line
        if arm != "wmrl_surrogate":
            diff = np.subtract(position["wmrl_surrogate"], position[arm])
            assert f"{np.mean(diff):+.3f} ± {ci95(list(diff)):.3f}".replace("-", "−") in line, line
    # the surrogate was on, and learned every execution of its run
    for r in runs["wmrl_surrogate"]:
        assert "world_model.surrogate.enabled=true" in r["settings"]
        assert r["surrogate_learned"][-1] == r["spent"]["anchor"]["items"]
