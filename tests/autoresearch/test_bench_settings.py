"""``wmrl bench autoresearch``'s settings: what each run's own settings would silently override is
refused; a folder left with only the ``bench.json`` of an attempt that failed before any work does
not bind the corrected command; the held-out evaluations run where the training runs run."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("override", ["steps=50", "seed=7", "mode=real", "model.path=smollm2", " steps = 9"])
def test_a_train_override_of_the_benchs_own_settings_is_refused(override):
    from wmrl.autoresearch.evaluation.bench import BenchSettings
    from wmrl.core.config import ConfigError

    with pytest.raises(ConfigError, match="bench's own settings"):
        BenchSettings(train_overrides=(override,))
    BenchSettings(train_overrides=("model.device=cpu", "learning_rate=1e-4"))  # not the bench's


def test_a_first_attempt_that_did_no_work_does_not_bind_the_next(tmp_path):
    from wmrl.autoresearch.evaluation.bench import BenchSettings, run_bench

    out = tmp_path / "bench"
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(Exception) as first:
        run_bench(BenchSettings(model=missing), out, progress=False)
    assert "other settings" not in str(first.value)
    assert (out / "bench.json").is_file() and not (out / "start").exists()
    # corrected settings (here: still a missing model, other tasks): the same error, not a refusal
    with pytest.raises(Exception) as second:
        run_bench(BenchSettings(model=missing, eval_samples=3), out, progress=False)
    assert "other settings" not in str(second.value) and type(second.value) is type(first.value)
    # once the folder holds work, other settings are refused
    (out / "start").mkdir()
    from wmrl.core.config import ConfigError

    with pytest.raises(ConfigError, match="other settings"):
        run_bench(BenchSettings(model=missing), out, progress=False)


def test_the_held_out_evaluations_run_where_the_runs_run():
    from wmrl.autoresearch.evaluation.bench import _eval_placement
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import load_config

    train = load_config(
        TrainConfig,
        None,
        [
            "model.device=cuda",
            "sandbox.backend=subprocess",
            "sandbox.memory_limit_mb=4096",
            "sandbox.workers=2",
            "sandbox.gpus=[0,1]",
            "tasks.mledojo_root=/data/mledojo",
        ],
    )
    where = _eval_placement(train)
    assert where["device"] == "cuda" and where["backend"] == "subprocess"
    assert (where["memory_limit_mb"], where["workers"], where["gpus"]) == (4096, 2, (0, 1))
    assert where["mledojo_root"] == "/data/mledojo" and where["data_dir"] is None
    import inspect

    from wmrl.autoresearch.evaluation.run import evaluate_policy

    assert set(where) <= set(inspect.signature(evaluate_policy).parameters)


def test_with_a_ray_pool_the_evaluations_keep_their_local_concurrency():
    """The runs' ``sandbox.workers`` is then the cluster's slot count: not for this machine."""
    from wmrl.autoresearch.evaluation.bench import _eval_placement
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import load_config

    train = load_config(
        TrainConfig,
        None,
        ["sandbox.pool=ray", "sandbox.backend=bwrap", "sandbox.workers=24", "sandbox.ray.slots=24"],
    )
    where = _eval_placement(train)
    assert "workers" not in where and "gpus" not in where and where["backend"] == "bwrap"
