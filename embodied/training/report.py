"""What a training run leaves behind besides metrics: ``cost_report.json`` and ``plots/training.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from wmrl.core.ledger import CostLedger
from wmrl.core.runlog import read_metrics
from wmrl.embodied.training.config import EmbodiedTrainConfig

__all__ = ["cost_report", "plot_training"]

_TIME_KEYS = ("time/step_s", "time/rollout_s", "time/scoring_s", "time/update_s", "time/checkpoint_s")


def cost_report(run_dir: str | Path, ledger: CostLedger, config: EmbodiedTrainConfig) -> dict[str, Any]:
    """The ledger's report plus what it means in this domain and the mean time of a step's phases."""
    from wmrl.embodied.training.trainer import ACCOUNTING_NOTE

    rows = read_metrics(run_dir)
    per_step = {}
    for key in _TIME_KEYS:
        values = [r[key] for r in rows if r.get(key) is not None]
        per_step[key.removeprefix("time/")] = float(np.mean(values)) if values else None
    episodes = int(sum(r.get("rollout/episodes") or 0 for r in rows))
    env_steps = float(
        sum((r.get("rollout/episodes") or 0) * (r.get("rollout/episode_steps_mean") or 0) for r in rows)
    )
    report = ledger.report()
    report.update(
        {
            "mode": config.mode,
            "corrector_preset": config.corrector_preset,
            "steps_logged": len(rows),
            "episodes": episodes,
            "policy_steps": round(env_steps),
            "mean_step_seconds": per_step,
            "accounting": ACCOUNTING_NOTE,
        }
    )
    return report


def plot_training(run_dir: str | Path) -> Path | None:
    """``plots/training.png``: batch success rate, Robometer score, PPO loss, clip fraction, KLs, step time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        return None
    panels = (
        (
            "success and reward",
            ("rollout/success_rate", "reward/robometer_reward_mean", "reward/corrected_reward_mean"),
        ),
        ("PPO loss", ("ppo/loss", "ppo/policy_loss")),
        ("clip fraction", ("ppo/clip_fraction", "ppo/clip_fraction_last_epoch")),
        ("KL", ("ppo/approx_kl", "ppo/kl_ref")),
        ("gradient norm (before clipping)", ("ppo/grad_norm", "ppo/grad_norm_max")),
        ("seconds per step", _TIME_KEYS[:4]),
    )
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (title, keys) in zip(axes.flat, panels, strict=True):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(pts) < 20 else None, ms=3, label=key)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out = run_dir / "plots" / "training.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
