"""The commands ``benchmarks/gpu_real_lm.py`` runs on a GPU machine are valid ``wmrl`` commands.

A GPU session is short and rare: a typo in one of its command lines would waste it. Every command
of the GPU plan and of the CPU rehearsal plan is resolved here with ``--print-config`` (the same
parser and validation the run itself goes through), and the settings that matter are read back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trl]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_real_lm.py"


@pytest.fixture(scope="module")
def real_lm():
    spec = importlib.util.spec_from_file_location("gpu_real_lm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _resolved(argv: list[str]) -> dict:
    from wmrl.core.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--print-config", "--json"])
    assert code == 0, argv
    return json.loads(out.getvalue())


@pytest.mark.parametrize("rehearsal", [False, True])
def test_every_command_of_the_plan_resolves(real_lm, tmp_path, rehearsal):
    plan = real_lm.Plan.rehearsal() if rehearsal else real_lm.Plan()
    warm = _resolved(real_lm.warm_start_command(plan, tmp_path / "warm"))
    # the warm start starts from the base model on the plan's device (not from the cached warm start)
    assert warm["model"] == {"path": "smollm2", "dtype": plan.dtype, "device": plan.device}
    start = str(tmp_path / "warm" / "final")
    for mode in plan.modes:
        run = _resolved(real_lm.train_command(plan, tmp_path / mode, mode, start))
        assert run["mode"] == mode and run["model"]["path"] == start and run["model"]["device"] == plan.device
        assert run["groups_per_step"] * run["group_size"] == plan.groups_per_step * plan.group_size
        assert run["tasks"]["ids"] == list(plan.tasks)
        fraction = {"real": 1.0, "world_model": 0.0, "wmrl": plan.anchor_fraction}[mode]
        assert run["corrector"]["scheduler"]["fraction"] == fraction
    for name, argv in real_lm.eval_commands(plan, tmp_path, "start", start).items():
        resolved = _resolved(argv)
        assert resolved["device"] == plan.device and resolved["seeds"] == list(plan.eval_seeds)
        assert resolved["in_sample"] is name.endswith("in_sample")
