"""``wmrl bench autoresearch``: the three modes on a real LM, same start, seeds, steps and tasks.

For every (mode, seed) it trains ``wmrl train autoresearch`` from the same starting policy (the warm
start by default) and evaluates the final policy on the held-out tasks with ``wmrl eval
autoresearch``; the starting policy is evaluated too (with the same seeds). Everything is written
under ``OUT`` and **kept**: a rerun skips what is complete and resumes what was interrupted, so the
benchmark can run in pieces (sessions, machines; ``--stop-after MINUTES`` ends a piece between runs)
and the table always aggregates every finished run (``complete`` says whether any is missing)::

    OUT/bench.json                 the settings and what they resolve to here (every run's training config, the
                                   starting policy's identity): a rerun must match (--force-settings overrides)
    OUT/start/eval_report.json     the starting policy on the held-out tasks
    OUT/runs/<mode>-s<seed>/       a `wmrl train autoresearch` run directory (+ eval_report.json)
    OUT/wm-tuned/s<seed>/          with --wm-tuned-on: that seed's world model, tuned on another
                                   benchmark's anchor pairs of the OTHER seeds (:mod:`.bench_wm_tuning`)
    OUT/table.json, OUT/table.md   the table, computed only from the files above (:func:`bench_table`)
    OUT/reward_vs_cost.png         training reward against measured cumulative wall seconds, per mode

The runs' shared settings are ``wmrl train autoresearch`` overrides, except what the bench sets
itself (``model.path``, ``steps``, ``mode``, ``seed``: refused). The held-out evaluations run where
the runs run (their ``model.device``, sandbox backend, limits, GPU slots and task roots). A
``bench.json`` left by an attempt that failed before any work binds nothing.

The table holds, per mode (mean ± SEM over seeds): the held-out valid rate, avg@k (mean over
categories) and medal share (over the evaluated runs: ``heldout_seeds``), the training reward at the start and the end, the world model's measured calibration
quality during the run (prequential MSE of the raw and calibrated world-model scores on the anchor
pairs, and the within-group bias reduction, over the steps after the first isotonic fit: before it
the map is the identity), the realised anchor fraction, and cost two ways kept
apart: **measured** (wall and accelerator seconds per stream on this machine, from the runs' cost
reports; a run continued after an interruption counts every attempt's wall time) and **modelled** (the paper's cost structure, :data:`PAPER_COST`: a run's relative cost if
execution were the share of real-execution GRPO's compute that it was in the paper).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from wmrl.autoresearch.evaluation.bench_wm_tuning import DEFAULT_TUNING
from wmrl.core.runlog import read_metrics

__all__ = [
    "PAPER_COST",
    "BenchSettings",
    "bench_table",
    "format_table",
    "model_identity",
    "modelled_cost",
    "resolved_settings",
    "run_bench",
]

#: The paper's reported training cost (GPU-hours, Qwen3.5-4B; ``docs/index.html`` of the official
#: release): real-execution GRPO, the pure world-model run, and WMRL. Execution's share of GRPO's
#: compute under this structure is (real - world_model) / real = 614 / 883 = 0.695.
PAPER_COST = {"real": 883.0, "world_model": 269.0, "wmrl": 286.0}

MODES = ("real", "world_model", "wmrl")


def modelled_cost(anchor_fraction: float | None) -> float | None:
    """Relative cost (real-execution GRPO = 1) of a run that executes ``anchor_fraction`` of its groups,
    under the paper's cost structure: ``(world_model + a * (real - world_model)) / real``.

    A *model*, never a measurement: it says what the run would cost if execution took the share of
    compute it took in the paper (the paper's own WMRL figure, 286, corresponds to a = 0.028).
    """
    if anchor_fraction is None:
        return None
    real, wm = PAPER_COST["real"], PAPER_COST["world_model"]
    return (wm + anchor_fraction * (real - wm)) / real


@dataclass(frozen=True)
class BenchSettings:
    """What a benchmark compares (stored in ``OUT/bench.json``).

    Attributes:
        modes: training modes compared.
        seeds: seeds, the same for every mode (training and evaluation).
        steps: GRPO steps per run.
        model: the starting policy of every run (``smollm2-warm``: the cached warm start).
        train_overrides: ``key=value`` settings of ``wmrl train autoresearch`` shared by every run.
        eval_tasks: the held-out tasks (``eval``: the bundled held-out split, or a comma-separated list).
        eval_samples: trajectories per task and seed (avg@k).
        eval_turns: execution turns per trajectory.
        eval_max_new_tokens: generated tokens per turn in evaluation (``None``: the training runs'
            ``grpo.max_completion_tokens``, after ``train_overrides``).
        eval_overview_tokens: overview budget of the evaluation prompt (``None``: the training runs'
            ``tasks.overview_tokens``).
        eval_time_limit_s: seconds per execution in evaluation.
        wm_tuned_on: a finished benchmark folder: each seed's runs judge with the world model tuned on
            the anchor pairs that folder's runs recorded at the other seeds (leave one seed out;
            :mod:`.bench_wm_tuning`). ``None``: the runs' own ``world_model`` setting.
        wm_tuning: ``key=value`` settings of that tuning stage (``wmrl train autoresearch-sft``'s);
            refused without ``wm_tuned_on``.
    """

    modes: tuple[str, ...] = MODES
    seeds: tuple[int, ...] = (0, 1, 2)
    # ~2 hours on 2 CPU cores: 9 runs of 4 steps (the quickstart's budget, ~10 min each) and 10
    # evaluations of 2 trajectories per held-out task. A GPU user raises --steps (and --eval-samples).
    steps: int = 4
    model: str = "smollm2-warm"
    train_overrides: tuple[str, ...] = ()
    eval_tasks: str = "eval"
    eval_samples: int = 2
    eval_turns: int = 1
    eval_max_new_tokens: int | None = None
    eval_overview_tokens: int | None = None
    eval_time_limit_s: float = 60.0
    wm_tuned_on: str | None = None
    wm_tuning: tuple[str, ...] = DEFAULT_TUNING

    def __post_init__(self) -> None:
        from wmrl.autoresearch.training.config import TrainConfig
        from wmrl.core.config import load_config, require

        # The evaluation prompt and reply budget are the training runs' own unless given.
        trained = load_config(
            TrainConfig, None, [*SCRIPT_ACTION, f"model.path={self.model}", *self.train_overrides]
        )
        if self.eval_max_new_tokens is None:
            object.__setattr__(self, "eval_max_new_tokens", trained.grpo.max_completion_tokens)
        if self.eval_overview_tokens is None:
            object.__setattr__(self, "eval_overview_tokens", trained.tasks.overview_tokens)

        require(
            bool(self.modes) and set(self.modes) <= set(MODES),
            f"modes must be among {list(MODES)}; got {self.modes}",
        )
        require(len(set(self.modes)) == len(self.modes), f"modes repeat: {self.modes}")
        owned = [o for o in self.train_overrides if o.split("=", 1)[0].strip() in _SET_BY_THE_BENCH]
        require(
            not owned,
            f"train overrides {owned} are the bench's own settings (each run's model is --model, its steps "
            "--steps, its mode and seed the bench's): they would be overridden, so they are refused",
        )
        require(
            len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds),
            f"seeds must be distinct; got {self.seeds}",
        )
        require(self.steps >= 1, f"steps must be >= 1; got {self.steps}")
        require(self.eval_samples >= 1 and self.eval_turns >= 1, "eval_samples and eval_turns must be >= 1")
        require(
            self.wm_tuned_on is None
            or (isinstance(self.wm_tuned_on, str) and self.wm_tuned_on.strip() != ""),
            f"wm_tuned_on must be a benchmark folder or None; got {self.wm_tuned_on!r}",
        )
        require(
            self.wm_tuned_on is not None or tuple(self.wm_tuning) == DEFAULT_TUNING,
            f"wm_tuning {list(self.wm_tuning)} is the tuned world model's; it needs wm_tuned_on (--wm-tuned-on)",
        )
        if self.wm_tuned_on is not None:  # the stage's own settings are checked now, not after hours
            from wmrl.core.modes import Mode

            require(
                any(Mode(m).needs_world_model for m in self.modes),
                f"wm_tuned_on tunes a world model, and none of the modes {list(self.modes)} uses one",
            )
            from wmrl.autoresearch.evaluation.bench_wm_tuning import tuning_config

            tuning_config(trained, "smollm2", [], self.wm_tuning)

    def stored(self) -> dict[str, Any]:
        """The settings as ``bench.json`` holds them (the tuning keys only when used, so benchmarks
        recorded before they existed still match)."""
        data = asdict(self)
        if self.wm_tuned_on is None:
            data.pop("wm_tuned_on")
            data.pop("wm_tuning")
        return data


#: What every bench run starts from, before the user's overrides: the script action as the bench was
#: designed and recorded with (the quickstart's defaults moved to the model action on 2026-12-05).
SCRIPT_ACTION = (
    "tasks.action=script",
    "tasks.ids=[penguin-body-mass,breast-cancer-diagnosis]",
    "tasks.prompts_per_task=1",
    "group_size=4",
    "learning_rate=5e-4",
    "lora.last_layers=0",
    "grpo.micro_batch_size=2",
)

#: The run settings the bench sets itself (a train override of one would be silently overridden).
_SET_BY_THE_BENCH = ("model", "model.path", "steps", "mode", "seed")

#: ``--quick``: the plumbing and a first number in ~20 minutes on 2 CPU cores (one seed, so no SEM):
#: 3 runs of 2 steps (~5 min each here) and 4 evaluations of one trajectory per held-out task.
QUICK = {"seeds": (0,), "steps": 2, "eval_samples": 1}


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return math.fsum(known) / len(known) if known else None


def _sem(values: Sequence[float | None]) -> float | None:
    from wmrl.autoresearch.evaluation.report import sem

    return sem([v for v in values if v is not None])


def _after_first_fit(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The corrector's rows whose prequential numbers were measured with a fitted isotonic map.

    A step's prequential MSE and bias reduction score the map fitted *before* its pairs, and a row's
    ``wmrl/calibrated`` is the state after its own refit, so step t was measured with a fitted map
    when row t-1 says ``calibrated``. Before the first fit the map is the identity: the calibrated
    MSE equals the raw one and the reduction is 0, which says nothing about calibration, so those
    steps are left out of both sides of the raw → calibrated comparison."""
    fitted, out = False, []
    for row in rows:
        if "wmrl/calibrated" not in row:
            continue
        if fitted and row.get("wmrl/prequential_mse_raw") is not None:
            out.append(row)
        fitted = row.get("wmrl/calibrated") == 1
    return out


def _run_numbers(run: Path) -> dict[str, Any] | None:
    """One finished run's numbers, read from its files only (``None`` if it did not finish)."""
    summary, cost, report = (
        _load(run / "run_summary.json"),
        _load(run / "cost_report.json"),
        _load(run / "eval_report.json"),
    )
    if summary is None or cost is None:
        return None
    metrics = read_metrics(run)
    rows = [r for r in metrics if r.get("reward") is not None]
    head = rows[: max(1, len(rows) // 4)] if rows else []
    tail = rows[-max(1, len(rows) // 4) :] if rows else []
    # the share of rollouts executed for real: per-rollout anchors and the memory make it differ from
    # the share of whole anchor groups (0 under the per-rollout default); older runs log groups only
    realised = [
        r["wmrl/execution_share_realised"]
        for r in metrics
        if r.get("wmrl/execution_share_realised") is not None
    ] or [
        r["wmrl/anchor_fraction_realised"]
        for r in metrics
        if r.get("wmrl/anchor_fraction_realised") is not None
    ]
    spent = cost.get("spent", {})
    fitted = _after_first_fit(metrics)
    return {
        "evaluated": report is not None,
        "heldout_valid_rate": None if report is None else report.get("valid_rate"),
        "heldout_avg_at_k": None if report is None else report.get("overall"),
        "heldout_medal_rate": None if report is None else report.get("medal_rate"),
        "reward_start": _mean([r["reward"] for r in head]),
        "reward_end": _mean([r["reward"] for r in tail]),
        "prequential_mse_raw": _mean([r.get("wmrl/prequential_mse_raw") for r in fitted]),
        "prequential_mse_calibrated": _mean([r.get("wmrl/prequential_mse_calibrated") for r in fitted]),
        "bias_reduction": _mean([r.get("wmrl/bias_reduction") for r in fitted]),
        "calibration_steps": len(fitted),
        "anchor_fraction_realised": realised[-1]
        if realised
        else (1.0 if cost.get("mode") == "real" else None),
        # every attempt of a run continued after an interruption (older summaries: wall_s alone)
        "measured_wall_s": summary.get("wall_s_total", summary.get("wall_s")),
        "measured_stream_wall_s": {k: v.get("wall_s") for k, v in spent.items()},
        "measured_accel_s": cost.get("total", {}).get("accel_s"),
        "steps": cost.get("steps"),
    }


def _mode_runs(out: Path, mode: str) -> list[Path]:
    """The run folders of ``mode`` in the benchmark folder ``out``: ``runs/<mode>-s<seed>`` only (a
    renamed copy such as ``real-s0-old`` is not a run), sorted by name."""
    if not (out / "runs").is_dir():
        return []
    return sorted(r for r in (out / "runs").glob(f"{mode}-s*") if r.name.rsplit("-s", 1)[1].isdigit())


def bench_table(out: str | Path) -> dict[str, Any]:
    """The table of a benchmark folder, computed from the saved runs alone (see the module docstring)."""
    out = Path(out)
    settings = _load(out / "bench.json") or {}
    modes = settings.get("modes") or list(MODES)
    planned = [int(x) for x in settings.get("seeds") or []]
    start = _load(out / "start" / "eval_report.json")
    table: dict[str, Any] = {
        "settings": settings,
        "start": None
        if start is None
        else {
            "heldout_valid_rate": start.get("valid_rate"),
            "heldout_valid_rate_sem": start.get("valid_rate_sem"),
            "heldout_avg_at_k": start.get("overall"),
            "heldout_avg_at_k_sem": start.get("overall_sem"),
            "heldout_medal_rate": start.get("medal_rate"),
            "heldout_medal_rate_sem": start.get("medal_rate_sem"),
        },
        "modes": {},
        "paper_cost_structure": dict(PAPER_COST),
        "notes": (
            "measured_* are measurements on this machine; modelled_relative_cost is the paper's cost structure "
            "applied to the realised anchor fraction (a model, not a measurement)"
        ),
    }
    for mode in modes:
        runs = _mode_runs(out, mode)
        numbers = {int(r.name.rsplit("-s", 1)[1]): _run_numbers(r) for r in runs}
        done = {s: n for s, n in numbers.items() if n is not None}
        # The held-out columns average the evaluated runs only: a trained run whose evaluation has
        # not run yet (a benchmark in pieces) counts in ``seeds`` but not in ``heldout_seeds``.
        entry: dict[str, Any] = {
            "seeds": sorted(done),
            "heldout_seeds": sorted(s for s, n in done.items() if n["evaluated"]),
            "runs": done,
        }
        for key in (
            "heldout_valid_rate",
            "heldout_avg_at_k",
            "heldout_medal_rate",
            "reward_start",
            "reward_end",
            "prequential_mse_raw",
            "prequential_mse_calibrated",
            "bias_reduction",
            "anchor_fraction_realised",
            "measured_wall_s",
            "measured_accel_s",
        ):
            values = [n[key] for n in done.values()]
            entry[key] = _mean(values)
            entry[f"{key}_sem"] = _sem(values)
        streams = sorted({k for n in done.values() for k in n["measured_stream_wall_s"]})
        entry["measured_stream_wall_s"] = {
            k: _mean([n["measured_stream_wall_s"].get(k) for n in done.values()]) for k in streams
        }
        entry["modelled_relative_cost"] = modelled_cost(entry["anchor_fraction_realised"])
        entry["seeds_planned"] = len(planned)
        table["modes"][mode] = entry
    # Complete: the starting policy and every planned (mode, seed) run are evaluated.
    table["complete"] = start is not None and all(
        (out / "runs" / f"{mode}-s{seed}" / name).is_file()
        for mode in modes
        for seed in planned
        for name in ("run_summary.json", "eval_report.json")
    )
    real_wall = table["modes"].get("real", {}).get("measured_wall_s")
    for entry in table["modes"].values():
        wall = entry.get("measured_wall_s")
        entry["measured_wall_vs_real"] = wall / real_wall if wall is not None and real_wall else None
    return table


def _pm(value: float | None, err: float | None, scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "–"
    text = f"{scale * value:.{digits}f}"
    return text if err is None else f"{text} ± {scale * err:.{digits}f}"


def _seeds_cell(entry: dict[str, Any]) -> str:
    """Finished seeds, of how many planned when fewer are finished (a benchmark in pieces), and how
    many of them the held-out columns average when some are not evaluated yet."""
    done, planned = len(entry["seeds"]), entry.get("seeds_planned") or 0
    cell = f"{done}" if done >= planned else f"{done} of {planned}"
    evaluated = entry.get("heldout_seeds")
    if evaluated is not None and len(evaluated) < done:
        cell += f" (held-out: {len(evaluated)})"
    return cell


def format_table(table: dict[str, Any]) -> str:
    """The table as Markdown."""
    lines = [
        "| mode | seeds | held-out valid % | held-out avg@k % | held-out medals % | train reward start → end | WM prequential MSE raw → calibrated | anchor fraction | measured wall s (vs real) | modelled cost (paper structure, real = 1) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    start = table.get("start")
    if start:
        lines.append(
            f"| start (no RL) | – | {_pm(start['heldout_valid_rate'], start['heldout_valid_rate_sem'], 100)} | "
            f"{_pm(start['heldout_avg_at_k'], start['heldout_avg_at_k_sem'], 100)} | "
            f"{_pm(start.get('heldout_medal_rate'), start.get('heldout_medal_rate_sem'), 100)} | – | – | – | – | – |"
        )
    for mode, e in table["modes"].items():
        ratio = e.get("measured_wall_vs_real")
        lines.append(
            f"| {mode} | {_seeds_cell(e)} | {_pm(e['heldout_valid_rate'], e['heldout_valid_rate_sem'], 100)} | "
            f"{_pm(e['heldout_avg_at_k'], e['heldout_avg_at_k_sem'], 100)} | "
            f"{_pm(e['heldout_medal_rate'], e['heldout_medal_rate_sem'], 100)} | "
            f"{_pm(e['reward_start'], None, 1, 3)} → {_pm(e['reward_end'], e['reward_end_sem'], 1, 3)} | "
            f"{_pm(e['prequential_mse_raw'], None, 1, 3)} → {_pm(e['prequential_mse_calibrated'], None, 1, 3)} | "
            f"{_pm(e['anchor_fraction_realised'], None, 1, 3)} | "
            f"{_pm(e['measured_wall_s'], e['measured_wall_s_sem'], 1, 0)}"
            f"{'' if ratio is None else f' ({ratio:.2f}x)'} | {_pm(e['modelled_relative_cost'], None, 1, 3)} |"
        )
    return "\n".join(lines)


def _plot(out: Path, table: dict[str, Any]) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for mode in table["modes"]:
        for k, run in enumerate(_mode_runs(out, mode)):
            rows = [r for r in read_metrics(run) if r.get("reward") is not None]
            if not rows:
                continue
            spent, xs = 0.0, []
            for r in rows:
                spent += sum(
                    v for key, v in r.items() if key.startswith("cost/") and key.endswith("_s") and v
                )
                xs.append(spent)
            ax.plot(
                xs,
                [r["reward"] for r in rows],
                color=f"C{list(MODES).index(mode)}",
                alpha=0.8,
                label=mode if k == 0 else None,
                marker=".",
            )
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("measured cumulative seconds (sum of the cost/* streams)")
    ax.set_ylabel("training reward (corrected)")
    ax.set_title("Reward against measured cost")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "reward_vs_cost.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def resolved_settings(settings: BenchSettings) -> dict[str, Any]:
    """What ``settings`` resolve to on this install, stored beside them in ``OUT/bench.json``.

    ``train_config``: a run's whole training config (the embedded defaults under the overrides);
    ``start_model``: the starting policy's identity (the warm start's cache folder, whose name
    hashes its config and tasks, or a local folder's files). A benchmark continued after a default,
    the warm start or the model folder changed is then refused instead of mixing unlike runs.
    """
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.core.config import load_config, to_dict

    config = load_config(
        TrainConfig, None, [*_run_overrides(settings), f"mode={settings.modes[0]}", "seed=0"]
    )
    return {"train_config": to_dict(config), "start_model": model_identity(settings.model)}


def _run_overrides(settings: BenchSettings) -> list[str]:
    """The ``wmrl train autoresearch`` settings every run shares (each adds its mode and seed)."""
    return [
        *SCRIPT_ACTION,
        *settings.train_overrides,
        f"model.path={settings.model}",
        f"steps={settings.steps}",
    ]


def model_identity(spec: str) -> str:
    """A policy spec's identity: the cached warm start's folder for ``smollm2-warm``, a digest of a
    local folder's (or file's) names, sizes and modification times, else the spec itself."""
    import hashlib

    from wmrl.autoresearch.training.warm import WARM_SPECS, warm_start_dir

    if spec in WARM_SPECS:
        return str(warm_start_dir(spec))
    path = Path(spec)
    if not path.exists():
        return spec  # an embedded model (``smollm2``): its package's
    files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    digest = hashlib.sha256()
    for f in files:
        stat = f.stat()
        digest.update(
            f"{f.relative_to(path) if f != path else f.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode()
        )
    return f"{path.resolve()}#{digest.hexdigest()[:16]}"


def _differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two JSON objects."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return [
            d
            for key in sorted(set(saved) | set(current))
            for d in _differences(saved.get(key), current.get(key), f"{prefix}{key}.")
        ]
    return [] if saved == current else [prefix.rstrip(".")]


def run_bench(  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    settings: BenchSettings,
    out: str | Path,
    *,
    force_settings: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = True,
    stop_after_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run what is missing in ``out`` (see the module docstring) and return the table.

    ``stop_after_s``: start no new piece of work (the starting policy's evaluation, one seed's
    world-model tuning, or one run's training and evaluation) once this many seconds (of ``clock``) have passed; what was started
    finishes, everything finished is kept, and the same call later continues where this one stopped
    (``table["complete"]`` says whether anything is left). ``None``: run everything.
    """
    if stop_after_s is not None and stop_after_s < 0:
        raise ValueError(f"stop_after_s must be >= 0; got {stop_after_s}")
    began = clock()
    from wmrl.autoresearch.evaluation.bench_wm_tuning import source_identity
    from wmrl.autoresearch.evaluation.run import evaluate_policy
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.autoresearch.training.run import run_training
    from wmrl.autoresearch.training.warm import resolve_spec
    from wmrl.core.config import ConfigError, load_config
    from wmrl.core.rundir import RunDirectory
    from wmrl.core.runlog import write_json_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    saved = _load(out / "bench.json")
    resolved = resolved_settings(settings)
    tuning_sources = _tuning_sources(settings, out)
    if tuning_sources is not None:
        resolved["wm_tuning_sources"] = {str(s): source_identity(r) for s, r in tuning_sources.items()}
    current = json.loads(json.dumps({**settings.stored(), "resolved": resolved}))
    if saved is not None and _same_source(saved, current):
        # The source is its pairs (pinned by digest in resolved), not how its path was typed.
        current["wm_tuned_on"] = saved["wm_tuned_on"]
    if saved is not None and saved != current and not force_settings and _holds_work(out):
        differs = _differences(saved, current)
        raise ConfigError(
            f"{out} holds a benchmark with other settings ({', '.join(differs[:8])}"
            f"{', ...' if len(differs) > 8 else ''}); use the same ones to add runs, another --out, or "
            "--force-settings"
        )
    write_json_atomic(out / "bench.json", current)
    start_model = resolve_spec(settings.model, log=log, progress=progress)
    base = _run_overrides(settings)
    # Each run's own config is checked before anything runs (a typo fails at once).
    checked = [load_config(TrainConfig, None, [*base, f"mode={mode}", "seed=0"]) for mode in settings.modes]
    where = _eval_placement(checked[0])

    def evaluate(model: str, seeds: Sequence[int], train_tasks: Sequence[str] | None, dest: Path) -> None:
        if dest.is_file():
            return
        t0 = time.perf_counter()
        # BenchSettings.__post_init__ fills both from the training config (which resolves its budget)
        assert settings.eval_max_new_tokens is not None and settings.eval_overview_tokens is not None
        report = evaluate_policy(
            model,
            tasks=settings.eval_tasks,
            samples=settings.eval_samples,
            seeds=seeds,
            turns=settings.eval_turns,
            train_tasks=train_tasks,
            max_new_tokens=settings.eval_max_new_tokens,
            overview_tokens=settings.eval_overview_tokens,
            time_limit_s=settings.eval_time_limit_s,
            progress=progress,
            **where,
        )
        data = report.to_dict()
        data["wall_s"] = time.perf_counter() - t0
        dest.parent.mkdir(parents=True, exist_ok=True)  # OUT/start/ does not exist before its report
        write_json_atomic(dest, data)
        log(f"[wmrl] bench: held-out {dest.parent.name}: valid {report.valid_rate}, avg@k {report.overall}")

    from wmrl.autoresearch.training.data import recorded_train_tasks

    lineage = recorded_train_tasks(start_model) or None

    def out_of_time(what: str) -> bool:
        if stop_after_s is None or clock() - began < stop_after_s:
            return False
        log(
            f"[wmrl] bench: {stop_after_s / 60:g} min budget spent; not starting {what} "
            "(finished runs are kept: rerun the same command to continue)"
        )
        return True

    start_report = out / "start" / "eval_report.json"
    if not start_report.is_file() and out_of_time("the starting policy's evaluation"):
        return write_table(out)
    evaluate(start_model, settings.seeds, lineage, start_report)
    # Every seed's world model is tuned before any run trains (a tuning is the same for every mode).
    world_models: dict[int, list[str]] = {}
    for seed, runs in (tuning_sources or {}).items():
        final = _tuned_world_model(settings, out, seed, runs, start_model, log, progress, out_of_time)
        if final is None:
            return write_table(out)
        world_models[seed] = [f"world_model.backend.path={final}"]
    for seed in settings.seeds:
        for mode in settings.modes:
            run = out / "runs" / f"{mode}-s{seed}"
            finished = (run / "run_summary.json").is_file() and (run / "eval_report.json").is_file()
            if not finished and out_of_time(f"run {run.name}"):
                return write_table(out)
            if not (run / "run_summary.json").is_file():
                config = load_config(
                    TrainConfig, None, [*base, *world_models.get(seed, []), f"mode={mode}", f"seed={seed}"]
                )
                log(f"[wmrl] bench: training {run.name} ({settings.steps} steps)")
                run_dir = RunDirectory(run, resume=run.exists(), command="wmrl bench autoresearch")
                run_training(config, run_dir, log=log, progress=progress)
            evaluate(str(run / "final"), [seed], None, run / "eval_report.json")
    return write_table(out)


def _eval_placement(train: Any) -> dict[str, Any]:
    """Where the held-out evaluations run: the training runs' own device, sandbox and task roots
    (``model.device``, ``sandbox.backend/memory_limit_mb/workers/gpus/gpus_per_slot``,
    ``tasks.mledojo_root/data_dir``), so that ``model.device=cuda`` or ``sandbox.backend=docker``
    holds for the evaluations too. The evaluation's sandbox is a local pool: with
    ``sandbox.pool=ray`` it runs on this machine with the same backend and the local defaults of
    ``evaluate_policy`` for concurrency and GPUs (the runs' ``workers`` is then the cluster's slot
    count, and their GPUs are the Ray slots')."""
    from wmrl.autoresearch.training.builders import resolve_device

    box = train.sandbox
    local = box.pool == "local"
    return {
        "device": resolve_device(train),
        "backend": box.backend,
        "memory_limit_mb": box.memory_limit_mb,
        **(
            {"workers": box.workers, "gpus": tuple(box.gpus), "gpus_per_slot": box.gpus_per_slot}
            if local
            else {}
        ),
        "mledojo_root": train.tasks.mledojo_root,
        "data_dir": train.tasks.data_dir,
    }


def _holds_work(out: Path) -> bool:
    """Whether the benchmark folder ``out`` holds anything its settings produced (an evaluation, a run,
    a tuning). A ``bench.json`` alone, left by a first attempt that failed before any work (a
    mistyped model or task), does not bind the corrected command."""
    return (out / "start").exists() or any((out / "runs").glob("*")) or any((out / "wm-tuned").glob("*"))


def _same_source(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether two benchmarks' ``wm_tuned_on`` name the same source: the same runs with the same
    pairs (``resolved.wm_tuning_sources``), whatever path (relative, absolute) each was given as."""
    if "wm_tuned_on" not in saved or "wm_tuned_on" not in current:
        return False
    pins = [d.get("resolved", {}).get("wm_tuning_sources") for d in (saved, current)]
    return pins[0] is not None and pins[0] == pins[1]


def _tuning_sources(settings: BenchSettings, out: Path) -> dict[int, list[Path]] | None:
    """Per seed, the source runs of its tuned world model (``None`` without ``wm_tuned_on``)."""
    from wmrl.autoresearch.evaluation.bench_wm_tuning import source_runs
    from wmrl.core.config import ConfigError

    if settings.wm_tuned_on is None:
        return None
    # resolved: the tuning's corpus.anchor_runs (checked when an interrupted tuning resumes) must not
    # depend on how the path was typed, as the benchmark's identity does not (_same_source)
    source = Path(settings.wm_tuned_on).resolve()
    if source == out.resolve():
        raise ConfigError(
            f"--wm-tuned-on {source} is the benchmark folder itself: tune on another benchmark's runs "
            "(pairs of runs this benchmark is still adding would make the tuning depend on their order)"
        )
    return {seed: source_runs(source, seed) for seed in settings.seeds}


def _tuned_world_model(settings, out, seed, runs, start_model, log, progress, out_of_time) -> Path | None:
    """Seed ``seed``'s tuned world model (tuned now unless finished before); ``None``: out of time."""
    from wmrl.autoresearch.evaluation.bench_wm_tuning import finished_tuning, tuned_dir, tuning_config
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.autoresearch.training.sft import run_sft
    from wmrl.autoresearch.training.warm import resolve_spec
    from wmrl.core.config import load_config

    dest = tuned_dir(out, seed)
    train = load_config(
        TrainConfig, None, [*_run_overrides(settings), f"mode={settings.modes[0]}", f"seed={seed}"]
    )
    # The world model the runs would use untuned: their own setting, else the starting policy.
    path = train.world_model.backend.path
    base = start_model if path is None else resolve_spec(path, log=log, progress=progress)
    config = tuning_config(train, base, runs, settings.wm_tuning)
    final = finished_tuning(dest, config)
    if final is not None:
        return final
    if out_of_time(f"the world model tuning of seed {seed}"):
        return None
    log(
        f"[wmrl] bench: tuning seed {seed}'s world model on {', '.join(r.name for r in runs)} of {settings.wm_tuned_on}"
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    run_sft(config, dest, resume=dest.exists(), log=log, progress=progress)
    return dest / "final"


def write_table(out: str | Path) -> dict[str, Any]:
    """Compute the table from the files in ``out`` and write ``table.json``, ``table.md`` and the plot.

    Raises ``ConfigError`` when ``out`` holds no benchmark (no ``bench.json``): nothing is written there.
    """
    from wmrl.core.config import ConfigError
    from wmrl.core.runlog import write_json_atomic

    out = Path(out)
    if not (out / "bench.json").is_file():
        raise ConfigError(f"{out} holds no benchmark (no bench.json): nothing to tabulate")
    table = bench_table(out)
    write_json_atomic(out / "table.json", table)
    (out / "table.md").write_text(format_table(table) + "\n")
    _plot(out, table)
    return table


def register(root) -> None:
    """``wmrl bench autoresearch`` (registered from the autoresearch package's entry point)."""
    sub = root.subcommand(
        "bench",
        "autoresearch",
        "real-LM benchmark: the three modes from the same warm start, same seeds/steps/tasks; held-out "
        "evaluation of every final policy; reward against cost; measured cost beside the paper's cost model",
        _cli,
    )
    sub.add_argument(
        "--quick",
        action="store_true",
        help="1 seed, 2 steps, 1 sample per held-out task: the plumbing and a first number (~20 min on 2 CPU cores)",
    )
    sub.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="MINUTES",
        help="start no new run after this many minutes (a benchmark in pieces: rerun the same command to continue)",
    )
    sub.add_argument("--seeds", type=int, default=None, help="number of seeds, 0..N-1 (default 3, quick 1)")
    sub.add_argument("--modes", default=",".join(MODES), help="comma-separated modes (default: all three)")
    sub.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default 4, quick 2)")
    sub.add_argument("--model", default="smollm2-warm", help="the starting policy of every run")
    sub.add_argument(
        "--eval-samples",
        type=int,
        default=None,
        help="trajectories per held-out task and seed (default 2, quick 1)",
    )
    sub.add_argument("--eval-turns", type=int, default=1, help="execution turns per evaluation trajectory")
    sub.add_argument(
        "--eval-max-new-tokens",
        type=int,
        default=None,
        help="tokens per evaluation reply (default: training's)",
    )
    sub.add_argument(
        "--eval-overview-tokens",
        type=int,
        default=None,
        help="evaluation overview budget (default: training's)",
    )
    sub.add_argument(
        "--eval-tasks", default="eval", help="held-out tasks (default: the bundled held-out split)"
    )
    sub.add_argument(
        "--wm-tuned-on",
        default=None,
        metavar="BENCH_DIR",
        help="judge each seed's runs with the world model tuned on the anchor pairs BENCH_DIR's runs "
        "recorded at the other seeds (leave one seed out; kept in OUT/wm-tuned/)",
    )
    sub.add_argument(
        "--wm-tuning",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help=f"a setting of that tuning stage (wmrl train autoresearch-sft's; repeatable; default {' '.join(DEFAULT_TUNING)})",
    )
    sub.add_argument("--out", default="runs/bench-autoresearch", help="benchmark folder (reruns add to it)")
    sub.add_argument("--table-only", action="store_true", help="only recompute the table from the saved runs")
    sub.add_argument("--force-settings", action="store_true", help="add runs although bench.json differs")
    sub.add_argument("--no-progress", action="store_true", help="hide progress bars")
    sub.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="wmrl train autoresearch settings for every run"
    )


def settings_from_cli(args) -> BenchSettings:
    """The benchmark's settings from ``wmrl bench autoresearch``'s arguments.

    A number not given on the command line is ``--quick``'s (``QUICK``) or else ``BenchSettings``'
    own default, so the CLI and the API run the same benchmark; one given is used as given (``0``
    included, which ``BenchSettings`` then refuses rather than silently taking the default).
    """
    given = {
        "seeds": None if args.seeds is None else tuple(range(args.seeds)),
        "steps": args.steps,
        "eval_samples": args.eval_samples,
    }
    if args.wm_tuning is not None and args.wm_tuned_on is None:
        from wmrl.core.config import ConfigError

        raise ConfigError(f"--wm-tuning {args.wm_tuning} needs --wm-tuned-on (the tuned world model's stage)")
    chosen = {**(QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}}
    return BenchSettings(
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        model=args.model,
        train_overrides=tuple(args.overrides),
        eval_tasks=args.eval_tasks,
        eval_turns=args.eval_turns,
        eval_max_new_tokens=args.eval_max_new_tokens,
        eval_overview_tokens=args.eval_overview_tokens,
        wm_tuned_on=args.wm_tuned_on,
        wm_tuning=DEFAULT_TUNING if args.wm_tuning is None else tuple(args.wm_tuning),
        **chosen,
    )


def _cli(args) -> int:
    import sys

    from wmrl.core.cli_runs import USER_ERRORS
    from wmrl.core.config import ConfigError
    from wmrl.core.errors import EXIT_INTERRUPTED, Interrupted

    out = Path(args.out)
    try:
        if args.table_only:
            table = write_table(out)
        else:
            settings = settings_from_cli(args)
            if args.stop_after is not None and args.stop_after < 0:
                raise ConfigError(f"--stop-after must be >= 0 minutes; got {args.stop_after}")
            table = run_bench(
                settings,
                out,
                force_settings=args.force_settings,
                progress=not args.no_progress,
                stop_after_s=None if args.stop_after is None else 60.0 * args.stop_after,
            )
    except (Interrupted, KeyboardInterrupt) as err:
        # Finished runs and evaluations are kept; a run in progress keeps its last checkpoint.
        where = f" ({err})" if isinstance(err, Interrupted) else ""
        print(
            f"wmrl bench autoresearch: interrupted{where}; finished runs are kept in {out}: "
            "rerun the same command to continue",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except USER_ERRORS as err:
        print(f"wmrl bench autoresearch: error: {err}", file=sys.stderr)
        return 2
    print(format_table(table))
    print(f"[wmrl] table: {out / 'table.json'}, {out / 'table.md'}; plot: {out / 'reward_vs_cost.png'}")
    if not table.get("complete"):
        print("[wmrl] the benchmark is not complete: rerun the same command to add the missing runs")
    return 0
