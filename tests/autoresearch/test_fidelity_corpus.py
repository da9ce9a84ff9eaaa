"""The bundled fidelity corpus has the outcomes its manifest says (checked in the real sandbox), and
``wmrl wm-fidelity`` grades the same solutions both ways and reports metrics that follow from its rows."""

from __future__ import annotations

import json
import shutil

import pytest

from wmrl.autoresearch.fidelity.corpus import CORPUS_DIR, load_corpus


def test_manifest_covers_every_outcome_on_several_tasks():
    corpus = load_corpus()
    statuses = {e.expected_status for e in corpus.entries}
    assert statuses == {
        "valid",
        "runtime_error",
        "no_submission",
        "invalid_submission",
        "syntax_error",
        "timeout",
    }
    assert len({e.task for e in corpus.entries}) >= 3
    files = {p.relative_to(CORPUS_DIR).as_posix() for p in CORPUS_DIR.glob("*/*.py")}
    assert files == {e.file for e in corpus.entries}, "every script is in the manifest and vice versa"
    from wmrl.autoresearch.tasks.suite import TRAIN_TASKS

    assert {e.task for e in corpus.entries} <= set(TRAIN_TASKS), "fidelity runs on training tasks only"


def _check(entries, corpus):
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.tasks import load_task

    grader = ExecutionGrader(
        backend="bwrap", time_limit_s=corpus.time_limit_s, memory_limit_mb=corpus.memory_limit_mb
    )
    results = {e.file: grader.grade(load_task(e.task), e.code) for e in entries}
    for e in entries:
        assert results[e.file].status == e.expected_status, (e.file, results[e.file].reason)
    return results


@pytest.mark.bwrap
def test_corpus_outcomes_on_one_task():
    corpus = load_corpus()
    entries = [e for e in corpus.entries if e.task == "wine-cultivar"]
    results = _check(entries, corpus)
    # the strong submission beats the weak one on the leaderboard
    assert (
        results["wine-cultivar/valid_logreg.py"].position > results["wine-cultivar/valid_uniform.py"].position
    )


@pytest.mark.bwrap
@pytest.mark.slow
def test_corpus_outcomes_everywhere():
    corpus = load_corpus()
    _check(corpus.entries, corpus)  # two scripts run into the 20 s limit: slow


@pytest.mark.bwrap
@pytest.mark.transformers
@pytest.mark.matplotlib
def test_wm_fidelity_on_a_corpus(tmp_path):
    from wmrl.autoresearch.fidelity.metrics import score_metrics, status_accuracy
    from wmrl.autoresearch.fidelity.run import run_fidelity
    from wmrl.autoresearch.llm.tiny import save_tiny_model

    # one task's part of the corpus (the full corpus runs two scripts into the 20 s limit)
    small = tmp_path / "corpus"
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    manifest["solutions"] = [s for s in manifest["solutions"] if s["task"] == "wine-cultivar"]
    for s in manifest["solutions"]:
        (small / s["file"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CORPUS_DIR / s["file"], small / s["file"])
    (small / "manifest.json").write_text(json.dumps(manifest))
    model = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "report"
    report = run_fidelity(
        model=str(model), corpus_dir=small, out_dir=out, overview_tokens=1500, log=lambda *_: None
    )
    assert (out / "calibration.png").stat().st_size > 0
    assert json.loads((out / "fidelity.json").read_text())["solutions"] == len(manifest["solutions"]) == 6
    rows = report["rows"]
    assert report["corpus_expected_status_matches"] == 6
    # the gate settles the syntax errors exactly; the random tiny model guesses the rest
    for r in rows:
        if r["expected_status"] == "syntax_error":
            assert r["wm_status"] == "syntax_error" and r["wm_score"] == 0.0 and r["wm_source"] == "gate"
        assert 0.0 <= r["wm_score"] <= 1.0
    assert report["status_accuracy"] == status_accuracy(
        [r["real_status"] for r in rows], [r["wm_status"] for r in rows]
    )
    again = score_metrics(
        [r["real_reward"] for r in rows], [r["wm_score"] for r in rows], [r["group"] for r in rows]
    )
    assert report["score"] == again
    cal = report["calibration"]
    assert cal["fit_items"] + cal["report_items"] == 6 and cal["calibrated"] is not None
    assert report["seconds"]["sandbox"] > 0 and report["seconds"]["world_model"] > 0


@pytest.mark.bwrap
@pytest.mark.transformers
@pytest.mark.matplotlib
def test_wm_fidelity_on_agent_solutions(tmp_path):
    """Solutions sampled from an agent (the random tiny model: no script, so every reply is
    ``malformed`` for both graders, exactly, and nothing runs)."""
    from wmrl.autoresearch.fidelity.run import run_fidelity
    from wmrl.autoresearch.llm.tiny import save_tiny_model
    from wmrl.autoresearch.tasks.toy import make_toy_task

    make_toy_task(tmp_path, "toy-regression")
    make_toy_task(tmp_path, "toy-binary", kind="binary")
    model = save_tiny_model(tmp_path / "tiny")
    report = run_fidelity(
        model=str(model),
        solutions="agent",
        tasks=f"{tmp_path / 'toy-regression'},{tmp_path / 'toy-binary'}",
        per_task=3,
        max_new_tokens=8,
        overview_tokens=1500,
        out_dir=tmp_path / "out",
        log=lambda *_: None,
    )
    rows = report["rows"]
    assert len(rows) == 6 and {r["group"] for r in rows} == {"toy-regression", "toy-binary"}
    for r in rows:
        assert r["real_status"] == "malformed" and r["real_reward"] == 0.0
        assert r["wm_status"] == "malformed" and r["wm_score"] == 0.0 and r["wm_source"] == "gate"
    assert report["status_accuracy"] == 1.0 and report["score"]["reward_mae"] == 0.0
    assert (
        report["score"]["pairs"] == 0 and report["score"]["pairwise_accuracy"] is None
    )  # no signal to order
