"""Does our LIBERO port score a closed-loop policy as upstream LIBERO does? The scripted expert on both.

The scripted expert (``wmrl.embodied.policy.scripted_control``) runs closed loop from the same
fixed initial states on our stack (rpent-libero on robosuite 1.5.2, MuJoCo 3.3.7) and on upstream
LIBERO (rlinf-libero 0.1.3 on robosuite 1.4.1, MuJoCo 3.3.7, numpy 1.26), through LIBERO's own
``ControlEnv`` on both (10 no-op settle steps, 520 policy steps at most, no camera), and records
each episode's success and length; ``compare`` puts the per-task success rates (Wilson 95%
intervals), the episodes whose outcome differs, and the lengths side by side.

The expert needs only numpy and scipy; in the upstream environment WMRL is installed without its
dependencies (``pip install --no-deps -e .``) and the scene reader is loaded from its file (its
package imports our simulator wrapper). Three steps:

    python benchmarks/embodied_expert_parity.py export --out expert_in.npz
    python benchmarks/embodied_expert_parity.py run --inputs expert_in.npz --out ours.json
    .venv-libero14/bin/python benchmarks/embodied_expert_parity.py run --inputs expert_in.npz --out upstream.json
    python benchmarks/embodied_expert_parity.py compare ours.json upstream.json --out parity.json
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from embodied_port_parity import NOOP, _setup, parity_cli, stack_versions  # shared by both parity benchmarks

REPO = Path(__file__).resolve().parent.parent
MAX_STEPS = 520  # LIBERO-Long's policy-step limit
SETTLE_STEPS = 10


def export(args) -> None:
    from wmrl.embodied.env.splits import parse_indices
    from wmrl.embodied.env.suites import get_task, load_init_states

    tasks, states = parse_indices(args.tasks), parse_indices(args.states)
    arrays, names = {}, []
    for t in tasks:
        task = get_task("libero_10", t)
        arrays[f"states_{t}"] = load_init_states(task)[
            list(states)
        ]  # a list picks rows; a tuple would index dimensions
        names.append(Path(task.bddl_file).name)
    np.savez(args.out, tasks=np.array(tasks), states=np.array(states), bddl=np.array(names), **arrays)
    print(f"wrote {args.out}: tasks {tasks}, {len(states)} initial states each")


def _load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args) -> None:
    stack = _setup()
    from libero.libero import get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv

    from wmrl.embodied.policy.scripted_control import ScriptedController

    read_scene = _load_file("scene_state", REPO / "embodied" / "env" / "scene_state.py").read_scene
    data = np.load(args.inputs)
    out = {"stack": stack, "versions": stack_versions(), "episodes": []}
    start = time.perf_counter()
    for t, bddl in zip(data["tasks"], data["bddl"], strict=True):
        path = os.path.join(get_libero_path("bddl_files"), "libero_10", str(bddl))
        env = ControlEnv(
            bddl_file_name=path, has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False,
            control_freq=20, hard_reset=False, ignore_done=True, horizon=100_000,
        )  # fmt: skip
        goal = env.env.parsed_problem["goal_state"]
        wins = 0
        for k, state in zip(data["states"], data[f"states_{t}"], strict=True):
            env.seed(0)
            env.reset()
            obs = env.set_init_state(state)
            for _ in range(SETTLE_STEPS):
                obs, *_ = env.step(NOOP)
            controller = ScriptedController(goal)
            success, steps = False, 0
            while steps < MAX_STEPS and not success:
                action = controller.act(obs, read_scene(env.env))
                obs, *_ = env.step(np.asarray(action, dtype=np.float64))
                steps += 1
                success = bool(env.check_success())
            wins += success
            out["episodes"].append({"task": int(t), "state": int(k), "success": success, "steps": steps})
        env.close()
        print(
            f"task {t}: {wins}/{len(data['states'])} ({time.perf_counter() - start:.0f} s)", file=sys.stderr
        )
    out["wall_s"] = time.perf_counter() - start
    Path(args.out).write_text(json.dumps(out))
    print(f"wrote {args.out} ({stack}, {out['versions']})")


def _rate(k: int, n: int, interval: tuple[float, float]) -> str:
    return f"{k}/{n} = {100 * k / n:.0f}% [{100 * interval[0]:.0f}, {100 * interval[1]:.0f}]"


def _steps(mean_ci: tuple[float | None, float | None]) -> str:
    mean, half = mean_ci
    if mean is None:
        return "-"
    return f"{mean:.0f} ± {half:.0f}" if half is not None else f"{mean:.0f}"


def compare(args) -> None:
    from wmrl.core.bench.intervals import mean_and_ci95
    from wmrl.embodied.eval.metrics import wilson_interval

    a, b = (json.loads(Path(p).read_text()) for p in (args.a, args.b))
    print(f"A = {a['stack']} {a['versions']}\nB = {b['stack']} {b['versions']}")
    key = lambda e: (e["task"], e["state"])  # noqa: E731
    eb = {key(e): e for e in b["episodes"]}
    rows = []
    print("| task | success A | success B | outcome differs | steps A (successes) | steps B (successes) |")
    print("|---|---|---|---|---|---|")
    for task in sorted({e["task"] for e in a["episodes"]}):
        pairs = [(e, eb[key(e)]) for e in a["episodes"] if e["task"] == task and key(e) in eb]
        n = len(pairs)
        ka, kb = sum(x["success"] for x, _ in pairs), sum(y["success"] for _, y in pairs)
        differ = [x["state"] for x, y in pairs if x["success"] != y["success"]]
        sa = mean_and_ci95([float(x["steps"]) for x, _ in pairs if x["success"]])
        sb = mean_and_ci95([float(y["steps"]) for _, y in pairs if y["success"]])
        row = {
            "task": task, "n": n, "success_a": ka, "success_b": kb, "wilson_a": wilson_interval(ka, n),
            "wilson_b": wilson_interval(kb, n), "outcome_differs": differ, "steps_a": sa, "steps_b": sb,
        }  # fmt: skip
        rows.append(row)
        print(
            f"| {task} | {_rate(ka, n, row['wilson_a'])} | {_rate(kb, n, row['wilson_b'])} | {len(differ)} "
            f"{differ if differ else ''} | {_steps(sa)} | {_steps(sb)} |"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"a": a["stack"], "b": b["stack"], "rows": rows}, indent=2) + "\n"
        )


def main() -> None:
    def export_arguments(parser) -> None:
        parser.add_argument("--tasks", default="0-9")
        parser.add_argument("--states", default="0-49")

    parity_cli(__doc__, {"export": export, "run": run, "compare": compare}, export_arguments)


if __name__ == "__main__":
    main()
