"""``wmrl bench autoresearch``'s table is computed from the runs it saved: an entry recomputed by hand
from the same files (the run folders' reports and logs) matches, and an unfinished run is left out
(unknown, not zero)."""

from __future__ import annotations

import json
import statistics

import pytest


def _run(folder, *, mode, rewards, valid_rate, overall, wall, realised):
    folder.mkdir(parents=True)
    rows = [
        {
            "step": i + 1,
            "reward": r,
            **({"wmrl/anchor_fraction_realised": realised} if realised is not None else {}),
        }
        for i, r in enumerate(rewards)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "run_summary.json").write_text(json.dumps({"wall_s": wall}))
    spent = {"generation": {"wall_s": wall / 2}, "anchor": {"wall_s": wall / 4}}
    cost = {"mode": mode, "spent": spent, "total": {"accel_s": 0.0}, "steps": len(rewards)}
    (folder / "cost_report.json").write_text(json.dumps(cost))
    (folder / "eval_report.json").write_text(json.dumps({"valid_rate": valid_rate, "overall": overall}))


def test_one_entry_recomputed_from_the_saved_runs(tmp_path):
    from wmrl.autoresearch.evaluation.bench import bench_table, modelled_cost

    out = tmp_path / "bench"
    seeds = {0: (0.25, 0.10, 300.0), 1: (0.50, 0.30, 320.0), 2: (0.75, 0.35, 310.0)}
    for seed, (valid, overall, wall) in seeds.items():
        rewards = [0.1 * seed, 0.2, 0.3, 0.4 + seed / 10]
        _run(out / "runs" / f"wmrl-s{seed}", mode="wmrl", rewards=rewards, valid_rate=valid, overall=overall,
             wall=wall, realised=0.5)  # fmt: skip
        _run(out / "runs" / f"real-s{seed}", mode="real", rewards=rewards, valid_rate=valid / 2, overall=overall,
             wall=2 * wall, realised=None)  # fmt: skip
    (out / "runs" / "wmrl-s3").mkdir()  # interrupted: no summary, no cost report
    (out / "bench.json").write_text(json.dumps({"modes": ["real", "wmrl"]}))

    table = bench_table(out)
    entry = table["modes"]["wmrl"]
    assert entry["seeds"] == [0, 1, 2]  # the unfinished seed is not counted
    valid = [seeds[s][0] for s in (0, 1, 2)]
    assert entry["heldout_valid_rate"] == pytest.approx(statistics.fmean(valid))
    assert entry["heldout_valid_rate_sem"] == pytest.approx(statistics.stdev(valid) / len(valid) ** 0.5)
    # reward at the end: the last quarter of each run's logged steps (here its last step), over seeds
    assert entry["reward_end"] == pytest.approx(statistics.fmean([0.4 + s / 10 for s in (0, 1, 2)]))
    assert entry["reward_start"] == pytest.approx(statistics.fmean([0.1 * s for s in (0, 1, 2)]))
    assert entry["measured_wall_s"] == pytest.approx(310.0)
    assert entry["measured_stream_wall_s"]["generation"] == pytest.approx(155.0)
    assert entry["anchor_fraction_realised"] == 0.5
    assert entry["modelled_relative_cost"] == pytest.approx((269 + 0.5 * (883 - 269)) / 883)
    assert modelled_cost(None) is None
    # real mode executes everything; its measured wall time is the reference of the ratio
    assert table["modes"]["real"]["anchor_fraction_realised"] == 1.0
    assert entry["measured_wall_vs_real"] == pytest.approx(0.5)
    assert table["start"] is None  # the starting policy was not evaluated: unknown


def test_the_held_out_columns_count_the_evaluated_runs_only(tmp_path):
    """A trained run whose evaluation has not run yet (a benchmark in pieces) counts in ``seeds``,
    not in the held-out means, and the table's seeds cell says so."""
    from wmrl.autoresearch.evaluation.bench import bench_table, format_table

    out = tmp_path / "bench"
    for seed, valid in ((0, 0.2), (1, 0.4), (2, 0.9)):
        _run(out / "runs" / f"wmrl-s{seed}", mode="wmrl", rewards=[0.1, 0.2], valid_rate=valid, overall=0.1,
             wall=100.0, realised=0.5)  # fmt: skip
    (out / "runs" / "wmrl-s2" / "eval_report.json").unlink()
    (out / "runs" / "wmrl-s1-old").mkdir()  # a renamed copy is not a run (and does not crash the table)
    (out / "bench.json").write_text(json.dumps({"modes": ["wmrl"], "seeds": [0, 1, 2]}))
    table = bench_table(out)
    entry = table["modes"]["wmrl"]
    assert entry["seeds"] == [0, 1, 2] and entry["heldout_seeds"] == [0, 1]
    assert entry["heldout_valid_rate"] == pytest.approx(0.3)
    assert table["complete"] is False
    assert "| wmrl | 3 (held-out: 2) |" in format_table(table)


def test_the_calibration_columns_start_after_the_first_isotonic_fit(tmp_path):
    """Step t's prequential numbers score the map fitted before its pairs (row t-1's ``calibrated``):
    the steps measured with the identity map (calibrated = raw, reduction 0) are left out of both
    sides, so the raw → calibrated comparison is over the same steps."""
    from wmrl.autoresearch.evaluation.bench import bench_table

    out = tmp_path / "bench"
    run = out / "runs" / "wmrl-s0"
    _run(
        run, mode="wmrl", rewards=[0.1, 0.2, 0.3, 0.4], valid_rate=0.5, overall=0.2, wall=100.0, realised=0.5
    )
    steps = [  # (calibrated after the step's refit, raw MSE, calibrated MSE, bias reduction)
        (0.0, 0.40, 0.40, 0.0),  # identity map (nothing fitted yet)
        (1.0, 0.30, 0.30, 0.0),  # still measured with the identity: the first fit comes after
        (1.0, 0.20, 0.10, 0.5),
        (1.0, 0.16, 0.12, 0.25),
    ]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for row, (fitted, raw, cal, reduction) in zip(rows, steps, strict=True):
        row.update({"wmrl/calibrated": fitted, "wmrl/prequential_mse_raw": raw,
                    "wmrl/prequential_mse_calibrated": cal, "wmrl/bias_reduction": reduction})  # fmt: skip
    rows.insert(2, {"step": 2, "loss": 0.1})  # a row of another logger in between changes nothing
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "bench.json").write_text(json.dumps({"modes": ["wmrl"], "seeds": [0]}))
    numbers = bench_table(out)["modes"]["wmrl"]["runs"][0]
    assert numbers["calibration_steps"] == 2
    assert numbers["prequential_mse_raw"] == pytest.approx((0.20 + 0.16) / 2)
    assert numbers["prequential_mse_calibrated"] == pytest.approx((0.10 + 0.12) / 2)
    assert numbers["bias_reduction"] == pytest.approx((0.5 + 0.25) / 2)
    for row in rows:  # a run whose map never got fitted measured no calibration: unknown, not 0
        row["wmrl/calibrated"] = 0.0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    numbers = bench_table(out)["modes"]["wmrl"]["runs"][0]
    assert numbers["calibration_steps"] == 0 and numbers["prequential_mse_calibrated"] is None
