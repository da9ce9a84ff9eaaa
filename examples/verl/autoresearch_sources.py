"""The AutoResearch sources of a verl run, named by ``wmrl_4b.yaml`` (factories of ``VerlConfig``).

* :func:`world_model`: the frozen agent backbone served by one ``vllm serve`` per GPU
  (``WMRL_WM_ENDPOINTS``: comma-separated ``http://host:port/v1``), ``samples`` scoring;
* :func:`anchor`: real execution on the Ray pool of sandbox nodes (``ray start --resources
  '{"sandbox": 3}'`` on each; ``WMRL_SANDBOX_SLOTS`` slots in all, one third of a GPU each);
* :func:`item`: a response and its row (``extra_info.task_ref``: the task folder on shared storage)
  as the ``Solution`` both sources grade.

Used in verl's processes, so everything is imported inside the functions. This file is the
example of ``docs/scale-out.md``; the verl environment needs the ``autoresearch`` extra's
libraries for it (``pip install -e ".[verl,autoresearch]"`` in that environment).
"""

from __future__ import annotations

import os
from typing import Any


def world_model() -> Any:
    from wmrl.autoresearch.llm import load_tokenizer
    from wmrl.autoresearch.llm.endpoints import EndpointPool
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig

    servers = [u for u in os.environ["WMRL_WM_ENDPOINTS"].split(",") if u]
    backend = EndpointPool(servers, timeout_s=300, max_retries=2, concurrency=64)
    tokens = load_tokenizer(os.environ.get("WMRL_POLICY", "Qwen/Qwen3-4B"))
    return WorldModel(
        backend, WorldModelConfig(scoring="samples", samples=4), task_resolver=load_task, tokens=tokens
    )


def anchor() -> Any:
    from wmrl.autoresearch.grading import ExecutionGrader, ExecutionRewardSource
    from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool
    from wmrl.core.engines.ray import RayPoolConfig

    slots = int(os.environ.get("WMRL_SANDBOX_SLOTS", "24"))
    config = RayPoolConfig(
        address="auto",
        slots=slots,
        cpus_per_slot=4,
        memory_mb_per_slot=32768,
        gpus_per_slot=1 / 3,  # the paper's 24 slots on 8 GPUs
        resources={"sandbox": 1},
        retries=2,
        timeout_s=900,
    )
    pool = make_ray_sandbox_pool("bwrap", config, cache="memory")
    grader = ExecutionGrader(sandbox=pool, time_limit_s=600, memory_limit_mb=32768)
    return ExecutionRewardSource(grader, max_workers=slots)


def item(text: str, row: dict[str, Any]) -> Any:
    from wmrl.autoresearch.training.streams import solution_items

    info = dict(row.get("extra_info") or {})
    return solution_items()(text, {"task_ref": info["task_ref"]})
