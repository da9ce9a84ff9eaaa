"""``wmrl bench autoresearch``'s command line runs the benchmark ``BenchSettings`` describes: a number
not given is ``--quick``'s or else the dataclass's own default, one given is used as given (0 refused)."""

from __future__ import annotations

import dataclasses

import pytest

import wmrl.autoresearch.evaluation.bench as bench
from wmrl.core.cli import main


@pytest.fixture
def ran(monkeypatch):
    """The settings ``run_bench`` was called with (it returns an empty, incomplete table)."""
    seen: list = []

    def record(settings, out, **kwargs):
        seen.append(settings)
        return {"complete": False, "modes": {}}

    monkeypatch.setattr(bench, "run_bench", record)
    monkeypatch.setattr(bench, "format_table", lambda table: "")
    return seen


def _default(name: str):
    return next(f.default for f in dataclasses.fields(bench.BenchSettings) if f.name == name)


def test_no_numbers_given_is_the_dataclass_default(tmp_path, ran):
    assert main(["bench", "autoresearch", "--out", str(tmp_path / "b")]) == 0
    (settings,) = ran
    assert settings == bench.BenchSettings()
    assert (settings.seeds, settings.steps, settings.eval_samples) == (
        _default("seeds"),
        _default("steps"),
        _default("eval_samples"),
    )


def test_quick_is_quick_and_a_given_number_wins(tmp_path, ran):
    assert main(["bench", "autoresearch", "--quick", "--out", str(tmp_path / "b")]) == 0
    assert main(["bench", "autoresearch", "--quick", "--steps", "3", "--out", str(tmp_path / "c")]) == 0
    quick, mixed = ran
    assert (quick.seeds, quick.steps, quick.eval_samples) == (
        bench.QUICK["seeds"],
        bench.QUICK["steps"],
        bench.QUICK["eval_samples"],
    )
    assert (mixed.seeds, mixed.steps, mixed.eval_samples) == (
        bench.QUICK["seeds"],
        3,
        bench.QUICK["eval_samples"],
    )


@pytest.mark.parametrize("flag", ["--steps", "--seeds", "--eval-samples"])
def test_zero_is_refused_not_replaced_by_the_default(tmp_path, ran, capsys, flag):
    assert main(["bench", "autoresearch", flag, "0", "--out", str(tmp_path / "b")]) == 2
    assert not ran and "must be" in capsys.readouterr().err
