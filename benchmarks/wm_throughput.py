"""World-model scoring on this machine: batched against one at a time, and parse rates of prompt variants.

Two measurements, both on a handful of scripts written for bundled tasks (a constant submission,
a linear model, a KeyError, a wrong path, a forgotten submission, wrong submission columns):

* ``throughput``: the same items scored by ONE batched ``WorldModel.predict`` call and by one
  call per item (cache off, same model, same settings), alternating which goes first over the
  rounds so load drift hits both; also the status-probability scorer (one prefill per item).
* ``parse``: for each prompt variant (worked example on/off, constrained prefix on/off) the
  fraction of samples that parse, the predicted statuses, how many samples merely copy the worked
  example's answer, and, with ``--real``, the status accuracy against real sandbox execution.

Usage::

    python benchmarks/wm_throughput.py throughput --model smollm2 --items 6 --samples 2
    python benchmarks/wm_throughput.py parse --model smollm2 --samples 2 --real

Prints a markdown table and, with ``--json PATH``, writes the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

BINARY_OR_REGRESSION = (
    "breast-cancer-diagnosis",
    "diabetes-progression",
    "penguin-body-mass",
    "customer-churn",
)


def solutions_for(task) -> dict[str, tuple[str, str]]:
    """name -> (script, the outcome a reader should expect) for a tabular binary/regression task."""
    target, key = task.target_columns[0], task.id_columns[0]
    head = "import os\nimport pandas as pd\n\nd = os.environ['DATA_DIR']\n"
    read = (
        "train = pd.read_csv(os.path.join(d, 'train.csv'))\ntest = pd.read_csv(os.path.join(d, 'test.csv'))\n"
    )
    if task.category == "binary":
        model = (
            "from sklearn.linear_model import LogisticRegression\n"
            f"X = train.drop(columns=['{key}', '{target}']).select_dtypes('number').fillna(0)\n"
            f"m = LogisticRegression(max_iter=2000).fit(X, train['{target}'])\n"
            "pred = m.predict_proba(test[X.columns].fillna(0))[:, 1]\n"
        )
    else:
        model = (
            "from sklearn.linear_model import Ridge\n"
            f"X = train.drop(columns=['{key}', '{target}']).select_dtypes('number').fillna(0)\n"
            f"m = Ridge().fit(X, train['{target}'])\n"
            "pred = m.predict(test[X.columns].fillna(0))\n"
        )
    write = f"pd.DataFrame({{'{key}': test['{key}'], '{target}': pred}}).to_csv(os.environ['SUBMISSION_PATH'], index=False)\n"
    return {
        "constant": (
            head
            + f"sub = pd.read_csv(os.path.join(d, '{task.sample_submission}'))\nsub.to_csv(os.environ['SUBMISSION_PATH'], index=False)\n",
            "valid",
        ),
        "linear": (head + read + model + write, "valid"),
        "keyerror": (head + read + model.replace(f"'{target}']", "'label']", 1) + write, "runtime_error"),
        "wrong_path": (head + "train = pd.read_csv('train.csv')\n" + model + write, "runtime_error"),
        "no_submission": (head + read + model + "print(pred[:5])\n", "no_submission"),
        "bad_columns": (
            head
            + read
            + model
            + "pd.DataFrame({'prediction': pred}).to_csv(os.environ['SUBMISSION_PATH'], index=False)\n",
            "invalid_submission",
        ),
    }


def build_items(n_items: int):
    from wmrl.autoresearch.tasks import Solution, load_task

    items, expected = [], []
    for task_id in BINARY_OR_REGRESSION:
        task = load_task(task_id)
        for name, (code, outcome) in solutions_for(task).items():
            items.append((Solution(task_id, code), name))
            expected.append(outcome)
    # Interleave: every run of 6 items holds each kind once, from rotating tasks.
    kinds, n_tasks = 6, len(BINARY_OR_REGRESSION)
    order = [((k + r) % n_tasks) * kinds + k for r in range(n_tasks) for k in range(kinds)]
    items = [items[i] for i in order][:n_items]
    expected = [expected[i] for i in order][:n_items]
    return items, expected


def load_backend(spec: str, batch_size: int):
    from wmrl.autoresearch.llm.hf import TransformersBackend

    started = time.perf_counter()
    backend = TransformersBackend.from_spec(spec, batch_size=batch_size)
    return backend, time.perf_counter() - started


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def cmd_throughput(args) -> dict:
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    backend, load_s = load_backend(args.model, args.batch_size)
    items, _ = build_items(args.items)
    solutions = [s for s, _ in items]
    config = WorldModelConfig(
        samples=args.samples, max_new_tokens=args.max_new_tokens, overview_tokens=args.overview_tokens
    )
    wm = WorldModel(backend, config, cache=False)
    for s in solutions:  # build overviews outside the timed region
        wm.overview(s.task_id)
    rows = {"batched": [], "one_at_a_time": []}
    parse = Counter()
    for r in range(args.rounds):
        modes = ["batched", "one_at_a_time"] if r % 2 == 0 else ["one_at_a_time", "batched"]
        for mode in modes:
            before = (wm.stats.samples, wm.stats.parse_failures)
            if mode == "batched":
                _, wall, cpu = timed(lambda: wm.predict(solutions))
            else:
                _, wall, cpu = timed(lambda: [wm.predict([s]) for s in solutions])
            parse[mode + "_samples"] += wm.stats.samples - before[0]
            parse[mode + "_failures"] += wm.stats.parse_failures - before[1]
            rows[mode].append({"wall_s": wall, "cpu_s": cpu})
            print(f"round {r} {mode}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    probs = WorldModel(
        backend, WorldModelConfig(scoring="status_probs", overview_tokens=args.overview_tokens), cache=False
    )
    for s in solutions:
        probs.overview(s.task_id)
    prob_outcomes, prob_wall, prob_cpu = timed(lambda: probs.predict(solutions))
    result = {
        "model": args.model,
        "model_load_s": load_s,
        "items": len(solutions),
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "overview_tokens": args.overview_tokens,
        "batch_size": args.batch_size,
        "rows": rows,
        "parse": dict(parse),
        "status_probs": {
            "wall_s": prob_wall,
            "cpu_s": prob_cpu,
            "values": [o.grade.value for o in prob_outcomes],
        },
    }
    n = len(solutions)
    print("\n| mode | items | median wall (s) | items/s | median CPU (s) |\n|---|---|---|---|---|")
    for mode, runs in rows.items():
        wall = statistics.median(x["wall_s"] for x in runs)
        cpu = statistics.median(x["cpu_s"] for x in runs)
        print(f"| {mode} ({args.samples} samples/item) | {n} | {wall:.1f} | {n / wall:.3f} | {cpu:.1f} |")
    print(
        f"| status_probs (one prefill/item) | {n} | {prob_wall:.1f} | {n / prob_wall:.3f} | {prob_cpu:.1f} |"
    )
    ratio = statistics.median(x["wall_s"] for x in rows["one_at_a_time"]) / statistics.median(
        x["wall_s"] for x in rows["batched"]
    )
    print(f"\nbatched speed-up (one-at-a-time wall / batched wall): {ratio:.2f}x")
    result["speedup"] = ratio
    return result


def cmd_parse(args) -> dict:
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig
    from wmrl.autoresearch.worldmodel.prompts import _EXAMPLE_ANSWER

    backend, _ = load_backend(args.model, args.batch_size)
    items, expected = build_items(args.items)
    solutions = [s for s, _ in items]
    real = None
    if args.real:
        from wmrl.autoresearch.grading import ExecutionGrader
        from wmrl.autoresearch.tasks import load_task

        grader = ExecutionGrader()
        real = [grader.grade(load_task(s.task_id), s.code).status for s in solutions]
        print("real statuses:", real, flush=True)
    variants = {
        "example+prefix": {"worked_example": True, "constrained_prefix": True},
        "no example+prefix": {"worked_example": False, "constrained_prefix": True},
        "example, no prefix": {"worked_example": True, "constrained_prefix": False},
        "no example, no prefix": {"worked_example": False, "constrained_prefix": False},
    }
    results = {}
    example_status = _EXAMPLE_ANSWER["status"]
    for name, flags in variants.items():
        config = WorldModelConfig(
            samples=args.samples,
            max_new_tokens=args.max_new_tokens,
            overview_tokens=args.overview_tokens,
            **flags,
        )
        wm = WorldModel(backend, config, cache=False)
        outcomes, wall, _ = timed(lambda wm=wm: wm.predict(solutions))
        statuses = Counter(p.status for o in outcomes for p in o.samples)
        copies = sum(
            1
            for o in outcomes
            for p in o.samples
            if p.status == example_status
            and p.error_type == _EXAMPLE_ANSWER["error_type"]
            and p.error_line == _EXAMPLE_ANSWER["error_line"]
        )
        parsed = sum(len(o.samples) for o in outcomes)
        total = wm.stats.samples
        modal = [o.grade.status for o in outcomes]
        row = {
            "samples": total,
            "parsed": parsed,
            "parse_rate": parsed / total if total else None,
            "repaired": sum(p.repaired for o in outcomes for p in o.samples),
            "copies_of_example": copies,
            "statuses": dict(statuses),
            "unknown_items": sum(o.grade.value is None for o in outcomes),
            "values": [o.grade.value for o in outcomes],
            "wall_s": wall,
            "failures": [f for o in outcomes for f in o.failures][:5],
        }
        if real is not None:
            row["status_accuracy"] = sum(m == r for m, r in zip(modal, real, strict=True)) / len(real)
        results[name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k != "failures"}), flush=True)
    probs = WorldModel(
        backend, WorldModelConfig(scoring="status_probs", overview_tokens=args.overview_tokens), cache=False
    )
    prob_outcomes = probs.predict(solutions)
    results["status_probs"] = {
        "values": [o.grade.value for o in prob_outcomes],
        "top_status": [o.grade.status for o in prob_outcomes],
        "p_valid": [o.grade.info["status_probs"]["valid"] for o in prob_outcomes],
    }
    if real is not None:
        results["status_probs"]["status_accuracy"] = sum(
            o.grade.status == r for o, r in zip(prob_outcomes, real, strict=True)
        ) / len(real)
    print(
        "\n| variant | samples | parse rate | repaired | copies of the example | statuses | status acc. vs real |\n|---|---|---|---|---|---|---|"
    )
    for name, row in results.items():
        if name == "status_probs":
            continue
        acc = f"{row['status_accuracy']:.2f}" if "status_accuracy" in row else "-"
        print(
            f"| {name} | {row['samples']} | {row['parse_rate']:.2f} | {row['repaired']} | {row['copies_of_example']} | {row['statuses']} | {acc} |"
        )
    sp = results["status_probs"]
    print(
        f"\nstatus_probs: values {[round(v, 3) for v in sp['values']]}, top {sp['top_status']}, "
        f"accuracy {sp.get('status_accuracy', '-')}"
    )
    return {
        "expected_by_construction": expected,
        "real": real,
        "variants": results,
        "kinds": [k for _, k in items],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["throughput", "parse"])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=6)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--overview-tokens", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--real", action="store_true", help="parse: also run the scripts in the sandbox for status accuracy"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(
        f"# {platform.node()} {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load {load[0]:.1f}",
        flush=True,
    )
    result = cmd_throughput(args) if args.what == "throughput" else cmd_parse(args)
    result["load_start"] = load[0]
    result["load_end"] = os.getloadavg()[0]
    result["torch_threads"] = torch.get_num_threads()
    print(f"# load at end {result['load_end']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
