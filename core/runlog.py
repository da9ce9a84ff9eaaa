"""What every run writes: the resolved config, metrics (JSONL, optionally TensorBoard / W&B) and plots.

A run directory looks like::

    RUN/config.json        the resolved, validated config (reload it to reproduce the run)
    RUN/metrics.jsonl      one JSON object per logged step: {"step": s, "time": t, metric: value...}
    RUN/tensorboard/       event files, when ``report_to`` has tensorboard (wandb, mlflow, trackio: their own stores)
    RUN/plots/*.png        calibration curve, anchor/world-model weights, reward over steps

``None`` values (unknown) are written to JSONL as ``null`` and skipped by TensorBoard: unknown is
not zero.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from wmrl.core.config import to_dict

__all__ = ["RunWriter", "plot_run", "read_metrics", "write_json_atomic"]


def _clean(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunWriter:
    """Writes a run directory: ``config.json``, ``metrics.jsonl`` and the experiment trackers asked for.

    Args:
        out_dir: the run directory (created).
        config: the resolved config (a dataclass or a dict) written to ``config.json``; ``None`` leaves it.
        report_to: trackers, any of ``tensorboard`` (``RUN/tensorboard``), ``wandb``, ``mlflow``,
            ``trackio``; each imports its package here and fails with the install hint if it is absent.
            W&B / MLflow / Trackio take their project from their own environment variables
            (``WANDB_PROJECT``, ``MLFLOW_EXPERIMENT_NAME``, ...) and default to ``wmrl``.
        name: the run's name in those trackers (default: the run directory's name).

    Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        out_dir: str | Path,
        config: Any = None,
        report_to: Sequence[str] = (),
        name: str | None = None,
    ) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        data = None
        if config is not None:
            data = to_dict(config) if not isinstance(config, Mapping) else dict(config)
            write_json_atomic(self.dir / "config.json", data)
        # Append: a resumed run continues its log. Closed in close().
        self._metrics = open(self.dir / "metrics.jsonl", "a")  # noqa: SIM115
        self._trackers = [_open_tracker(kind, self.dir, name or self.dir.name, data) for kind in report_to]

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": int(step), "time": time.time()}
        record.update({k: _clean(v) for k, v in metrics.items()})
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        numeric = {
            k: v
            for k, v in record.items()
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for tracker in self._trackers:
            tracker.log(numeric, step)

    def write_json(self, name: str, data: Any) -> Path:
        return write_json_atomic(self.dir / name, data)

    def close(self) -> None:
        self._metrics.close()
        for tracker in self._trackers:
            tracker.close()
        self._trackers = []

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_json_atomic(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON through a temporary file, so a crash never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
    return path


class _Tracker:
    """One experiment tracker: ``log(numeric metrics, step)`` and ``close()``."""

    def __init__(self, log: Callable[[Mapping[str, Any], int], object], close: Callable[[], object]) -> None:
        self.log, self.close = log, close


def _require(module: str, kind: str) -> ModuleType:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"logging.report_to includes {kind!r}, which needs its package: pip install {kind}"
        ) from err


def _open_tracker(kind: str, run_dir: Path, name: str, config: Mapping[str, Any] | None) -> _Tracker:
    import os

    project = os.environ.get("WMRL_PROJECT", "wmrl")
    if kind == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError(
                "logging.report_to includes 'tensorboard', which needs its package: pip install tensorboard"
            ) from err
        writer = SummaryWriter(str(run_dir / "tensorboard"))

        def log(metrics: Mapping[str, Any], step: int) -> None:
            for key, value in metrics.items():
                writer.add_scalar(key, value, step)

        return _Tracker(log, writer.close)
    if kind == "wandb":
        wandb = _require("wandb", kind)
        run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", project), name=name, dir=str(run_dir), config=config
        )
        return _Tracker(lambda m, s: run.log(m, step=s), run.finish)
    if kind == "mlflow":
        mlflow = _require("mlflow", kind)
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", project))
        mlflow.start_run(run_name=name)
        if config:
            from wmrl.core.train_config import flatten

            mlflow.log_params({k: str(v)[:250] for k, v in flatten(config).items()})
        return _Tracker(
            lambda m, s: mlflow.log_metrics({k.replace("/", "_"): v for k, v in m.items()}, step=s),
            mlflow.end_run,
        )
    if kind == "trackio":
        trackio = _require("trackio", kind)
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", project), name=name, config=config)
        return _Tracker(lambda m, s: trackio.log(m, step=s), trackio.finish)
    raise ValueError(f"unknown tracker {kind!r}")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


#: Metric namespaces of the library itself; every other ``name/...`` key is a domain's own measure.
_CORE_NAMESPACES = frozenset(
    {"wmrl", "memory", "cost", "time", "pool", "anchor_status", "reward", "train", "profiling", "completions"}
)


def plot_run(run_dir: str | Path, debiaser: Any = None, reward_key: str | None = None) -> list[Path]:
    """Write the plots a person wants to look at; returns their paths.

    * ``calibration.png``: the anchor pairs (world model vs real) and the fitted isotonic map;
    * ``weights.png``: group weights, the world model's measured gain, the realised execution and
      memory shares over steps; steps where a bound decided the weights are shaded;
    * ``reward.png``: ``reward_key`` (or every ``reward/*`` key and every key ending in
      ``reward``/``reward_mean``) over steps;
    * ``domain.png``: the domain's own measures (every ``name/...`` key outside the library's
      namespaces: ``executed/position``, ``rollout/success_rate``...), up to 12.

    Steps are 1-based, as the run prints them.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    plots = run_dir / "plots"
    plots.mkdir(exist_ok=True)
    written = []
    rows = read_metrics(run_dir)

    if debiaser is not None and debiaser.n_pairs:
        state = debiaser.state_dict()
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.scatter(state["x"], state["y"], s=8, alpha=0.35, label=f"anchor pairs ({debiaser.n_pairs})")
        grid = np.linspace(float(np.min(state["x"])), float(np.max(state["x"])), 200)
        ax.plot(
            grid,
            debiaser.calibrate(grid),
            color="C3",
            label="isotonic map" if debiaser.calibrated else "identity (not fitted yet)",
        )
        ax.plot(grid, grid, ls=":", color="grey", label="y = x")
        ax.set_xlabel("world-model score")
        ax.set_ylabel("real score")
        ax.set_title("Calibration of the world model")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plots / "calibration.png", dpi=110)
        plt.close(fig)
        written.append(plots / "calibration.png")

    from matplotlib.ticker import MaxNLocator

    def line_plot(name: str, title: str, curves: list[tuple[str, str]], bound_key: str | None = None) -> None:
        """One PNG of metric curves over steps; ``curves`` = (metric key, legend label).

        Steps are drawn 1-based, as the run prints them (``metrics.jsonl`` counts from 0), on integer
        ticks. ``bound_key``: steps where that metric is 1 are shaded (a bound, not a measurement,
        decided them).
        """
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, (key, label) in enumerate(curves):
            points = [(r["step"] + 1, r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    label=label,
                    color=(plt.cm.tab10(i % 10) if len(curves) <= 10 else plt.cm.tab20(i % 20)),
                    marker="." if len(points) < 30 else None,
                )
        if bound_key is not None:
            bound = [r["step"] + 1 for r in rows if r.get(bound_key) == 1]
            for j, step in enumerate(bound):
                ax.axvspan(
                    step - 0.5,
                    step + 0.5,
                    color="grey",
                    alpha=0.2,
                    label="a bound set the weights" if j == 0 else None,
                )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(plots / name, dpi=110)
        plt.close(fig)
        written.append(plots / name)

    fusion_curves = [
        ("wmrl/weight_anchor", "anchor group weight"),
        ("wmrl/weight_world_model", "world-model group weight"),
        ("wmrl/wm_gain", "world model's measured gain (rho)"),
        ("wmrl/anchor_fraction_realised", "anchor groups (realised share)"),
        ("wmrl/execution_share_realised", "executed rollouts (realised share)"),
        ("memory/known_share", "graded from the memory"),
    ]
    if any(key in r for r in rows for key, _ in fusion_curves):
        line_plot("weights.png", "Fusion, execution and memory", fusion_curves, bound_key="wmrl/fusion_bound")
    keys = (
        [reward_key]
        if reward_key
        else sorted(
            {k for r in rows for k in r if k.startswith("reward/") or k.endswith(("reward", "reward_mean"))}
        )
    )
    if keys:
        line_plot("reward.png", "Reward", [(k, k) for k in keys])
    # The domain's own measures (what really happened: executed positions, success rates...).
    own = sorted(
        {
            k
            for r in rows
            for k, v in r.items()
            if "/" in k
            and k.split("/")[0] not in _CORE_NAMESPACES
            and k not in keys
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
        }
    )
    if own:
        line_plot("domain.png", "The domain's own measures", [(k, k) for k in own[:12]])
    return written
