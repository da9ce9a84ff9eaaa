"""The vLLM-against-transformers numbers recorded in ``benchmarks/results/vllm-cpu-2026-12-06/`` are
the ones ``docs/benchmarks/scale-out.md`` quotes."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "vllm-cpu-2026-12-06"


def test_the_docs_quote_the_recorded_ratios():
    docs = (ROOT / "docs" / "benchmarks" / "scale-out.md").read_text()
    grpo = json.loads((RESULTS / "grpo.json").read_text())
    scoring = json.loads((RESULTS / "scoring.json").read_text())
    t, v = grpo["transformers"], grpo["vllm_http"]
    assert f"| {t['step_s_median']:.2f} | {t['generation_s_median']:.2f} |" in docs
    assert f"| {v['step_s_median']:.2f} | {v['generation_s_median']:.2f} |" in docs
    assert f"({grpo['ratio_step']:.2f}x)" in docs and f"{grpo['ratio_generation']:.2f}x" in docs
    for job, by in scoring["wall_s"].items():
        t_median, v_median = statistics.median(by["transformers"]), statistics.median(by["vllm"])
        assert f"| {t_median:.2f} | {v_median:.2f} |" in docs, job
        ratio = f"{scoring['ratio'][job]:.2f}x"
        assert ratio in docs, (job, ratio)
    assert f"{scoring['status_probs_max_abs_diff']:.1e}".replace("e-0", "e-") in docs
