"""Subcommands of the ``wmrl`` command contributed by ``wmrl.embodied``.

* ``wmrl train embodied [--smoke]``: GRPO/PPO for a VLA on LIBERO (the flags every domain shares).
* ``wmrl train embodied-sft``: behaviour cloning on demonstrations, the stage RL starts from.
* ``wmrl train embodied-wm``: a Robometer trained on recorded successes and failures, with its fidelity.
* ``wmrl eval embodied`` (also ``wmrl eval libero``): LIBERO success, Best@k / All@k, videos.
* ``wmrl serve robometer``: Robometer's HTTP server on a local checkpoint (health endpoint, batching).
* ``wmrl embodied record-demos``: a policy's episodes as demonstrations (the scripted expert's by default).
* ``wmrl embodied wm-fidelity``: how well a Robometer checkpoint's scores separate recorded successes
  from failures.

``register`` must import only the standard library and ``wmrl.core``; heavy imports go inside handlers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_EVAL_SHORTHANDS = {
    "--policy": (
        "policy",
        "'random', 'scripted' (the privileged expert) or a saved-policy folder with policy.json",
    ),
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
        stage=True,  # supervised: checkpoints complete with wmrl_stage.json, not a correction's state
    )
    root.train(
        "embodied-wm",
        "train a Robometer (progress and success heads) on recorded LIBERO episodes, successes and "
        "failures, and measure how well its scores separate them on held-out episodes",
        config="wmrl.embodied.worldmodel.train_config:WorldModelTrainConfig",
        run="wmrl.embodied.worldmodel.training:run_wm_from_cli",
        presets="wmrl.embodied.worldmodel.train_config:PRESETS",
        default_out="runs/train_embodied_wm/{time}",
        preset_flags={"--smoke": ("smoke", "a minute-long CPU run (same as --config smoke)")},
        stage=True,
    )
    _add_record_command(root)
    _add_fidelity_command(root)
    root.group("serve", "serve a model over HTTP (a world model that trainers on other machines call)")
    serve = root.subcommand(
        "serve",
        "robometer",
        "serve a local Robometer checkpoint over Robometer's HTTP contract (POST /evaluate_batch_npy, "
        "GET /health), batching the trajectories of each request",
        _serve_robometer,
    )
    add_server_arguments(serve)
    root.evaluate(
        "embodied",
        "evaluate a VLA policy on LIBERO: success per task over initial states, Best@k/All@k, in-domain vs held-out",
        config="wmrl.embodied.eval.libero_eval:LiberoEvalConfig",
        run="wmrl.embodied.cli:run_eval",
        default_out="runs/eval_libero/{time}",
        shorthands=_EVAL_SHORTHANDS,
        aliases=("libero",),
    )


def _add_record_command(root) -> None:
    domain = root.domain("embodied", "the embodied domain's own commands (demonstrations)")
    cmd = domain.command(
        "record-demos",
        "record a policy's LIBERO episodes (the scripted expert's by default) as demonstrations in "
        "LIBERO's HDF5 layout and/or LeRobot format, for wmrl train embodied-sft",
        _record_demos,
    )
    cmd.add_argument(
        "--policy", default="scripted", help="scripted (default), random, or a saved-policy folder"
    )
    cmd.add_argument("--suite", default="libero_10")
    cmd.add_argument("--tasks", default="0", help="task ids, e.g. 0,7 or 0-2 (default 0)")
    cmd.add_argument(
        "--states", default="0-15", help="initial states, one episode each (default 0-15: in-domain)"
    )
    cmd.add_argument("--camera", default="agentview", help="the camera recorded (the one the VLA sees)")
    cmd.add_argument(
        "--wrist-camera",
        default=None,
        help="also record this camera (robot0_eye_in_hand) for a wrist-camera VLA; a policy that reads one gets it",
    )
    cmd.add_argument("--image-size", type=int, default=128, help="square render side in pixels (default 128)")
    cmd.add_argument("--orientation", default="upright", help="upright | rotate180 | raw")
    cmd.add_argument("--formats", default="libero_hdf5,lerobot", help="libero_hdf5 and/or lerobot")
    cmd.add_argument("--keep-failures", action="store_true", help="also keep episodes that failed")
    cmd.add_argument(
        "--max-steps", type=int, default=None, help="policy steps per episode (default: the suite's)"
    )
    cmd.add_argument(
        "--action-noise", type=float, default=0.0,
        help="std of Gaussian noise on the 6 arm dimensions of every action (perturbed runs; default 0)",
    )  # fmt: skip
    cmd.add_argument("--noise-seed", type=int, default=0, help="seed of the action noise and the label mix")
    cmd.add_argument(
        "--label-with", default=None,
        help="DAgger: record this policy's action (scripted, or a folder) at every state --policy visits",
    )  # fmt: skip
    cmd.add_argument(
        "--label-mix", type=float, default=0.0,
        help="probability that a step executes the --label-with policy's action instead (DAgger's beta; default 0)",
    )  # fmt: skip
    cmd.add_argument(
        "--out", default="runs/demos", help="the folder written (refused if it holds a recording)"
    )


def _record_demos(args) -> int:
    import sys

    from wmrl.embodied.demos.record import RecordConfig, record_demonstrations
    from wmrl.embodied.eval.libero_eval import parse_indices

    try:
        config = RecordConfig(
            policy=args.policy, suite=args.suite, tasks=parse_indices(args.tasks), states=parse_indices(args.states),
            camera=args.camera, wrist_camera=args.wrist_camera, image_size=args.image_size, orientation=args.orientation,
            formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
            keep_failures=args.keep_failures, max_steps=args.max_steps, action_noise=args.action_noise,
            noise_seed=args.noise_seed, label_policy=args.label_with, label_mix=args.label_mix, out_dir=args.out,
        )  # fmt: skip
        summary = record_demonstrations(
            config,
            progress=lambda row: print(
                f"task {row['task']} state {row['state']}: {'success' if row['success'] else 'failure'} "
                f"in {row['steps']} steps ({row['wall_s']:.1f} s)",
                file=sys.stderr,
            ),
        )
    except (ValueError, FileExistsError, FileNotFoundError, RuntimeError) as err:
        print(f"wmrl embodied record-demos: error: {err}", file=sys.stderr)
        return 2
    print(
        f"kept {summary['kept']} of {len(summary['episodes'])} episodes; wrote {', '.join(summary['files'])}"
    )
    return 0


def _add_fidelity_command(root) -> None:
    cmd = root.domain("embodied", "the embodied domain's own commands (demonstrations)").command(
        "wm-fidelity",
        "score recorded LIBERO episodes with a Robometer checkpoint and report, per score mode, how well "
        "the scores separate the simulator's successes from its failures (AUROC with interval, Spearman)",
        _wm_fidelity,
    )
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model", help="a Robometer checkpoint folder (e.g. RUN/model of wmrl train embodied-wm)"
    )
    source.add_argument(
        "--tiny", action="store_true", help="the random tiny Robometer (a chance-level baseline)"
    )
    cmd.add_argument("--episodes", required=True, help="comma-separated LIBERO HDF5 files or folders of them")
    cmd.add_argument("--camera", default="agentview", help="the camera the world model watches")
    cmd.add_argument(
        "--num-frames", type=int, default=8, help="frames per episode window (the reward source's)"
    )
    cmd.add_argument("--bootstrap", type=int, default=1000, help="resamples of the AUROC intervals")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (and of --tiny's weights)")
    cmd.add_argument("--out", default=None, help="write the report here as JSON (default: print only)")


def _wm_fidelity(args) -> int:
    import json
    import sys

    from wmrl.core.runlog import write_json_atomic
    from wmrl.embodied.worldmodel.fidelity import measure_fidelity
    from wmrl.embodied.worldmodel.robometer import Robometer
    from wmrl.embodied.worldmodel.training import load_episodes, summary_line

    try:
        if args.num_frames < 2 or args.bootstrap < 0:
            raise ValueError("--num-frames must be >= 2 and --bootstrap >= 0")
        paths = [p.strip() for p in args.episodes.split(",") if p.strip()]
        episodes = load_episodes(paths, args.camera)
        if not episodes:
            raise ValueError(f"no episode of two frames or more in {paths}")
        model = Robometer.tiny(seed=args.seed) if args.tiny else Robometer.from_pretrained(args.model)
        report = measure_fidelity(model, episodes, args.num_frames, args.bootstrap, args.seed)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"wmrl embodied wm-fidelity: error: {err}", file=sys.stderr)
        return 2
    report = {"model": "tiny" if args.tiny else args.model, "episodes": paths, **(report or {})}
    print(summary_line("episodes", report))
    for mode, m in report["modes"].items():
        means = [("-" if v is None else f"{v:.3f}") for v in (m["mean_success"], m["mean_failure"])]
        print(f"  {mode}: mean score of successes {means[0]}, of failures {means[1]}")
    if args.out:
        write_json_atomic(Path(args.out), json.loads(json.dumps(report)))
        print(f"report: {args.out}")
    return 0


def add_server_arguments(parser: Any) -> None:
    """The options of ``wmrl serve robometer`` (and ``python -m wmrl.embodied.worldmodel.http_server``)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="local Robometer checkpoint folder")
    source.add_argument("--tiny", action="store_true", help="serve the random tiny model (smoke tests)")
    parser.add_argument(
        "--tokenizer", help="local Qwen3-VL tokenizer folder (default: the checkpoint folder)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on CUDA, float32 on a CPU",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=4, help="trajectories per forward pass")


def _serve_robometer(args) -> int:
    from wmrl.embodied.worldmodel.http_server import serve

    try:
        return serve(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"wmrl serve robometer: error: {err}", file=__import__("sys").stderr)
        return 2


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
