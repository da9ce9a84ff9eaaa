"""Run directories: config, metrics with unknowns kept as null, TensorBoard, plots."""

import json

import numpy as np
import pytest
from group_design import groups_config

from wmrl.core.corrector import Corrector
from wmrl.core.debias import DebiasConfig
from wmrl.core.runlog import RunWriter, plot_run, read_metrics


def test_writes_config_and_metrics_with_unknowns(tmp_path):
    cfg = groups_config(seed=3)
    with RunWriter(tmp_path, cfg) as run:
        run.log(0, {"a": 1.0, "b": None, "c": float("nan")})
    assert json.loads((tmp_path / "config.json").read_text())["seed"] == 3
    rows = read_metrics(tmp_path)
    assert rows[0]["a"] == 1.0 and rows[0]["b"] is None and rows[0]["c"] is None


@pytest.mark.matplotlib
def test_plots_and_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    c = Corrector(groups_config(debias=DebiasConfig(min_pairs=8)))
    rng = np.random.default_rng(0)
    with RunWriter(tmp_path, c.config, report_to=["tensorboard"]) as run:
        for _ in range(10):
            true = rng.random((8, 4))
            plan = c.plan([f"{c.step_count}:{i}" for i in range(8)])
            out = c.correct(plan, true**2, np.where(plan.anchor[:, None], true, np.nan))
            run.log(c.step_count, {**out.metrics, "train/reward": float(np.nanmean(out.rewards))})
    paths = plot_run(tmp_path, c.debiaser)
    assert {p.name for p in paths} == {"calibration.png", "weights.png", "reward.png"}
    assert any((tmp_path / "tensorboard").iterdir())


def test_unknown_tracker_or_missing_package_is_a_clear_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("no wandb here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match="pip install wandb"):
        RunWriter(tmp_path, report_to=["wandb"])
    with pytest.raises(ValueError, match="unknown tracker"):
        RunWriter(tmp_path, report_to=["carrier-pigeon"])
