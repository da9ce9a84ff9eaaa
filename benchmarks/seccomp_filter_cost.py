"""What the seccomp filter costs a typical solution: bwrap with this filter, with an older one, and with none.

The older filter is ``autoresearch/sandbox/seccomp.py`` as of a git commit (default ``bc2f391``,
round two of the red team, before issue 35), loaded from ``git show``; the three arms run the
scikit-learn solution of ``sandbox_throughput.py`` on its data, interleaved round by round so
load drift hits all alike, ``threads=1``. Prints the mean wall time of each arm and the ratios.

Run: ``python benchmarks/seccomp_filter_cost.py [--rounds 8] [--baseline-commit bc2f391]``
(about 30 s a round on 2 cores).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from wmrl.autoresearch.sandbox import Limits, make_sandbox
from wmrl.autoresearch.sandbox.bwrap import BwrapSandbox

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sandbox_throughput as throughput

REPO = Path(__file__).resolve().parents[1]


def old_filter(commit: str):
    """``compile_filter`` of ``seccomp.py`` at ``commit``."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:autoresearch/sandbox/seccomp.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    namespace: dict = {"__name__": f"seccomp_{commit}"}
    exec(compile(source, f"seccomp.py@{commit}", "exec"), namespace)
    return namespace["compile_filter"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--baseline-commit", default="bc2f391")
    args = parser.parse_args(argv)
    logging.getLogger("wmrl.autoresearch.sandbox").setLevel(logging.ERROR)
    compile_old = old_filter(args.baseline_commit)

    class BaselineFilter(BwrapSandbox):
        def seccomp_program(self, *, deny_affinity: bool) -> str | None:
            return compile_old(deny_affinity).hex()

    arms = {
        "current": make_sandbox("bwrap"),
        "baseline": BaselineFilter(),
        "none": make_sandbox("bwrap", seccomp=False),
    }
    for name, sb in arms.items():
        if sb.problem is not None:
            raise SystemExit(f"bwrap cannot run here ({name}): {sb.problem}")
    print(
        "BPF instructions: current",
        len(arms["current"].seccomp_program(deny_affinity=False) or "") // 16,
        f"baseline ({args.baseline_commit})",
        len(arms["baseline"].seccomp_program(deny_affinity=False) or "") // 16,
    )
    limits = Limits(wall_time_s=120, memory_mb=2048, threads=1)
    walls: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="wmrl-bench-seccomp-") as tmp:
        os.chmod(tmp, 0o755)  # the sandbox users read the data in place
        data = throughput.make_data(Path(tmp))
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for name in order:
                result = arms[name].run(throughput.SKLEARN, data, limits)
                if result.status != "ok":
                    raise SystemExit(f"{name}: {result.status} {result.reason} {result.stderr_tail[-500:]}")
                walls[name].append(result.resources.wall_s)
            print(f"round {r + 1}/{args.rounds}", {k: v[-1] for k, v in walls.items()}, flush=True)
    means = {name: statistics.mean(w) for name, w in walls.items()}
    for name, w in walls.items():
        print(f"{name:9s} mean wall {means[name]:.3f} s  sd {statistics.stdev(w):.3f}  n={len(w)}")
    ratios = {
        "current/baseline": means["current"] / means["baseline"],
        "current/none": means["current"] / means["none"],
    }
    print("  ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    return ratios


if __name__ == "__main__":
    main()
