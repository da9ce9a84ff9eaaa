"""The parts of a run that depend on its config alone: the device, the adapters, the grader and its
sandbox, and what the agent may import. The SFT stage (:mod:`.sft`) and the GRPO run (:mod:`.builders`,
:mod:`.run`) both use them; nothing here needs a warm start.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from wmrl.autoresearch.training.config import TrainConfig
from wmrl.core.errors import UserError

if TYPE_CHECKING:
    from wmrl.autoresearch.training.sft import WarmStartConfig

__all__ = ["AGENT_LIBRARIES", "SandboxUnavailable", "build_grader", "peft_config", "resolve_device"]

#: What the agent is told it may import (short, to keep prompts small; the sandbox runs this
#: interpreter, so all of these are importable there).
AGENT_LIBRARIES = ("numpy", "pandas", "scipy", "scikit-learn", "lightgbm")


class SandboxUnavailable(UserError, RuntimeError):
    """The configured sandbox backend cannot run here; the message says which backend would."""


def resolve_device(config: TrainConfig | WarmStartConfig) -> str:
    """The device of this process's models: under a multi-process launch each rank uses its own GPU."""
    device: str = config.model.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def build_grader(section):
    """An execution grader on the sandbox a ``SandboxSection`` describes (raises if that backend cannot run)."""
    from wmrl.autoresearch.grading import ExecutionGrader
    from wmrl.autoresearch.sandbox import SandboxPool, backend_problems, make_sandbox

    cache = "memory" if section.cache else None
    if section.pool == "ray":  # the backend runs on the Ray workers; they report what fails there
        from wmrl.autoresearch.sandbox.ray_pool import make_ray_sandbox_pool

        pool = make_ray_sandbox_pool(section.backend, section.ray, cache=cache)
        if section.ray.gpus_per_slot > 0:  # every execution asks for a GPU; each slot runs it on its own
            from wmrl.autoresearch.training.devices import RequestGPU

            pool.sandbox = RequestGPU(pool.sandbox)
    else:
        if section.cores:
            from wmrl.autoresearch.sandbox import set_execution_cores

            set_execution_cores(section.cores)
        sandbox = make_sandbox(section.backend)
        if getattr(sandbox, "problem", None):
            working = [name for name, problem in backend_problems().items() if problem is None]
            raise SandboxUnavailable(
                f"sandbox backend {section.backend!r} cannot run here: {sandbox.problem}. Backends that can: "
                f"{working} (choose one with sandbox.backend=NAME; 'subprocess' does NOT isolate the agent's code)"
            )
        if section.gpus:  # each concurrent execution on its own device group
            from wmrl.autoresearch.training.devices import (
                DeviceSlots,
                device_groups,
                missing_gpus,
                visible_gpus,
            )

            missing = missing_gpus(section.gpus)
            if missing:
                have = sorted(visible_gpus())
                raise SandboxUnavailable(
                    f"sandbox.gpus asks for GPU(s) {missing} that this machine does not have (visible: "
                    f"{have or 'none, a CPU-only machine'}); give the agent's code no GPU with sandbox.gpus=[] "
                    "or list devices that exist"
                )
            sandbox = DeviceSlots(sandbox, device_groups(section.gpus, section.gpus_per_slot))
        pool = SandboxPool(sandbox, slots=section.workers, cache=cache)
    return ExecutionGrader(
        sandbox=pool, time_limit_s=section.time_limit_s, memory_limit_mb=section.memory_limit_mb
    )


def peft_config(config: TrainConfig | WarmStartConfig, model=None):
    """PEFT's LoRA config of ``config.lora`` (``None`` without LoRA); ``model`` gives the decoder's
    layer count that ``lora.last_layers`` counts from."""
    if not config.lora.enabled:
        return None
    from peft import LoraConfig

    from wmrl.core.config import ConfigError

    lora = config.lora
    layers = None
    if lora.last_layers:
        total = getattr(getattr(model, "config", None), "num_hidden_layers", None)
        if not isinstance(total, int):
            raise ConfigError("lora.last_layers needs a model whose config names num_hidden_layers")
        if lora.last_layers < total:  # a model with no more layers than that: every layer
            layers = list(range(total - lora.last_layers, total))
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )
