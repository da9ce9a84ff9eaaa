"""``plots/training.png``: what an embodied training run looks like over its steps."""

from __future__ import annotations

from pathlib import Path

from wmrl.core.runlog import read_metrics

__all__ = ["plot_training"]

_TIME_KEYS = ("time/step_s", "time/rollout_s", "time/scoring_s", "time/update_s", "time/checkpoint_s")


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
            ("rollout/success_rate", "reward/world_model_mean", "reward/corrected_mean"),
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
