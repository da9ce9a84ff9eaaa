"""Subcommands of the ``wmrl`` command contributed by ``wmrl.autoresearch``.

``register`` must import only the standard library and ``wmrl.core``; heavy imports go inside handlers.

* ``wmrl autoresearch tasks list [--split train|eval] [--tier standard|heavy|all] [--json]``: the bundled
  offline suite (``heavy``: the tier whose data is rebuilt on first use; listing it rebuilds nothing).
* ``wmrl autoresearch tasks show TASK [--json]``: one task (a bundled id or a task folder in any format).
* ``wmrl autoresearch grade TASK SOLUTION.py [--backend B] [--time-limit S] [--memory-limit MB] [--json]``:
  run a solution in the sandbox and print its grade.
* ``wmrl autoresearch wm-fidelity``: the world model against real execution on the same solutions.
* ``wmrl train autoresearch``, ``wmrl train autoresearch-sft``, ``wmrl eval autoresearch``: GRPO
  training, the supervised warm start and held-out evaluation, with the flags every domain shares
  (``wmrl.autoresearch.training.commands``).
* ``wmrl bench autoresearch``: the real-LM benchmark of the three modes (``wmrl.autoresearch.evaluation.bench``).
* ``wmrl autoresearch warm-start``: build (once) and show a cached embedded warm start (``smollm2-warm-model``, the default, or ``smollm2-warm``).

The short forms ``wmrl tasks``, ``wmrl grade`` and ``wmrl wm-fidelity`` keep working (not listed).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

#: ``wmrl grade`` exit status when the harness (not the solution) failed: the grade is unknown.
EXIT_HARNESS_ERROR = 3
#: Exit status for a task or solution file that cannot be loaded.
EXIT_BAD_INPUT = 2


def _add_verbs(root, hidden: bool) -> None:
    """The domain's own verbs on ``root``: ``wmrl autoresearch ...`` (and hidden top-level aliases)."""
    root.group("tasks", help="list and inspect AutoResearch tasks", hidden=hidden)
    listing = root.subcommand("tasks", "list", "list the bundled offline tasks", _tasks_list)
    listing.add_argument("--split", choices=("train", "eval"), help="only tasks of this split")
    listing.add_argument(
        "--tier",
        choices=("standard", "heavy", "all"),
        default="standard",
        help="the standard suite, the heavy tier (executions of 20-60 s), or both",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON list of objects")
    show = root.subcommand(
        "tasks", "show", "show one task: metadata, leaderboard summary, description", _tasks_show
    )
    show.add_argument(
        "task", metavar="TASK", help="bundled task id or task folder (bundled, MLE-bench, MLE-Dojo, DSBench)"
    )
    show.add_argument("--json", action="store_true", help="print one JSON object")
    grade = root.command(
        "grade", "run a solution script on a task in the sandbox and print its grade", _grade, hidden=hidden
    )
    grade.add_argument(
        "task", metavar="TASK", help="bundled task id or task folder (bundled, MLE-bench, MLE-Dojo, DSBench)"
    )
    grade.add_argument("solution", metavar="SOLUTION.py", help="the solution script")
    grade.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "bwrap", "docker", "subprocess"),
        help="sandbox backend (default: auto)",
    )
    grade.add_argument(
        "--time-limit", type=float, metavar="SECONDS", help="wall-clock limit (default: the task's)"
    )
    grade.add_argument(
        "--memory-limit", type=int, metavar="MB", help="memory limit in MiB (default: the task's)"
    )
    grade.add_argument("--json", action="store_true", help="print one JSON object")
    from wmrl.autoresearch.training.commands import register_fidelity

    register_fidelity(root, hidden=hidden)


def register(root) -> None:
    """Add this package's commands to the ``wmrl`` command tree (see ``wmrl.core.cli.CommandRoot``)."""
    from wmrl.autoresearch.evaluation.bench import register as register_bench
    from wmrl.autoresearch.training.commands import register_eval, register_train

    register_train(root)
    register_eval(root)
    register_bench(root)
    domain = root.domain(
        "autoresearch",
        "AutoResearch tools: the task suite, grading a script, world-model fidelity, the warm start",
    )
    _add_verbs(domain, hidden=False)
    warm = domain.command(
        "warm-start",
        "build (once) the embedded warm start that `wmrl train autoresearch` starts from ('smollm2-warm-model'; "
        "--action script: 'smollm2-warm'), and print where it is cached",
        _warm_start,
    )
    warm.add_argument(
        "--action",
        choices=("script", "model"),
        default="model",
        help="which warm start: 'model' (default, what `wmrl train autoresearch` starts from) builds "
        "smollm2-warm-model (the model block of a fixed pipeline), 'script' builds smollm2-warm (whole "
        "scripts: the bench's and tasks.action=script's)",
    )
    warm.add_argument("--rebuild", action="store_true", help="build it again even if it is cached")
    warm.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_verbs(root, hidden=True)  # the short forms `wmrl grade`, `wmrl tasks`, `wmrl wm-fidelity`


def _warm_start(args: argparse.Namespace) -> int:
    from wmrl.autoresearch.training.warm import WARM_SPECS, ensure_warm_start
    from wmrl.core.cli_runs import USER_ERRORS

    spec = next(s for s, action in WARM_SPECS.items() if action == args.action)
    try:
        final = ensure_warm_start(progress=not args.no_progress, rebuild=args.rebuild, spec=spec)
    except USER_ERRORS as err:
        print(f"wmrl autoresearch warm-start: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = json.loads((final.parent / "run_summary.json").read_text())
    print(f"[wmrl] warm start '{spec}': {final}")
    print(
        f"[wmrl]   built in {summary['wall_s']:.0f} s; loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}; "
        f"corpus {summary['corpus']['agent_examples']} agent + {summary['corpus']['world_model_examples']} "
        f"world-model examples from {summary['corpus']['executions']} real executions"
    )
    return 0


@dataclass(frozen=True)
class _Listing:
    """One task's entry in ``wmrl autoresearch tasks list`` (the JSON keys, in this order)."""

    id: str
    tier: str
    title: str
    split: str | None
    source: str
    category: str
    modality: str
    metric: str
    lower_is_better: bool
    id_columns: list[str]
    target_columns: list[str]
    train_rows: int | None
    test_rows: int | None
    public_leaderboard_size: int
    private_leaderboard_size: int
    time_limit_s: float
    memory_limit_mb: int


def _summary(task) -> dict:
    from wmrl.autoresearch.tasks.suite import EVAL_TASKS, TRAIN_TASKS

    split = "train" if task.id in TRAIN_TASKS else "eval" if task.id in EVAL_TASKS else None
    rows = dict(task.metadata.get("rows", {})) if task.source == "bundled" else {}
    return asdict(
        _Listing(
            id=task.id,
            tier="standard",
            title=task.metadata.get("title") or task.metadata.get("name") or task.id,
            split=split,
            source=task.source,
            category=task.category,
            modality=task.modality,
            metric=task.metric,
            lower_is_better=task.lower_is_better,
            id_columns=list(task.id_columns),
            target_columns=list(task.target_columns),
            train_rows=rows.get("train"),
            test_rows=rows.get("test"),
            public_leaderboard_size=len(task.public_leaderboard),
            private_leaderboard_size=len(task.private_leaderboard),
            time_limit_s=task.time_limit_s,
            memory_limit_mb=task.memory_limit_mb,
        )
    )


def _heavy_summary(task_id: str) -> dict:
    """A heavy task's listing from its packaged files (its data is not rebuilt to list it)."""
    from wmrl.autoresearch.tasks.suite import HEAVY_DIR, _read_leaderboard

    meta = json.loads((HEAVY_DIR / task_id / "task.json").read_text(encoding="utf-8"))
    public, private = _read_leaderboard(HEAVY_DIR / task_id / "private" / "leaderboard.csv")
    return asdict(
        _Listing(
            id=task_id,
            tier="heavy",
            title=meta["title"],
            split="train",
            source="bundled",
            category=meta["category"],
            modality=meta["modality"],
            metric=meta["metric"],
            lower_is_better=meta["lower_is_better"],
            id_columns=meta["id_columns"],
            target_columns=meta["target_columns"],
            train_rows=meta["rows"]["train"],
            test_rows=meta["rows"]["test"],
            public_leaderboard_size=len(public),
            private_leaderboard_size=len(private),
            time_limit_s=meta["time_limit_s"],
            memory_limit_mb=meta["memory_limit_mb"],
        )
    )


def _tasks_list(args: argparse.Namespace) -> int:
    from wmrl.autoresearch.tasks.suite import HEAVY_TASKS, list_suite, load_bundled

    entries = []
    if args.tier in ("standard", "all"):
        entries += [_summary(load_bundled(task_id)) for task_id in list_suite()]
    if args.tier in ("heavy", "all"):
        entries += [_heavy_summary(task_id) for task_id in HEAVY_TASKS]
    if args.split:
        entries = [e for e in entries if e["split"] == args.split]
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    if not entries:
        print("no bundled tasks found (build them: python -m wmrl.autoresearch.tasks.build_suite)")
        return 0
    header = f"{'id':<26} {'split':<6} {'category':<11} {'modality':<9} {'metric':<26} {'train':>7} {'test':>7} {'board':>6}"
    print(header)
    print("-" * len(header))
    for e in entries:
        metric = e["metric"] + (" (↓)" if e["lower_is_better"] else " (↑)")
        board = max(e["public_leaderboard_size"], e["private_leaderboard_size"])
        print(
            f"{e['id']:<26} {e['split'] or '-':<6} {e['category']:<11} {e['modality']:<9} {metric:<26} "
            f"{e['train_rows'] or '-':>7} {e['test_rows'] or '-':>7} {board:>6}"
        )
    return 0


def _load(task_ref: str, **limits):
    from wmrl.autoresearch.tasks.load import load_task
    from wmrl.autoresearch.tasks.model import TaskError

    try:
        return load_task(task_ref, **limits)
    except TaskError as err:
        print(f"wmrl: cannot load task {task_ref!r}: {err}", file=sys.stderr)
        return None


def _tasks_show(args: argparse.Namespace) -> int:
    import statistics

    task = _load(args.task)
    if task is None:
        return EXIT_BAD_INPUT
    info = _summary(task)
    info["public_dir"] = str(task.public_dir)
    info["sample_submission"] = task.sample_submission
    info["train_files"] = list(task.train_files)
    info["test_files"] = list(task.test_files)
    boards = {}
    for name, board in task.leaderboards.items():
        ranked = sorted(board, reverse=not task.lower_is_better)
        boards[name] = {
            "size": len(board),
            "best": ranked[0],
            "median": statistics.median(board),
            "worst": ranked[-1],
        }
    info["leaderboards"] = boards
    if task.baseline_score is not None:
        info["baseline_score"], info["oracle_score"] = task.baseline_score, task.oracle_score
    info["provenance"] = dict(task.metadata.get("provenance", {}))
    if args.json:
        info["description"] = task.description
        print(json.dumps(info, indent=2))
        return 0
    direction = "lower is better" if task.lower_is_better else "higher is better"
    print(f"{task.id}: {info['title']}")
    print(
        f"  split: {info['split'] or '-'}   source: {task.source}   category: {task.category}   modality: {task.modality}"
    )
    print(
        f"  metric: {task.metric} ({direction})   ids: {', '.join(task.id_columns)}   targets: {', '.join(task.target_columns)}"
    )
    print(f"  limits: {task.time_limit_s:g} s, {task.memory_limit_mb} MB   public data: {task.public_dir}")
    for name, b in boards.items():
        print(
            f"  {name} leaderboard: {b['size']} entries, best {b['best']:.5g}, median {b['median']:.5g}, worst {b['worst']:.5g}"
        )
    if info["provenance"]:
        print("  provenance: " + "; ".join(f"{k}: {v}" for k, v in info["provenance"].items()))
    print()
    print(task.description.rstrip())
    return 0


def _fmt(value, digits: int = 5) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _print_grade(task, result) -> None:
    direction = "lower is better" if task.lower_is_better else "higher is better"
    print(f"task:      {task.id} ({task.metric}, {direction})")
    print(f"status:    {result.status}")
    if result.score is not None:
        boards = ", ".join(f"{k} {_fmt(v)}" for k, v in result.board_scores.items())
        print(f"score:     {_fmt(result.score)}" + (f" ({boards})" if boards else ""))
    if result.position is not None:
        per = ", ".join(f"{k} {p['position']}/{p['total']}" for k, p in result.positions.items())
        print(f"position:  {result.position:.3f}" + (f" ({per})" if per else " (relative performance gap)"))
    if result.medal is not None:
        t = result.medal_thresholds or {}
        print(
            f"medal:     {result.medal} (gold {_fmt(t.get('gold'))}, silver {_fmt(t.get('silver'))}, "
            f"bronze {_fmt(t.get('bronze'))}, median {_fmt(t.get('median'))})"
        )
    print(f"reward:    {'unknown (harness error)' if result.reward is None else f'{result.reward:.4f}'}")
    if result.reason:
        print(f"reason:    {result.reason}")
    res = result.resources or {}
    if res:
        print(
            f"resources: wall {_fmt(res.get('wall_s'), 3)} s, cpu {_fmt(res.get('cpu_s'), 3)} s, "
            f"peak memory {_fmt(res.get('peak_rss_mb'), 4)} MB"
        )
    if result.backend or result.isolated is not None:
        isolation = (
            "isolated"
            if result.isolated
            else "NOT isolated"
            if result.isolated is False
            else "isolation unknown"
        )
        print(f"sandbox:   {result.backend or '-'} ({isolation})")
    for warning in result.warnings:
        print(f"warning:   {warning}")
    if result.status in ("runtime_error", "timeout", "killed") and result.stderr_tail.strip():
        print("stderr (tail):")
        for line in result.stderr_tail.rstrip().splitlines()[-15:]:
            print(f"  {line}")


def _grade(args: argparse.Namespace) -> int:
    from pathlib import Path

    from wmrl.autoresearch.grading.grader import ExecutionGrader

    task = _load(args.task, time_limit_s=args.time_limit, memory_limit_mb=args.memory_limit)
    if task is None:
        return EXIT_BAD_INPUT
    try:
        code = Path(args.solution).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        print(f"wmrl: cannot read solution {args.solution!r}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = ExecutionGrader(backend=args.backend).grade(task, code)
    if args.json:
        out = result.to_dict()
        out["metric"] = task.metric
        out["lower_is_better"] = task.lower_is_better
        print(json.dumps(out, indent=2))
    else:
        _print_grade(task, result)
    return EXIT_HARNESS_ERROR if result.reward is None else 0
