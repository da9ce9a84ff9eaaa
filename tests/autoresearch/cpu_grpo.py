"""The TRL ``GRPOConfig`` every training test here starts from (imported by the test modules beside it).

It holds what all of them share: the CPU rules (``use_cpu``, no bf16, no gradient checkpointing;
both are several times slower on a CPU), a log every step, and no reporting or progress bars. Each
test passes the rest (batch, group, lengths, steps, seed, saving).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_grpo_config(output_dir: str | Path, **fields: Any):
    """A ``trl.GRPOConfig`` for a CPU test run writing to ``output_dir``; ``fields`` add or override."""
    from trl import GRPOConfig

    values: dict[str, Any] = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "report_to": [],
        "disable_tqdm": True,
    }
    values.update(fields)
    return GRPOConfig(**values)
