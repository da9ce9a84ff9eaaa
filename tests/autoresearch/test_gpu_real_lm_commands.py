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
import signal
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


#: This session's GPU plan: three seeds of two modes, and the CPU quickstart's batch as variants.
MULTI_SEED = {
    "modes": ["real", "wmrl"],
    "seeds": [0, 1, 2],
    "variants": {
        "cpu-batch": ["groups_per_step=2", "group_size=4", "tasks.prompts_per_task=1", "learning_rate=0.0005",
                      "corrector.scheduler.fraction=0.5", "grpo.micro_batch_size=8"],
    },
}  # fmt: skip


def test_seeds_and_variants_become_runs_whose_settings_win(real_lm, tmp_path):
    plan = real_lm.Plan().changed(MULTI_SEED)
    specs = plan.runs()
    assert [s.name for s in specs] == [
        "real-s0",
        "real-s1",
        "real-s2",
        "wmrl-s0",
        "wmrl-s1",
        "wmrl-s2",
        "cpu-batch",
    ]
    start = str(tmp_path / "warm" / "final")
    for spec in specs:
        run = _resolved(
            real_lm.train_command(plan, tmp_path / spec.name, spec.mode, start, spec.seed, spec.settings)
        )
        assert run["seed"] == spec.seed and run["mode"] == spec.mode
        if spec.name == "cpu-batch":
            # the variant's settings come after the plan's, so they are what runs
            assert (run["groups_per_step"], run["group_size"], run["learning_rate"]) == (2, 4, 0.0005)
            assert run["corrector"]["scheduler"]["fraction"] == 0.5 and not spec.held_out
        else:
            assert run["groups_per_step"] == plan.groups_per_step and spec.held_out
    evals = real_lm.eval_commands(plan, tmp_path, "cpu-batch", start, held_out=False)
    assert list(evals) == ["eval_cpu-batch_in_sample"]


def test_a_plan_refuses_unknown_fields_and_colliding_names(real_lm):
    with pytest.raises(ValueError, match="unknown plan fields"):
        real_lm.Plan().changed({"seed": [1]})
    with pytest.raises(ValueError, match="collide"):
        real_lm.Plan().changed({"modes": ["real"], "variants": {"real": ["learning_rate=0.001"]}}).runs()
    with pytest.raises(ValueError, match="own folders"):
        real_lm.Plan().changed({"modes": ["real"], "variants": {"warm": ["learning_rate=0.001"]}}).runs()
    with pytest.raises(ValueError, match="at least one seed"):
        real_lm.Plan().changed({"seeds": []}).runs()


def test_a_variant_reports_the_mode_and_seed_that_run(real_lm):
    """The command line's last setting of a key wins, so the plan records that one."""
    plan = real_lm.Plan().changed(
        {"modes": [], "variants": {"v": ["mode=real", "seed=3", "mode=world_model"]}}
    )
    (spec,) = plan.runs()
    assert (spec.mode, spec.seed) == ("world_model", 3)


FAKE_WMRL = """
import json, pathlib, sys, time
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
if argv[:2] == ["train", "autoresearch-sft"]:
    (out / "final").mkdir()
elif argv[:2] == ["train", "autoresearch"] and "--resume" in argv:
    (out / "run_summary.json").write_text("{}")
elif argv[:2] == ["train", "autoresearch"]:
    (out / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    if "seed=1" in argv:  # the slow run: trains until Ctrl-C, like a run at the deadline
        try:
            time.sleep(120)
        except KeyboardInterrupt:
            (out / "stopped_at").write_text(repr(time.time()))
            sys.exit(130)
    (out / "checkpoints" / "checkpoint-2").mkdir()
else:  # eval autoresearch
    (out / "eval_report.json").write_text(json.dumps({"valid_rate": 0.5, "started": time.time()}))
"""


def test_a_run_that_ends_early_is_evaluated_before_the_deadline(real_lm, tmp_path, monkeypatch):
    """Run 3 of the GPU check started every evaluation at the deadline, where they starved: a run
    that ends by itself now has its last checkpoint evaluated at once; a run stopped at the deadline
    is evaluated and closed then."""
    fake = tmp_path / "fake_wmrl.py"
    fake.write_text(FAKE_WMRL)
    monkeypatch.setattr(real_lm, "_cli", lambda: [sys.executable, str(fake)])
    plan = real_lm.Plan.rehearsal().changed(
        {"modes": ["real"], "seeds": [0, 1], "held_out": False, "stop_grace_s": 22.0, "eval_reserve_s": 8.0}
    )
    work = tmp_path / "work"
    # run as a background job would be (`nohup ... &`: SIGINT ignored, inherited by children); the
    # stages restore Ctrl-C, or the deadline's Ctrl-C never stops the slow run (it was killed: -9)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = real_lm.run_real_lm(work, budget_s=40.0, plan=plan, log=lambda m: None)
    finally:
        signal.signal(signal.SIGINT, previous)
    fast, slow = result["runs"]["real-s0"], result["runs"]["real-s1"]
    assert (fast["exit_code"], fast["steps_done"], fast["interrupted_at_deadline"]) == (0, 2, False)
    assert (slow["exit_code"], slow["steps_done"], slow["interrupted_at_deadline"]) == (130, 1, True)
    stopped_at = float((work / "real-s1" / "stopped_at").read_text())
    fast_eval = json.loads((work / "eval" / "real-s0-in_sample" / "eval_report.json").read_text())
    slow_eval = json.loads((work / "eval" / "real-s1-in_sample" / "eval_report.json").read_text())
    assert fast_eval["started"] < stopped_at < slow_eval["started"]
    # only the stopped run is closed; every evaluation finished
    assert list(result["closing"]) == ["close_real-s1"] and (work / "real-s1" / "run_summary.json").is_file()
    assert {k: v["exit_code"] for k, v in result["evaluations"].items()} == {
        "eval_start_in_sample": 0,
        "eval_real-s0_in_sample": 0,
        "eval_real-s1_in_sample": 0,
    }
