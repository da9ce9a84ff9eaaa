"""The configuration of a Ray pool of workers (no Ray import here: configs load without the extra)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wmrl.core.config import require

__all__ = ["RayPoolConfig"]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class RayPoolConfig:
    """Where and how a :class:`~wmrl.core.engines.ray.RayPool` runs its workers.

    One Ray actor per slot; each slot runs one work item at a time. Ray places the actors on any
    node that has the resources a slot asks for, so sandbox nodes are chosen by giving them a
    custom resource (``ray start --resources '{"sandbox": 4}'``) and asking for it here.

    Attributes:
        address: the Ray cluster to join (``"auto"``: the one this machine belongs to, started with
            ``ray start``; ``"host:port"``: a head node's GCS address; ``null``: a private local
            Ray instance started in this process, for a single machine).
        slots: workers (concurrent work items), >= 1.
        cpus_per_slot: CPUs Ray reserves per slot (fractions allowed).
        memory_mb_per_slot: memory Ray reserves per slot, MiB (``null``: none reserved).
        gpus_per_slot: GPUs per slot; ``1/3`` packs three slots on one GPU (the paper ran 24 slots
            on 8 GPUs). Ray sets ``CUDA_VISIBLE_DEVICES`` of each worker to its own GPU.
        resources: custom resources per slot (``{"sandbox": 1}``: only on nodes that declare them).
        spread: place the slots on as many nodes as possible (Ray's ``SPREAD`` strategy) instead of
            packing them.
        retries: extra tries of a work item whose worker was lost, timed out or reported a harness
            failure; each retry goes to a node the item has not been tried on where one is free.
        timeout_s: seconds one try may take before its worker is declared hung, killed and replaced
            (``null``: no pool deadline; set one: a hung worker otherwise stalls the step).
        start_timeout_s: seconds to wait for at least one worker to be up before items waiting for
            one are given up as unknown.
        max_restarts: replacement workers the pool starts, in total, for workers that died or hung.
    """

    address: str | None = None
    slots: int = 1
    cpus_per_slot: float = 1.0
    memory_mb_per_slot: int | None = None
    gpus_per_slot: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    spread: bool = True
    retries: int = 2
    timeout_s: float | None = 900.0
    start_timeout_s: float = 120.0
    max_restarts: int = 64

    def __post_init__(self) -> None:
        require(
            self.address is None or (isinstance(self.address, str) and self.address.strip() != ""),
            f"ray.address must be null, 'auto' or 'host:port'; got {self.address!r}",
        )
        require(
            isinstance(self.slots, int) and not isinstance(self.slots, bool) and self.slots >= 1,
            f"ray.slots must be an integer >= 1; got {self.slots!r}",
        )
        require(
            _number(self.cpus_per_slot) and self.cpus_per_slot >= 0,
            f"ray.cpus_per_slot must be a number >= 0; got {self.cpus_per_slot!r}",
        )
        require(
            self.memory_mb_per_slot is None
            or (
                isinstance(self.memory_mb_per_slot, int)
                and not isinstance(self.memory_mb_per_slot, bool)
                and self.memory_mb_per_slot >= 1
            ),
            f"ray.memory_mb_per_slot must be null or an integer >= 1; got {self.memory_mb_per_slot!r}",
        )
        require(
            _number(self.gpus_per_slot) and self.gpus_per_slot >= 0,
            f"ray.gpus_per_slot must be a number >= 0; got {self.gpus_per_slot!r}",
        )
        # Ray accepts fractional GPUs below 1 only; above 1 a slot holds whole GPUs.
        require(
            self.gpus_per_slot <= 1 or float(self.gpus_per_slot).is_integer(),
            f"ray.gpus_per_slot above 1 must be a whole number of GPUs; got {self.gpus_per_slot!r}",
        )
        require(isinstance(self.resources, dict), "ray.resources must be a mapping name -> amount")
        for name, amount in self.resources.items():
            require(
                isinstance(name, str)
                and name not in ("CPU", "GPU", "memory")
                and _number(amount)
                and amount > 0,
                f"ray.resources: {name!r}: {amount!r} must be a custom resource name (CPU, GPU and memory "
                "have their own keys) with an amount > 0",
            )
        require(isinstance(self.spread, bool), f"ray.spread must be true or false; got {self.spread!r}")
        require(
            isinstance(self.retries, int) and not isinstance(self.retries, bool) and self.retries >= 0,
            f"ray.retries must be an integer >= 0; got {self.retries!r}",
        )
        require(
            self.timeout_s is None or (_number(self.timeout_s) and self.timeout_s > 0),
            f"ray.timeout_s must be null or a number > 0; got {self.timeout_s!r}",
        )
        require(
            _number(self.start_timeout_s) and self.start_timeout_s > 0,
            f"ray.start_timeout_s must be a number > 0; got {self.start_timeout_s!r}",
        )
        require(
            isinstance(self.max_restarts, int)
            and not isinstance(self.max_restarts, bool)
            and self.max_restarts >= 0,
            f"ray.max_restarts must be an integer >= 0; got {self.max_restarts!r}",
        )

    def actor_options(self) -> dict[str, object]:
        """The ``.options(...)`` of every worker actor (Ray's names and units: bytes for memory)."""
        options: dict[str, object] = {
            "num_cpus": float(self.cpus_per_slot),
            "num_gpus": float(self.gpus_per_slot),
            # A lost worker is replaced by the pool (on any node), not restarted in place by Ray.
            "max_restarts": 0,
        }
        if self.memory_mb_per_slot is not None:
            options["memory"] = int(self.memory_mb_per_slot) * 1024 * 1024
        if self.resources:
            options["resources"] = {k: float(v) for k, v in self.resources.items()}
        if self.spread:
            options["scheduling_strategy"] = "SPREAD"
        return options
