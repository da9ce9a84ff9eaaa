"""The verl plug-in, run against the real verl package in its own environment (``.venv-verl``).

verl 0.9.1 needs numpy>=2; the main environment needs numpy<2 (robosuite), so the verl tests
(``tests/verl_env/``) run in the second environment that ``.ci/setup`` builds. This test runs them
there and fails with their output when any fails. The layering rules hold in that environment
too: its WMRL is the same source tree, installed editable without extras.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from wmrl.core.engines.verl.config import VerlConfig

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-verl" / "bin" / "python"


def test_the_verl_config_is_validated_without_verl():
    from wmrl.core.config import ConfigError

    assert VerlConfig(world_model="m:f", anchor="m:g").mode.value == "wmrl"
    with pytest.raises(ConfigError, match="anchor must be 'module:function'"):
        VerlConfig(world_model="m:f")
    assert VerlConfig(mode="world_model", world_model="m:f").anchor is None
    with pytest.raises(RuntimeError, match="WMRL_VERL_CONFIG"):
        os.environ.pop("WMRL_VERL_CONFIG", None)
        VerlConfig.from_env()


def _run_verl_env_tests(*pytest_args: str, timeout: int) -> None:
    """Run ``tests/verl_env`` in ``.venv-verl`` with ``pytest_args``; fail with their output unless all pass."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [str(PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args, "tests/verl_env"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]


@pytest.mark.verl
def test_the_plugin_against_real_verl_in_its_environment():
    _run_verl_env_tests(timeout=900)


@pytest.mark.slow
@pytest.mark.verl
def test_a_whole_verl_step_on_cpu_in_its_environment():
    """The slow verl tests (``tests/verl_env/test_verl_cpu_step.py``: a whole PPO step with WMRL through
    ``verl.trainer.main_ppo`` and vLLM's CPU build, then a resume), which the run above deselects."""
    _run_verl_env_tests("-m", "slow", timeout=1500)


def test_the_4b_example_names_factories_that_exist():
    import importlib
    import sys

    from wmrl.core.config import load_config

    config = load_config(VerlConfig, ROOT / "examples" / "verl" / "wmrl_4b.yaml")
    assert config.mode.value == "wmrl" and config.corrector.scheduler.fraction == 0.1
    sys.path.insert(0, str(ROOT))
    try:
        for spec in (config.world_model, config.anchor, config.item_fn):
            module, _, name = spec.partition(":")
            assert callable(getattr(importlib.import_module(module), name))
    finally:
        sys.path.remove(str(ROOT))
    launch = (ROOT / "examples" / "verl" / "launch_4b.sh").read_text()
    for needed in (
        "trainer.v1.trainer_mode=wmrl_sync",
        "algorithm.adv_estimator=wmrl",
        "reward.reward_manager.name=wmrl",
    ):
        assert needed in launch


def test_the_verl_pipeline_takes_asynchronous_anchors(monkeypatch):
    """verl's trainer keeps a batch's executed rows and trains them at the landing step
    (core/engines/verl/late_rows.py); its pipeline is built with the lag (it was refused until 2026-12-07)."""
    import sys
    import types

    from wmrl.core import as_source
    from wmrl.core.corrector import CorrectorConfig
    from wmrl.core.engines.verl.trainer import build_pipeline
    from wmrl.core.late import AsynchronyConfig

    module = types.ModuleType("wmrl_verl_test_sources")
    module.make_anchor = lambda: as_source(lambda items: [0.0 for _ in items], "anchor", "zero")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    config = VerlConfig(
        world_model="m:f",
        anchor="wmrl_verl_test_sources:make_anchor",
        corrector=CorrectorConfig(asynchrony=AsynchronyConfig(max_anchor_lag=2)),
    )
    pipeline = build_pipeline(config)
    assert pipeline.asynchrony.max_anchor_lag == 2
    pipeline.close()
