"""The grader's memory and time on big submissions: bounded by the task, not by the submission.

For one bundled task (``flight-arrival-delay``: 3000 test rows, 2 columns) this writes
submissions of growing size -- the valid one, then 10x, 100x, 1000x and 4000x the rows (the last
is the red team's 12-million-row, 132 MB file), and a 1 GiB sparse file -- and validates each in a
fresh interpreter, reporting the outcome, the wall time and the peak resident memory
(``ru_maxrss``) of that process. Side by side, in the same run, the same file read whole with
``pandas.read_csv(dtype=str)`` (what the grader did before issue 10), for comparison.

Run: ``python benchmarks/grader_memory.py [--task flight-arrival-delay] [--json out.json]``
(about a minute; needs ~1.5 GB of free disk in the temp folder for the biggest file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GRADE = """
import json, resource, sys, time
from wmrl.autoresearch.grading.validation import SubmissionError, validate_submission
from wmrl.autoresearch.tasks.suite import load_bundled
task = load_bundled(sys.argv[1])
from wmrl.autoresearch.grading.validation import read_answers
answers = read_answers(task)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
try:
    validate_submission(sys.argv[2], task, answers)
    outcome = "valid"
except SubmissionError as e:
    outcome = e.code
print(json.dumps({"outcome": outcome, "s": time.perf_counter() - t0, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "start_mb": base / 1024}))
"""

PANDAS = """
import json, resource, sys, time
import pandas as pd
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
frame = pd.read_csv(sys.argv[2], dtype=str, keep_default_na=False)
ids = set(frame.iloc[:, 0])
print(json.dumps({"outcome": f"{len(frame)} rows", "s": time.perf_counter() - t0, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "start_mb": base / 1024}))
"""


def _run(script: str, task: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", script, task, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"outcome": f"crashed: {done.stderr.strip().splitlines()[-1][:80]}", "s": None, "rss_mb": None}
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="flight-arrival-delay")
    parser.add_argument("--factors", type=int, nargs="+", default=[1, 10, 100, 1000, 4000])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from wmrl.autoresearch.grading.validation import read_answers, submission_byte_limit
    from wmrl.autoresearch.tasks.suite import load_bundled

    task = load_bundled(args.task)
    answers = read_answers(task)
    n = len(answers)
    print(f"task {task.id}: {n} test rows; byte limit {submission_byte_limit(task, n)} bytes")
    ids = list(answers[task.id_columns[0]])
    rows = []
    with tempfile.TemporaryDirectory(prefix="wmrl-bench-grader-") as tmp:
        cases = []
        for factor in args.factors:
            path = Path(tmp) / f"x{factor}.csv"
            with open(path, "w") as f:
                f.write(f"{task.id_columns[0]},{task.target_columns[0]}\n")
                block = "".join(f"{i},12.5\n" for i in ids)
                for k in range(factor):
                    f.write(block if k == 0 else "".join(f"{k}-{i},12.5\n" for i in ids))
            cases.append((f"{factor}x rows ({factor * n} rows)", path))
        sparse = Path(tmp) / "sparse.csv"
        with open(sparse, "wb") as f:
            f.write(b"id,y\n")
            f.truncate(1 << 30)
        cases.append(("1 GiB sparse", sparse))
        print(
            "| submission | bytes | grader outcome | grader s | grader peak RSS MB (+ over its start) "
            "| pandas read_csv s | pandas peak RSS MB (+ over its start) |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, path in cases:
            ours = _run(GRADE, task.id, path)
            theirs = (
                _run(PANDAS, task.id, path)
                if "sparse" not in name
                else {"outcome": "not run", "s": None, "rss_mb": None}
            )
            row = {"case": name, "bytes": path.stat().st_size, "grader": ours, "pandas": theirs}
            rows.append(row)

            def fmt(x, d=2):
                return "-" if x is None else f"{x:.{d}f}"

            def mem(r):
                if r.get("rss_mb") is None:
                    return "-"
                return f"{r['rss_mb']:.0f} (+{r['rss_mb'] - r['start_mb']:.0f})"

            print(
                f"| {name} | {row['bytes']} | {ours['outcome']} | {fmt(ours['s'])} | {mem(ours)} | "
                f"{fmt(theirs['s'])} | {mem(theirs)} |",
                flush=True,
            )
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
