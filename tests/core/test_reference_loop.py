"""The reference loop in benchmarks/ runs and learns (it is the newcomer's first read: keep it working)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reference_loop.py"


def test_reference_loop_learns():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "60"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    initial = float(re.search(r"initial true reward ([\d.]+)", out.stdout).group(1))
    final = float(re.search(r"final true reward ([\d.]+)", out.stdout).group(1))
    assert final > initial + 0.1
    assert "real-execution GRPO, estimated" in out.stdout
