"""``wmrl bench cost``: a run's measured costs against a measured real run, ratios from the files."""

from __future__ import annotations

import json

import pytest

from wmrl.core.bench.cost_compare import compare_costs, format_comparison
from wmrl.core.cli import main


def _run(folder, mode, steps, wall, streams, estimate=None):
    folder.mkdir(parents=True)
    spent = {k: {"wall_s": w, "accel_s": a, "items": n, "calls": 1} for k, (w, a, n) in streams.items()}
    cost = {
        "mode": mode,
        "steps": steps,
        "spent": spent,
        "total": {
            "wall_s": sum(w for w, _, _ in streams.values()),
            "accel_s": sum(a for _, a, _ in streams.values()),
        },
        "real_mode_estimate": {"wall_s": estimate},
    }
    (folder / "cost_report.json").write_text(json.dumps(cost))
    (folder / "run_summary.json").write_text(
        json.dumps({"wall_s": wall, "wall_s_total": wall, "steps": steps})
    )
    return folder


def test_ratios_are_the_measured_ones(tmp_path):
    run = _run(
        tmp_path / "wmrl",
        "wmrl",
        10,
        50.0,
        {"anchor": (20.0, 40.0, 40), "world_model": (10.0, 10.0, 160)},
        90.0,
    )
    real = _run(tmp_path / "real", "real", 10, 100.0, {"anchor": (90.0, 180.0, 160)})
    out = compare_costs(run, real)
    assert out["per_step"] is False
    assert out["measured"]["wall_ratio"] == pytest.approx(2.0)
    assert out["measured"]["compute_ratio"] == pytest.approx(3.0)
    assert out["measured"]["accel_ratio"] == pytest.approx(180.0 / 50.0)
    assert out["measured"]["execution_ratio"] == pytest.approx(4.0)
    text = format_comparison(out)
    assert "wall 2.00x" in text and "a model, not a measurement" in text


def test_runs_of_different_lengths_are_compared_per_step(tmp_path):
    run = _run(tmp_path / "wmrl", "wmrl", 5, 50.0, {"anchor": (20.0, 0.0, 10)})
    real = _run(tmp_path / "real", "real", 10, 100.0, {"anchor": (90.0, 0.0, 80)})
    out = compare_costs(run, real)
    assert out["per_step"] is True
    assert out["measured"]["wall_ratio"] == pytest.approx(1.0)  # 10 s a step each
    assert out["measured"]["accel_ratio"] is None  # 0 / 0 is unknown, not 0
    assert "per step" in format_comparison(out)


def test_the_command_refuses_a_reference_that_is_not_real(tmp_path, capsys):
    run = _run(tmp_path / "a", "wmrl", 5, 50.0, {"anchor": (20.0, 0.0, 10)})
    other = _run(tmp_path / "b", "world_model", 5, 10.0, {"world_model": (5.0, 0.0, 80)})
    assert main(["bench", "cost", str(run), "--against", str(other)]) == 2
    assert "compare against a mode=real run" in capsys.readouterr().err
    assert main(["bench", "cost", str(tmp_path / "missing"), "--against", str(run)]) == 2
