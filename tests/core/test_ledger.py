"""Cost ledger: accumulation and the real-execution counterfactual."""

import pytest

from wmrl.core.ledger import CostLedger


def test_report_and_counterfactual():
    ledger = CostLedger(accelerators={"anchor": 1.0, "world_model": 1.0, "generation": 1.0, "update": 1.0})
    ledger.add("generation", 10.0, items=80)
    ledger.add("update", 5.0)
    ledger.add("world_model", 2.0, items=80)
    ledger.add("anchor", 8.0, items=8)  # 1 s per real execution
    ledger.count_rollouts(80)
    rep = ledger.report()
    assert rep["total"]["wall_s"] == pytest.approx(25.0)
    est = rep["real_mode_estimate"]
    assert est["wall_s"] == pytest.approx(10 + 5 + 80 * 1.0)
    assert est["ratio_wall"] == pytest.approx(95 / 25)
    assert "real-execution GRPO" in ledger.format()


def test_unknown_without_anchor_measurements():
    ledger = CostLedger()
    ledger.add("world_model", 1.0, items=4)
    assert ledger.report()["real_mode_estimate"]["wall_s"] is None
    with pytest.raises(ValueError):
        ledger.add("anchor", -1.0)


def test_measure_and_state_round_trip():
    ledger = CostLedger()
    with ledger.measure("anchor", items=2):
        pass
    other = CostLedger()
    other.load_state_dict(ledger.state_dict())
    assert other.report() == ledger.report()


def test_merged_ranks_sum_to_the_whole_run():
    """Two ranks' ledgers merge into rank-seconds; the estimate uses the run-wide per-item anchor cost."""
    held = {"anchor": 0.0, "world_model": 1.0, "generation": 1.0, "update": 1.0}
    ranks = [CostLedger(held), CostLedger(held)]
    for ledger, anchor_s, anchor_items in zip(ranks, (6.0, 0.0), (2, 0), strict=True):
        ledger.add("generation", 10.0, items=40)
        ledger.add("update", 5.0)
        ledger.add("world_model", 2.0, items=40)
        if anchor_items:
            ledger.add("anchor", anchor_s, items=anchor_items)
        ledger.count_rollouts(40)
    merged = CostLedger.merged([r.state_dict() for r in ranks])
    rep = merged.report()
    assert rep["graded_rollouts"] == 80
    assert merged.accelerators["generation"] == 2.0 and merged.accelerators["anchor"] == 0.0
    assert rep["spent"]["generation"] == {"wall_s": 20.0, "accel_s": 20.0, "items": 80, "calls": 2}
    assert rep["total"]["wall_s"] == pytest.approx(20 + 10 + 4 + 6)
    # real mode: all 80 rollouts at 3 s each (6 s / 2 items), plus both ranks' generation and update
    assert rep["real_mode_estimate"]["wall_s"] == pytest.approx(20 + 10 + 80 * 3.0)
    # one rank alone is its own merge
    assert CostLedger.merged([ranks[0].state_dict()]).report() == ranks[0].report()
    with pytest.raises(ValueError, match="at least one"):
        CostLedger.merged([])
