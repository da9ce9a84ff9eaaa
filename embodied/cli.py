"""Subcommands of the ``wmrl`` command contributed by ``wmrl.embodied``.

* ``wmrl train embodied [--smoke]``: GRPO/PPO for a VLA on LIBERO (the flags every domain shares).
* ``wmrl train embodied-sft``: behaviour cloning on demonstrations, the stage RL starts from.
* ``wmrl eval embodied`` (also ``wmrl eval libero``): LIBERO success, Best@k / All@k, videos.

``register`` must import only the standard library and ``wmrl.core``; heavy imports go inside handlers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_EVAL_SHORTHANDS = {
    "--policy": ("policy", "'random' or a saved-policy folder with policy.json"),
    "--suite": (
        "suite",
        "libero_10 (LIBERO-Long, default), libero_spatial, libero_object, libero_goal, libero_90",
    ),
    "--tasks": ("tasks", "task indices, e.g. 0,1 or 0-4 (default: all)"),
    "--states": ("states", "initial-state indices, e.g. 0-15 (default: those of --split)"),
    "--split": ("split", "all | in_domain (states 0-15) | held_out (16-49)"),
    "--rollouts-per-state|-k": ("rollouts_per_state", "k rollouts per (task, state), for Best@k and All@k"),
    "--videos": ("videos", "number of episodes to save as mp4"),
    "--workers": ("workers", "simulator processes; 0 = in this process"),
    "--max-steps": ("max_steps", "policy steps per episode (default: the suite's, 520 for libero_10)"),
    "--settle-steps": ("settle_steps", "no-op steps after placing the initial state"),
    "--seed": ("seed", "base seed of every episode seed"),
    "--seeds": ("seeds", "several base seeds, e.g. 0,1,2: mean and 95%% interval across seeds"),
    "--temperature": ("temperature", "policy sampling temperature (default 0 = greedy, as upstream)"),
    "--cameras": ("cameras", "comma-separated cameras, or 'none'"),
    "--image-size": (
        "image_size",
        "square render side in pixels (default: the policy's checkpoint, else 256)",
    ),
    "--orientation": ("orientation", "upright | rotate180 | raw (default: the policy's checkpoint)"),
    "--soft-reset": ("hard_reset", "reuse the MuJoCo model between episodes (faster)", False),
}


def register(root) -> None:
    """Add this package's commands to the ``wmrl`` command tree (see ``wmrl.core.cli.CommandRoot``)."""
    root.train(
        "embodied",
        "GRPO for a VLA policy on LIBERO with rewards corrected by WMRL (modes: real, world_model, wmrl)",
        config="wmrl.embodied.training.config:EmbodiedTrainConfig",
        run="wmrl.embodied.training.trainer:run_from_cli",
        presets="wmrl.embodied.training.config:PRESETS",
        default_out="runs/train_embodied/{mode}-{time}",
        preset_flags={"--smoke": ("smoke", "the CPU smoke preset (same as --config smoke)")},
    )
    root.train(
        "embodied-sft",
        "behaviour cloning of a VLA on LIBERO demonstrations (HDF5 or LeRobot, replayed in the simulator): "
        "the checkpoint RL (policy.source) and wmrl eval embodied (--policy) start from",
        config="wmrl.embodied.training.sft_config:EmbodiedSFTConfig",
        run="wmrl.embodied.training.sft:run_sft_from_cli",
        presets="wmrl.embodied.training.sft_config:PRESETS",
        default_out="runs/train_embodied_sft/{time}",
        preset_flags={"--smoke": ("smoke", "the CPU smoke preset (same as --config smoke)")},
        checkpoint_marker="wmrl_sft.json",
    )
    root.evaluate(
        "embodied",
        "evaluate a VLA policy on LIBERO: success per task over initial states, Best@k/All@k, in-domain vs held-out",
        config="wmrl.embodied.eval.libero_eval:LiberoEvalConfig",
        run="wmrl.embodied.cli:run_eval",
        default_out="runs/eval_libero/{time}",
        shorthands=_EVAL_SHORTHANDS,
        aliases=("libero",),
    )


def run_eval(config, out: Path, *, resume: bool, progress: bool) -> tuple[dict[str, Any], list[str]]:
    """``wmrl eval embodied``: evaluate into ``out`` (``eval_info.json``, ``videos/``)."""
    import dataclasses

    from wmrl.core.errors import UserError
    from wmrl.embodied.env.libero_setup import LiberoUnavailableError
    from wmrl.embodied.eval.libero_eval import format_summary, run_libero_eval

    config = dataclasses.replace(config, out_dir=str(out))
    try:
        report = run_libero_eval(config, progress=progress, resume=resume)
    except (ValueError, LiberoUnavailableError) as err:
        raise UserError(str(err)) from None
    return report, [format_summary(report), f"report: {out}/eval_info.json"]
