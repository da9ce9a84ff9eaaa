"""``wmrl train embodied-wm``: train a Robometer (progress and success) on recorded LIBERO episodes.

What it learns from. Every episode of ``paths`` (LIBERO HDF5, as ``wmrl embodied record-demos``
writes them, successes and failures alike) yields, per epoch, ``windows_per_episode`` windows: the
whole episode and prefixes of it. A window of an episode of ``T`` frames that ends at frame ``e``
reads ``num_frames`` frames at :func:`~wmrl.embodied.worldmodel.frames.subsample_indices`\\ ``(e, K)``
(the reward source's own subsampling of a whole episode). Labels (:func:`window_labels`):

* progress, on successful episodes only: frame ``t`` of a successful episode is ``t / (T - 1)`` of
  the way to the goal (Robometer's progress of a successful trajectory: linear in time). A failed
  episode has no progress label: how far a failure got is not known from its outcome, and
  labelling it 0 would make progress a second success detector. Progress is learned as Robometer
  learns it, over its ``n_bins`` bins, here with a two-hot target whose expectation is the label
  (:func:`two_hot`), so the progress read back (the softmax expectation) can equal it exactly.
* success: 1 at the last frame of a whole successful episode (LIBERO ends an episode as soon as
  the goal holds), 0 at every other frame, of every episode. The success loss is weighted so that
  both classes weigh the same (``pos_weight`` = negatives / positives over an epoch's windows).

The loss is ``progress_weight · CE(progress) + success_weight · BCE(success)``, AdamW over every
parameter. The run writes ``config.json``, ``metrics.jsonl`` (per epoch), ``resolved.json``,
``model/`` (a Robometer checkpoint folder: ``world_model.backend=local
world_model.model_path=RUN/model`` in ``wmrl train embodied``), ``fidelity.json`` (the
:mod:`~wmrl.embodied.worldmodel.fidelity` report on the held-out episodes, on the training ones, and
on the held-out ones by the model before training)
and ``plots/``. It trains in minutes, so it keeps no mid-run checkpoint: ``--resume`` is refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.core.rundir import RunDirectory
from wmrl.core.runlog import RunWriter, write_json_atomic
from wmrl.embodied.worldmodel.frames import subsample_indices
from wmrl.embodied.worldmodel.train_config import WorldModelTrainConfig

__all__ = [
    "Episode",
    "load_episodes",
    "run_wm_from_cli",
    "summary_line",
    "train_world_model",
    "two_hot",
    "window_labels",
]


@dataclass
class Episode:
    """One recorded episode: frames ``uint8 (T, H, W, 3)``, its instruction and whether it succeeded."""

    frames: np.ndarray
    instruction: str
    success: bool
    name: str = ""


def load_episodes(paths: Sequence[str], camera: str) -> list[Episode]:
    """Every episode of the HDF5 files (or folders of them) in ``paths``, upright.

    Raises:
        FileNotFoundError: a path does not exist or a folder holds no HDF5 file.
        ValueError: an episode does not record whether it succeeded.
    """
    from wmrl.embodied.demos.libero_hdf5 import read_libero_hdf5
    from wmrl.embodied.training.sft_data import find_files

    files = find_files(paths, "*.hdf5", setting="paths", recursive=True)
    episodes = []
    for f in files:
        for demo in read_libero_hdf5(f, cameras=(camera,)):
            if demo.success is None:
                raise ValueError(f"{demo.name} does not record whether it succeeded; it cannot be labelled")
            if demo.length < 2:
                continue  # one frame shows no progress
            # named by the file's path: recordings in different folders share file names
            name = f"{f}:{demo.name.rsplit(':', 1)[-1]}"
            episodes.append(
                Episode(demo.oriented("upright").frames[camera], demo.instruction, bool(demo.success), name)
            )
    return episodes


def two_hot(progress: torch.Tensor, n_bins: int) -> torch.Tensor:
    """``(..., n_bins)`` targets on the bin centres ``linspace(0, 1, n_bins)`` whose mean is ``progress``.

    The mass goes to the two centres around ``progress``, split linearly; ``progress`` in ``[0, 1]``.
    """
    x = progress.clamp(0.0, 1.0) * (n_bins - 1)
    lo = x.floor().clamp(max=n_bins - 2).long()
    w = (x - lo).unsqueeze(-1)
    target = torch.zeros(*progress.shape, n_bins, dtype=torch.float32)
    target.scatter_(-1, lo.unsqueeze(-1), 1.0 - w)
    target.scatter_add_(-1, (lo + 1).unsqueeze(-1), w)
    return target


def window_labels(
    length: int, success: bool, end: int, k: int
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Frame indices and labels of the window of an episode of ``length`` frames ending at frame ``end``.

    Returns:
        ``(indices int64 (k,), progress float32 (k,) or None for a failure, success float32 (k,))``.
    """
    if not 2 <= end <= length:
        raise ValueError(f"a window must end in [2, {length}]; got {end}")
    idx = subsample_indices(end, k)
    success_label = np.zeros(k, dtype=np.float32)
    if success and end == length:
        success_label[idx == length - 1] = 1.0
    progress = (idx / (length - 1)).astype(np.float32) if success else None
    return idx, progress, success_label


def _windows(episodes: Sequence[Episode], config: WorldModelTrainConfig, rng: np.random.Generator) -> list:
    out: list[tuple[Any, ...]] = []
    for i, ep in enumerate(episodes):
        t = len(ep.frames)
        low = max(2, math.ceil(config.min_window * t))
        ends = [t] + [int(rng.integers(low, t + 1)) for _ in range(config.windows_per_episode - 1)]
        out.extend((i, *window_labels(t, ep.success, e, config.num_frames)) for e in ends)
    return out


def _build(config: WorldModelTrainConfig) -> Any:
    from wmrl.embodied.worldmodel.robometer import Robometer

    if config.init == "tiny":
        return Robometer.tiny(seed=config.seed, patch_size=config.patch_size)
    return Robometer.from_pretrained(config.init)


def _loss(
    model: Any, batch: list, episodes: Sequence[Episode], pos_weight: float, config: WorldModelTrainConfig
):
    import torch.nn.functional as F

    trajectories = [(episodes[i].frames[idx], episodes[i].instruction) for i, idx, _, _ in batch]
    inputs = model.processor.encode(trajectories)
    logits = model.model(**inputs)
    n_bins = model.config.n_bins
    prog_terms, succ_terms = [], []
    for (_, _, progress, success), prog_logits, succ_logits in zip(
        batch, logits.progress, logits.success, strict=True
    ):
        if progress is not None:
            target = two_hot(torch.from_numpy(progress), n_bins)
            prog_terms.append(-(target * torch.log_softmax(prog_logits.float(), dim=-1)).sum(-1))
        succ_terms.append(
            F.binary_cross_entropy_with_logits(
                succ_logits.float(),
                torch.from_numpy(success),
                pos_weight=torch.tensor(pos_weight),
                reduction="none",
            )
        )
    succ_loss = torch.cat(succ_terms).mean()
    prog_loss = torch.cat(prog_terms).mean() if prog_terms else torch.zeros(())
    total = config.progress_weight * prog_loss + config.success_weight * succ_loss
    return total, prog_loss.item(), succ_loss.item()


def _fidelity(
    model: Any, episodes: Sequence[Episode], config: WorldModelTrainConfig
) -> dict[str, Any] | None:
    from wmrl.embodied.worldmodel.fidelity import measure_fidelity

    return measure_fidelity(model, episodes, config.num_frames, config.bootstrap, config.seed)


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(report["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(3.2 * len(modes), 3.0))
    for ax, mode in zip(axes, modes, strict=True):
        for outcome, colour in ((True, "tab:green"), (False, "tab:red")):
            vals = [r["scores"][mode] for r in report["scores"] if r["scores"] and r["success"] is outcome]
            ax.scatter(
                np.full(len(vals), 1.0 if outcome else 0.0) + np.linspace(-0.1, 0.1, len(vals)),
                vals,
                s=10,
                color=colour,
            )
        auc = report["modes"][mode]["auroc"]
        ax.set_title(f"{mode} (AUROC {'-' if auc is None else f'{auc:.2f}'})", fontsize=9)
        ax.set_xticks([0, 1], ["failure", "success"])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train_world_model(
    config: WorldModelTrainConfig, run_dir: RunDirectory, *, progress: bool = True
) -> dict[str, Any]:
    """Train, save ``RUN/model``, measure fidelity; returns the summary (see the module docstring)."""
    from tqdm import tqdm

    if run_dir.checkpoint is not None or run_dir.resume:
        raise ValueError("wmrl train embodied-wm keeps no mid-run checkpoint: run it again with a new --out")
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    run_dir.open()
    train = load_episodes(config.paths, config.camera)
    held_out = load_episodes(config.held_out, config.camera) if config.held_out else []
    if not train:
        raise ValueError(f"no episode of two frames or more in {list(config.paths)}")
    if not any(e.success for e in train):
        raise ValueError(
            "no successful episode to learn progress from: record some with wmrl embodied record-demos"
        )
    torch.manual_seed(config.seed)
    model = _build(config)
    before = _fidelity(model, held_out, config)  # the starting model, for comparison
    params = [p for p in model.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    writer = RunWriter(run_dir.path, config, report_to=config.logging.report_to)
    resolved = {
        "episodes": len(train),
        "successes": sum(e.success for e in train),
        "held_out_episodes": len(held_out),
        "held_out_successes": sum(e.success for e in held_out),
        "image_size": list(train[0].frames.shape[1:3]),
        "parameters": int(sum(p.numel() for p in params)),
    }
    write_json_atomic(run_dir.path / "resolved.json", resolved)
    steps_per_epoch = math.ceil(len(train) * config.windows_per_episode / config.batch_size)
    bar = tqdm(total=steps_per_epoch * config.epochs, desc="world model", disable=not progress)
    start, step, last = time.perf_counter(), 0, {}
    try:
        for epoch in range(config.epochs):
            rng = np.random.default_rng([config.seed, epoch])
            windows = _windows(train, config, rng)
            positives = sum(float(w[3].sum()) for w in windows)
            pos_weight = (len(windows) * config.num_frames - positives) / max(positives, 1.0)
            order = rng.permutation(len(windows))
            model.model.train()
            sums = np.zeros(3)
            for b in range(0, len(order), config.batch_size):
                batch = [windows[j] for j in order[b : b + config.batch_size]]
                loss, prog, succ = _loss(model, batch, train, pos_weight, config)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                optimizer.step()
                sums += (loss.item(), prog, succ)
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            n = math.ceil(len(order) / config.batch_size)
            last = {
                "wm/loss": sums[0] / n,
                "wm/progress_loss": sums[1] / n,
                "wm/success_loss": sums[2] / n,
                "wm/epoch": epoch + 1,
                "wm/pos_weight": pos_weight,
                "time/elapsed_s": time.perf_counter() - start,
            }
            writer.log(step, last)
    finally:
        bar.close()
        writer.close()
    model.model.eval()
    model.save_pretrained(run_dir.path / "model")
    report = {
        "held_out": _fidelity(model, held_out, config),
        "train": _fidelity(model, train, config),
        "held_out_before_training": before,
    }
    write_json_atomic(run_dir.path / "fidelity.json", report)
    if config.logging.plots:
        for name, part in report.items():
            if part is not None:
                _plot(part, run_dir.path / "plots" / f"fidelity-{name}.png")
    return {
        "steps": step,
        "last": last,
        "model": str(run_dir.path / "model"),
        "fidelity": report,
        "train_s": round(time.perf_counter() - start, 1),
    }


def summary_line(name: str, part: dict[str, Any] | None) -> str:
    if part is None:
        return f"{name}: no episodes"
    cells = []
    for mode, m in part["modes"].items():
        auc, ci = m["auroc"], m["auroc_interval"]
        cells.append(
            f"{mode} {'-' if auc is None else f'{auc:.3f}'}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
        )
    return f"{name} ({part['successes']} successes, {part['failures']} failures) AUROC: " + "; ".join(cells)


def run_wm_from_cli(config: WorldModelTrainConfig, run_dir: RunDirectory, *, progress: bool) -> list[str]:
    """``wmrl train embodied-wm``: train, then the lines to print."""
    summary = train_world_model(config, run_dir, progress=progress)
    last = summary["last"]
    return [
        f"world model: {summary['steps']} optimiser steps in {summary['train_s']} s, last epoch loss "
        f"{last['wm/loss']:.4f} (progress {last['wm/progress_loss']:.4f}, success {last['wm/success_loss']:.4f})",
        summary_line("held-out", summary["fidelity"]["held_out"]),
        summary_line("training", summary["fidelity"]["train"]),
        summary_line("held-out, before training", summary["fidelity"]["held_out_before_training"]),
        f"model: {summary['model']}  (wmrl train embodied world_model.backend=local "
        f"world_model.model_path={summary['model']})",
    ]
