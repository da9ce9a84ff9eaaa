"""The AutoResearch run's own learning curve (``plots/learning.png``): what real execution measured."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_learning"]


def plot_learning(run_dir: Path) -> Path | None:
    """``plots/learning.png``: the training reward and what real execution measured each step (valid
    rate and mean position of the executed rollouts), the run's learning curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wmrl.core.runlog import read_metrics

    rows = read_metrics(run_dir)
    curves = [
        ("reward", "reward (corrected, all rollouts)"),
        ("executed/valid_rate", "valid rate (executed rollouts)"),
        ("executed/position", "leaderboard position (executed rollouts, 0 if invalid)"),
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for key, label in curves:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Learning on the training tasks")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(run_dir) / "plots" / "learning.png"
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
