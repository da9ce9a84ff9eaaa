"""``wmrl bench synthetic``: every arm on the same seeds, true reward against cost.

Writes ``DIR/results.json`` (per arm under ``arms.<name>``: ``final_true_reward``,
``final_true_reward_ci95``, ``cost``, ``cost_to_target``, ``compute_ratio_vs_real``, and more),
``DIR/reward_vs_cost.png`` and, with ``--sweep``, ``DIR/sweep.png`` and ``sweep`` in the JSON.
Definitions:

* ``final_true_reward``: mean over seeds of the policy's expected true reward after the last step;
  ``final_true_reward_ci95``: half-width of the 95% t-interval over seeds.
* ``cost``: mean total cost of the run (same number of steps for every arm).
* ``cost_to_target``: cost at which the arm's seed-mean curve first reaches 95% of the ``real``
  arm's final true reward; ``None`` if it never does.
* ``compute_ratio_vs_real``: ``real`` arm's total cost / this arm's total cost (the paper's
  headline unit: the same training run, costed).
* ``reward_ratio_vs_real``: this arm's final true reward / ``real``'s.

``--noise-sweep`` repeats a set of arms under every kind of execution noise (``none``, ``gaussian``,
``flaky``, ``bernoulli``; see ``simulation.py``) and writes ``noise_sweep`` into the JSON.

**At equal cost** (``equal_cost`` in the JSON, the table printed first): every arm but ``real`` is
continued past ``--steps`` until it has spent what ``real`` spends in ``--steps`` steps, and is read
at ``real``'s cost and a third of it, with the cost at which its seed-mean curve reaches 95% and
100% of ``real``'s final reward and per-seed paired differences against ``real_cache`` (real
execution with a result cache: the strongest baseline) and ``paper`` (the paper's configuration);
see :mod:`wmrl.core.bench.equal_cost`. ``--variants V`` sets how solutions recur (each solution in
``V`` variants that share its outcome but not its key; 0: nothing recurs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.core.bench.equal_cost import equal_cost_summary, format_equal_cost
from wmrl.core.bench.intervals import ci95
from wmrl.core.bench.lag_sweep import format_lag_sweep, lag_sweep
from wmrl.core.bench.runstore import RunStore
from wmrl.core.bench.simulation import ARMS, EXEC_NOISE, ArmResult, SimConfig, run_arm
from wmrl.core.config import ConfigError, apply_overrides, from_dict, to_dict
from wmrl.core.corrector import CorrectorConfig

SENSITIVITY_EXEC_COSTS = (2.0, 5.0, 20.0)
SWEEP_BIAS = (0.5, 1.0, 2.0)
SWEEP_NOISE = (0.05, 0.15, 0.3)
SWEEP_FRACTIONS = (0.05, 0.1, 0.2, 0.3)
NOISE_SWEEP_ARMS = (
    "real",
    "wmrl",
    "wmrl_previous",
    "wmrl_undeclared",
    "wmrl_repeats",
    "wmrl_rollout",
    "debias_only",
    "fusion_only",
)


def summarise(
    cfg: SimConfig, runs: dict[str, list[ArmResult]], exec_cost: float
) -> dict[str, dict[str, Any]]:
    """The per-arm summary for one execution cost."""
    k = cfg.steps + 1  # runs continued past cfg.steps (for equal cost) are read at cfg.steps here
    real_final = float(np.mean([r.true_reward[k - 1] for r in runs["real"]])) if "real" in runs else None
    real_cost = (
        float(np.mean([r.cost(cfg, exec_cost)[k - 1] for r in runs["real"]])) if "real" in runs else None
    )
    target = None if real_final is None else 0.95 * real_final
    out = {}
    for arm, results in runs.items():
        finals = np.array([r.true_reward[k - 1] for r in results])
        curve = np.mean([r.true_reward[:k] for r in results], axis=0)
        costs = np.mean([r.cost(cfg, exec_cost)[:k] for r in results], axis=0)
        reached = np.flatnonzero(curve >= target) if target is not None else np.array([], dtype=int)
        weights = [m.get("wmrl/effective_lr_scale") for r in results for m in r.metrics[: k - 1]]
        anchor_w = [m.get("wmrl/weight_anchor") for r in results for m in r.metrics[: k - 1]]
        share = [m.get("wmrl/anchor_share") for r in results for m in r.metrics[: k - 1]]
        out[arm] = {
            "final_true_reward": float(finals.mean()),
            "final_true_reward_ci95": ci95(finals),
            "final_true_reward_per_seed": finals.tolist(),
            "cost": float(costs[-1]),
            "cost_to_target": float(costs[reached[0]]) if reached.size else None,
            "compute_ratio_vs_real": real_cost / float(costs[-1]) if real_cost and costs[-1] > 0 else None,
            "reward_ratio_vs_real": float(finals.mean()) / real_final if real_final else None,
            "realised_anchor_fraction": float(
                np.mean([r.executions[: k - 1].sum() / r.rollouts[: k - 1].sum() for r in results])
            ),
            "mean_effective_lr_scale": _mean_known(weights),
            "mean_anchor_weight": _mean_known(anchor_w),
            "mean_anchor_share": _mean_known(share),
        }
    return out


#: ``(cfg, arm, seed, keep_metrics=False) -> ArmResult``: :func:`run_arm` or a stored version of it.
Runner = Callable[..., ArmResult]


def stored_runner(store: RunStore) -> Runner:
    """:func:`run_arm`, with each finished run kept in ``store`` and read back when asked again."""

    def run(
        cfg: SimConfig, arm: str, seed: int, keep_metrics: bool = False, until_cost: float | None = None
    ) -> ArmResult:
        inputs = {
            "bench": "synthetic",
            "config": to_dict(cfg),
            "arm": arm,
            "seed": seed,
            "keep_metrics": keep_metrics,
            "until_cost": until_cost,
        }
        return store.run(
            inputs,
            lambda: run_arm(cfg, arm, seed, keep_metrics=keep_metrics, until_cost=until_cost),
            ArmResult.to_dict,
            ArmResult.from_dict,
        )

    return run


def _mean_known(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def run_arms(
    cfg: SimConfig,
    arms: list[str],
    seeds: list[int],
    progress: bool = True,
    run: Runner = run_arm,
    equal_cost: bool = False,
) -> dict[str, list[ArmResult]]:
    """Every arm on every seed. ``equal_cost``: ``real`` runs first, and every other arm is continued
    past ``cfg.steps`` until it has spent what ``real`` spent on the same seed."""
    runs: dict[str, list[ArmResult]] = {}
    total = len(arms) * len(seeds)
    done = 0
    budget: dict[int, float] = {}
    if equal_cost and "real" in arms:
        arms = ["real", *[a for a in arms if a != "real"]]
    for arm in arms:
        runs[arm] = []
        for seed in seeds:
            if equal_cost and arm != "real" and seed in budget:
                result = run(cfg, arm, seed, keep_metrics=True, until_cost=budget[seed])
            else:
                result = run(cfg, arm, seed, keep_metrics=True)
            if arm == "real":
                budget[seed] = float(result.cost(cfg)[cfg.steps])
            runs[arm].append(result)
            done += 1
            if progress and (sys.stderr.isatty() or done % max(1, total // 10) == 0 or done == total):
                end = "" if sys.stderr.isatty() else "\n"
                print(
                    f"\r  {done}/{total} runs ({arm}, seed {seed})".ljust(60),
                    end=end,
                    file=sys.stderr,
                    flush=True,
                )
    if progress and sys.stderr.isatty():
        print(file=sys.stderr)
    return runs


def cost_to_reach(runs: list[ArmResult], cfg: SimConfig, level: float) -> float | None:
    """Cost at which the seed-mean true-reward curve first reaches ``level`` (``None`` if never)."""
    curve = np.mean([r.true_reward for r in runs], axis=0)
    costs = np.mean([r.cost(cfg) for r in runs], axis=0)
    hit = np.flatnonzero(curve >= level)
    return float(costs[hit[0]]) if hit.size else None


def matched_compute_ratio(runs: dict[str, list[ArmResult]], cfg: SimConfig) -> float | None:
    """How much less the ``wmrl`` arm paid than ``real`` to first reach 98% of wmrl's final reward.

    Unlike the same-steps compute ratio (fixed by the anchor fraction), this one moves with
    world-model quality: it is ``real``'s cost to reach the level over ``wmrl``'s cost to reach it.
    """
    level = 0.98 * float(np.mean([r.true_reward[-1] for r in runs["wmrl"]]))
    real_cost, wmrl_cost = cost_to_reach(runs["real"], cfg, level), cost_to_reach(runs["wmrl"], cfg, level)
    if real_cost is None or not wmrl_cost:
        return None
    return real_cost / wmrl_cost


def sweep(cfg: SimConfig, seeds: list[int], progress: bool = True, run: Runner = run_arm) -> dict[str, Any]:
    """``wmrl``/``real`` final-reward ratio and compute ratio over world-model quality."""
    cells = []
    for bias in SWEEP_BIAS:
        for noise in SWEEP_NOISE:
            cell_cfg = replace(
                cfg, bias_strength=bias, noise=noise, confusion_rate=min(cfg.confusion_rate, 1.0 / bias)
            )
            runs = {arm: [run(cell_cfg, arm, s) for s in seeds] for arm in ("real", "wmrl", "world_model")}
            summary = summarise(cell_cfg, runs, cfg.exec_cost)
            cells.append(
                {
                    "bias_strength": bias,
                    "noise": noise,
                    "reward_ratio_wmrl_vs_real": summary["wmrl"]["final_true_reward"]
                    / summary["real"]["final_true_reward"],
                    "reward_ratio_world_model_vs_real": summary["world_model"]["final_true_reward"]
                    / summary["real"]["final_true_reward"],
                    "compute_ratio": summary["wmrl"]["compute_ratio_vs_real"],
                    "matched_compute_ratio": matched_compute_ratio(runs, cell_cfg),
                    "wmrl_reached_target": summary["wmrl"]["cost_to_target"] is not None,
                }
            )
            if progress:
                print(
                    f"\r  sweep cell bias={bias} noise={noise} done".ljust(60),
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
    if progress:
        print(file=sys.stderr)
    return {"bias_levels": list(SWEEP_BIAS), "noise_levels": list(SWEEP_NOISE), "cells": cells}


def noise_sweep(
    cfg: SimConfig,
    seeds: list[int],
    progress: bool = True,
    arms: tuple[str, ...] = NOISE_SWEEP_ARMS,
    run: Runner = run_arm,
) -> dict[str, Any]:
    """``arms`` (default :data:`NOISE_SWEEP_ARMS`) under every kind of execution noise (same seeds)."""
    out: dict[str, Any] = {}
    for kind in EXEC_NOISE:
        kind_cfg = replace(cfg, exec_noise=kind)
        runs = run_arms(kind_cfg, list(arms), seeds, progress=False, run=run)
        summary = summarise(kind_cfg, runs, cfg.exec_cost)
        out[kind] = {
            arm: {
                k: summary[arm][k]
                for k in (
                    "final_true_reward",
                    "final_true_reward_ci95",
                    "final_true_reward_per_seed",
                    "reward_ratio_vs_real",
                    "compute_ratio_vs_real",
                    "mean_anchor_weight",
                    "mean_anchor_share",
                )
            }
            for arm in arms
        }
        if progress:
            print(f"\r  noise sweep: {kind} done".ljust(60), end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return out


def format_noise_sweep(result: dict[str, Any]) -> str:
    kinds = list(result)
    lines = [f"{'arm':<18}" + "".join(f"{k:>22}" for k in kinds)]
    for arm in result[kinds[0]]:
        cells = [result[k][arm] for k in kinds]
        lines.append(
            f"{arm:<18}"
            + "".join(
                f"{c['final_true_reward']:>10.3f} ± {c['final_true_reward_ci95']:.3f} "
                + ("(-)" if c["reward_ratio_vs_real"] is None else f"({c['reward_ratio_vs_real']:.2f})")
                for c in cells
            )
        )
    return "\n".join(lines)


def fraction_sweep(cfg: SimConfig, seeds: list[int], run: Runner = run_arm) -> list[dict[str, Any]]:
    """The cost/quality frontier: the default ``wmrl`` arm at several anchor fractions."""
    rows = []
    real = [run(cfg, "real", s) for s in seeds]
    real_final = float(np.mean([r.true_reward[-1] for r in real]))
    real_cost = float(np.mean([r.cost(cfg)[-1] for r in real]))
    for fraction in SWEEP_FRACTIONS:
        corrector = replace(cfg.corrector, scheduler=replace(cfg.corrector.scheduler, fraction=fraction))
        runs = [run(replace(cfg, corrector=corrector), "wmrl", s) for s in seeds]
        finals = np.array([r.true_reward[-1] for r in runs])
        cost = float(np.mean([r.cost(cfg)[-1] for r in runs]))
        rows.append(
            {
                "anchor_fraction": fraction,
                "final_true_reward": float(finals.mean()),
                "final_true_reward_ci95": ci95(finals),
                "reward_ratio_vs_real": float(finals.mean()) / real_final,
                "compute_ratio_vs_real": real_cost / cost,
            }
        )
    return rows


def format_table(summary: dict[str, dict[str, Any]], exec_cost: float) -> str:
    lines = [
        f"exec cost = {exec_cost:g} units per real execution",
        f"{'arm':<20} {'final reward':>16} {'cost':>10} {'cost→target':>12} {'compute ratio':>14} {'eff. lr':>8}",
    ]
    for arm, s in summary.items():
        to_target = "never" if s["cost_to_target"] is None else f"{s['cost_to_target']:.0f}"
        ratio = "-" if s["compute_ratio_vs_real"] is None else f"{s['compute_ratio_vs_real']:.2f}x"
        lr = "-" if s["mean_effective_lr_scale"] is None else f"{s['mean_effective_lr_scale']:.2f}"
        lines.append(
            f"{arm:<20} {s['final_true_reward']:>8.3f} ± {s['final_true_reward_ci95']:<5.3f} {s['cost']:>10.0f} {to_target:>12} {ratio:>14} {lr:>8}"
        )
    return "\n".join(lines)


def plot_curves(cfg: SimConfig, runs: dict[str, list[ArmResult]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = ("-", "--", ":", "-.")
    for i, (arm, results) in enumerate(runs.items()):
        # runs continued to real's cost have different lengths: the seed-mean over the common steps
        k = min(len(r.true_reward) for r in results)
        costs = np.mean([r.cost(cfg)[:k] for r in results], axis=0)
        curves = np.array([r.true_reward[:k] for r in results])
        mean = curves.mean(axis=0)
        half = np.array([ci95(curves[:, j]) for j in range(curves.shape[1])])
        color = plt.cm.tab10(i % 10) if len(runs) <= 10 else plt.cm.tab20(i % 20)
        ax.plot(costs, mean, label=arm, color=color, ls=styles[(i // 10) % len(styles)])
        ax.fill_between(costs, mean - half, mean + half, alpha=0.12, color=color)
    ax.set_xscale("log")
    ax.set_xlabel(
        f"cumulative cost (units; real execution = {cfg.exec_cost:g}, world model = {cfg.wm_cost:g}, generation+update = {cfg.base_cost:g})"
    )
    ax.set_ylabel("true expected reward of the policy")
    ax.set_title("Simulated GRPO: true reward against cost (mean, 95% CI over seeds)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bias, noise = result["bias_levels"], result["noise_levels"]
    grids = {}
    for key in ("reward_ratio_wmrl_vs_real", "compute_ratio", "matched_compute_ratio"):
        grid = np.full((len(bias), len(noise)), np.nan)
        for c in result["cells"]:
            if c[key] is not None:
                grid[bias.index(c["bias_strength"]), noise.index(c["noise"])] = c[key]
        grids[key] = grid
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, (key, title) in zip(
        axes,
        [
            ("reward_ratio_wmrl_vs_real", "final true reward: wmrl / real"),
            ("compute_ratio", "compute ratio, same steps: real / wmrl"),
            ("matched_compute_ratio", "compute ratio to reach wmrl's level: real / wmrl"),
        ],
        strict=True,
    ):
        im = ax.imshow(grids[key], origin="lower", cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(noise)), [str(n) for n in noise])
        ax.set_yticks(range(len(bias)), [str(b) for b in bias])
        ax.set_xlabel("world-model per-call noise (sd)")
        ax.set_ylabel("persistent bias strength")
        ax.set_title(title)
        for i in range(len(bias)):
            for j in range(len(noise)):
                ax.text(j, i, f"{grids[key][i, j]:.2f}", ha="center", va="center", color="w")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_from_cli(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            "wmrl bench synthetic writes plots and needs matplotlib: pip install 'wmrl[viz]'", file=sys.stderr
        )
        return 2
    if args.exec_cost <= 0:
        print("--exec-cost must be > 0", file=sys.stderr)
        return 2
    seeds_n = args.seeds if args.seeds is not None else (3 if args.quick else 5)
    if seeds_n < 1:
        print("--seeds must be >= 1", file=sys.stderr)
        return 2
    arms = list(ARMS) if not args.arms else [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        print(f"unknown arms {unknown}; known: {sorted(ARMS)}", file=sys.stderr)
        return 2
    if "real" not in arms:
        arms.insert(0, "real")  # every ratio is against it
    try:
        corrector = from_dict(CorrectorConfig, apply_overrides(to_dict(CorrectorConfig()), args.set or []))
    except ConfigError as err:
        print(f"--set: {err}", file=sys.stderr)
        return 2
    if args.variants < 0:
        print("--variants must be >= 0 (0: nothing recurs)", file=sys.stderr)
        return 2
    if args.exec_latency < 0:
        print("--exec-latency must be >= 0 (step-times)", file=sys.stderr)
        return 2
    cfg = SimConfig(
        exec_cost=args.exec_cost,
        exec_noise=args.exec_noise,
        corrector=corrector,
        variants=args.variants,
        exec_latency=args.exec_latency,
    )
    if args.quick:
        cfg = replace(cfg, steps=150, n_tasks=16, groups_per_step=12)
    seeds = list(range(args.seed0, args.seed0 + seeds_n))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = RunStore(out)
    print(
        f"wmrl bench synthetic: {len(arms)} arms x {len(seeds)} seeds, {cfg.steps} steps each"
        f" (finished runs kept in {store.dir}; the same command continues an interrupted bench)",
        file=sys.stderr,
    )
    try:
        code = _bench(args, cfg, arms, seeds, out, stored_runner(store))
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: {store.computed + store.reused} finished runs kept in {store.dir}"
            " (rerun the same command to continue)",
            file=sys.stderr,
        )
        return 130
    if store.reused:
        print(f"({store.reused} of the runs were read back from {store.dir})", file=sys.stderr)
    return code


def _mean_curves(cfg: SimConfig, rs: list[ArmResult]) -> dict[str, list[float]]:
    """The seed-mean reward and cost curves over the steps every seed ran (runs continued to a cost
    end at different steps on different seeds)."""
    n = min(len(r.true_reward) for r in rs)
    return {
        "true_reward_mean": np.mean([r.true_reward[:n] for r in rs], axis=0).tolist(),
        "cost_mean": np.mean([r.cost(cfg)[:n] for r in rs], axis=0).tolist(),
    }


def _bench(
    args: argparse.Namespace, cfg: SimConfig, arms: list[str], seeds: list[int], out: Path, run: Runner
) -> int:
    started = time.perf_counter()
    runs = run_arms(cfg, arms, seeds, run=run, equal_cost=not args.equal_steps)
    summary = summarise(cfg, runs, cfg.exec_cost)
    equal = None
    if not args.equal_steps:
        curves = {
            arm: {s: (r.true_reward, r.cost(cfg)) for s, r in zip(seeds, rs, strict=True)}
            for arm, rs in runs.items()
        }
        equal = equal_cost_summary(curves, seeds, cfg.steps, references=("real_cache", "paper"))
        print(format_equal_cost(equal))
        print()
    sensitivity = {
        f"{c:g}": {
            arm: {k: s[k] for k in ("cost", "cost_to_target", "compute_ratio_vs_real")}
            for arm, s in summarise(cfg, runs, c).items()
        }
        for c in SENSITIVITY_EXEC_COSTS
    }
    print(format_table(summary, cfg.exec_cost))
    print("\nSensitivity of the compute ratio (real cost / arm cost) to the cost of one real execution:")
    print(f"{'arm':<20} " + " ".join(f"{'exec=' + k:>10}" for k in sensitivity))
    for arm in arms:
        cells = [sensitivity[k][arm]["compute_ratio_vs_real"] for k in sensitivity]
        print(f"{arm:<20} " + " ".join(f"{c:>9.2f}x" if c else f"{'-':>10}" for c in cells))
    result: dict[str, Any] = {
        "config": to_dict(cfg),
        "seeds": seeds,
        "definitions": __doc__,
        "equal_cost": equal,
        "arms": summary,
        "sensitivity": sensitivity,
        "curves": {arm: _mean_curves(cfg, rs) for arm, rs in runs.items()},
    }
    plot_curves(cfg, runs, out / "reward_vs_cost.png")
    if args.sweep:
        sweep_seeds = seeds[: max(2, min(3, len(seeds)))]
        result["sweep"] = sweep(cfg, sweep_seeds, run=run)
        print("\nWorld-model quality sweep (wmrl/real final reward | compute ratio):")
        print(f"{'bias / noise':<14}" + "".join(f"{n:>18}" for n in SWEEP_NOISE))
        for b in SWEEP_BIAS:
            row = [c for c in result["sweep"]["cells"] if c["bias_strength"] == b]
            print(
                f"{b:<14}"
                + "".join(f"{c['reward_ratio_wmrl_vs_real']:>10.3f} | {c['compute_ratio']:.2f}x" for c in row)
            )
        print(
            "\nCompute ratio to reach 98% of wmrl's final reward (real cost / wmrl cost; None = real never did):"
        )
        print(f"{'bias / noise':<14}" + "".join(f"{n:>18}" for n in SWEEP_NOISE))
        for b in SWEEP_BIAS:
            ratios = [c["matched_compute_ratio"] for c in result["sweep"]["cells"] if c["bias_strength"] == b]
            print(f"{b:<14}" + "".join(f"{'None' if v is None else f'{v:.2f}x':>18}" for v in ratios))
        plot_sweep(result["sweep"], out / "sweep.png")
        result["fraction_sweep"] = fraction_sweep(cfg, seeds, run=run)
        print("\nAnchor fraction (default wmrl arm): final true reward and compute ratio against real:")
        print(f"{'fraction':>9} {'final reward':>16} {'vs real':>8} {'compute ratio':>14}")
        for row in result["fraction_sweep"]:
            print(
                f"{row['anchor_fraction']:>9.2f} {row['final_true_reward']:>8.3f} ± {row['final_true_reward_ci95']:<5.3f} "
                f"{row['reward_ratio_vs_real']:>8.3f} {row['compute_ratio_vs_real']:>13.2f}x"
            )
    if args.noise_sweep:
        sweep_arms = NOISE_SWEEP_ARMS if not args.arms else tuple(arms)
        result["noise_sweep"] = noise_sweep(cfg, seeds, arms=sweep_arms, run=run)
        print("\nExecution noise (final true reward ± 95% CI, (ratio to real)), same seeds:")
        print(format_noise_sweep(result["noise_sweep"]))
    if args.lag_sweep:
        result["lag_sweep"] = lag_sweep(cfg, seeds, run=run)
        print("\nAsynchronous anchors (the wmrl arm; rewards at equal steps, same seeds):")
        print(format_lag_sweep(result["lag_sweep"]))
    result["wall_s"] = time.perf_counter() - started
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out / 'results.json'} and plots in {out} ({result['wall_s']:.0f} s)")
    return 0
