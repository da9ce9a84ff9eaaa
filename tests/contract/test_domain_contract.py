"""One contract, every domain: AutoResearch (TRL), embodied (the loop trainer on LIBERO) and the example
``hpo`` domain (the loop trainer, installed as a separate package through the entry point).

Each domain is run through the same command, ``wmrl train DOMAIN``, on a tiny configuration; then the
same checks apply to all of them: ``--print-config`` is the config the run records, the checkpoint
folders hold the same correction files, the cost reports have one layout, a resumed run ends
bit-identical to an uninterrupted one, and a mode means the same corrector everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import pytest

from wmrl.core.cli import main
from wmrl.core.config import from_dict, load_config, to_dict
from wmrl.core.pipeline import CORRECTOR_FILE, COST_REPORT_KEYS, LEDGER_FILE
from wmrl.core.rundir import checkpoint_step, list_checkpoints

pytestmark = [pytest.mark.matplotlib]


@dataclass
class Domain:
    name: str
    config: str  # "module:Class"
    overrides: list[str]
    steps: int
    marks: list = field(default_factory=list)
    fixture: str | None = None  # a fixture giving more overrides


DOMAINS = [
    Domain(
        "autoresearch",
        "wmrl.autoresearch.training.config:TrainConfig",
        [],
        steps=2,
        marks=[pytest.mark.trl, pytest.mark.bwrap, pytest.mark.peft],
        fixture="tiny_autoresearch",
    ),
    Domain(
        "embodied",
        "wmrl.embodied.training.config:EmbodiedTrainConfig",
        ["--smoke", "steps=2"],
        steps=2,
        marks=[pytest.mark.libero, pytest.mark.peft, pytest.mark.slow],
    ),
    Domain(
        "hpo",
        "wmrl_hpo.config:HPOConfig",
        ["tasks=[breast_cancer,wine]", "groups_per_step=2", "group_size=4", "report_greedy=false"],
        steps=3,
    ),
]


def _load(path: str):
    from wmrl.core.cli_runs import load_object

    return load_object(path)


def _command(domain: Domain, extra: list[str]) -> list[str]:
    return ["train", domain.name, "--no-progress", *domain.overrides, *extra, "checkpoint.every=1"]


@pytest.fixture(params=DOMAINS, ids=[d.name for d in DOMAINS])
def domain(request):
    d = request.param
    for mark in d.marks:
        request.applymarker(mark)
    if d.name == "hpo":
        pytest.importorskip(
            "wmrl_hpo", reason="the example domain is not installed (pip install -e examples/hpo)"
        )
    return d


def test_every_domain_keeps_the_contract(domain, tmp_path, capsys, request):
    base = _command(domain, request.getfixturevalue(domain.fixture) if domain.fixture else [])
    # --print-config is exactly the config the run records
    assert main([*base, f"steps={domain.steps}", "--print-config", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    full = tmp_path / "full"
    assert main([*base, f"steps={domain.steps}", "--out", str(full)]) == 0
    capsys.readouterr()
    assert json.loads((full / "config.json").read_text()) == printed

    # the same checkpoint layout and correction files
    checkpoints = list_checkpoints(full)
    assert [checkpoint_step(c) for c in checkpoints][-1] == domain.steps
    for folder in checkpoints:
        assert (folder / CORRECTOR_FILE).is_file() and (folder / LEDGER_FILE).is_file()
        assert (
            folder.parent == full / "checkpoints" and folder.name == f"checkpoint-{checkpoint_step(folder)}"
        )
    for name in ("config.json", "metrics.jsonl", "cost_report.json"):
        assert (full / name).is_file(), name
    assert (full / "plots" / "weights.png").is_file()

    # one cost-report layout
    report = json.loads((full / "cost_report.json").read_text())
    assert set(report) == COST_REPORT_KEYS
    assert report["steps"] == domain.steps and report["mode"] == printed["mode"]
    assert set(report["spent"]) >= {"generation", "world_model", "anchor", "update"}

    # resume: one step short, then --resume to the end: the correction ends bit-identical
    part = tmp_path / "part"
    assert main([*base, f"steps={domain.steps - 1}", "--out", str(part)]) == 0
    assert main([*base, f"steps={domain.steps}", "--out", str(part), "--resume"]) == 0
    capsys.readouterr()
    last = f"checkpoints/checkpoint-{domain.steps}/{CORRECTOR_FILE}"
    assert (part / last).read_bytes() == (full / last).read_bytes()
    rows_full = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    rows_part = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    # the resumed log continues the interrupted one: the same steps, each once (an engine's end-of-run
    # summary line, such as TRL's train_runtime, has no wmrl/step)
    steps = [r["wmrl/step"] for r in rows_full if "wmrl/step" in r]
    assert (
        steps == [r["wmrl/step"] for r in rows_part if "wmrl/step" in r] == list(range(1, domain.steps + 1))
    )


@pytest.mark.parametrize("mode", ["real", "world_model", "wmrl"])
def test_a_mode_means_the_same_corrector_in_every_domain(mode):
    from wmrl.core.modes import resolve_corrector

    resolved = {}
    for d in DOMAINS:
        try:
            cls = _load(d.config)
        except ImportError:
            continue
        config = load_config(cls, None, [f"mode={mode}"])
        # the domain's own starting point, before any mode resolved it (the memory left unset is the mode's)
        default = next(f for f in dataclasses.fields(cls) if f.name == "corrector").default_factory()
        assert config.corrector == resolve_corrector(mode, default, default)
        assert from_dict(cls, to_dict(config)) == config
        resolved[d.name] = {
            k: v for k, v in to_dict(config.corrector).items() if k in ("scheduler", "fusion")
        }
    assert len(resolved) >= 2
    presets = {
        name: (r["scheduler"]["fraction"], r["fusion"]["mode"]) if mode != "wmrl" else None
        for name, r in resolved.items()
    }
    assert len(set(presets.values())) == 1, presets  # the preset's keys agree across domains


def test_ctrl_c_on_the_command_line_exits_130_with_one_line(tmp_path):
    """The shared command: a real SIGINT to a real `wmrl train` process."""
    pytest.importorskip(
        "wmrl_hpo", reason="the example domain is not installed (pip install -e examples/hpo)"
    )
    script = textwrap.dedent(
        """
        import os, signal, sys, threading, time
        from wmrl.core.cli import main
        from wmrl.core import loop

        original = loop.LoopTrainer.train_step
        def step_then_interrupt(self, batch=None):
            out = original(self, batch)
            if self.step == 1:
                os.kill(os.getpid(), signal.SIGINT)
            return out
        loop.LoopTrainer.train_step = step_then_interrupt
        sys.exit(main(sys.argv[1:]))
        """
    )
    out = tmp_path / "run"
    args = [
        "train",
        "hpo",
        "--out",
        str(out),
        "--no-progress",
        "tasks=[wine]",
        "groups_per_step=1",
        "group_size=2",
    ]
    done = subprocess.run(
        [sys.executable, "-c", script, *args, "report_greedy=false", "steps=5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 130, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "stopped after step 1" in last and "--resume" in last and "Traceback" not in done.stderr
    assert [checkpoint_step(c) for c in list_checkpoints(out)] == [1]
