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
