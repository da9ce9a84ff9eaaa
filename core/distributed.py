"""The processes of a data-parallel run: who this process is, and the few collectives the loop trainer needs.

A run launched by ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT``) has one process per device; :meth:`Processes.from_env` joins them in one
``torch.distributed`` process group (``gloo`` on CPUs, ``nccl`` on GPUs) and a single process gets
the trivial group of one. Nothing here is a distributed system of its own: every collective is
``torch.distributed``'s.

Used by :class:`~wmrl.core.loop.LoopTrainer` (each rank rolls out its share of a step's groups; the
scores are gathered so the corrector plans and corrects the whole batch identically on every rank)
and by a domain's update (gradients summed over ranks with :meth:`Processes.all_reduce_sum`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["Processes", "close_process_group", "leave_launched_process", "shard"]


def leave_launched_process(code: int = 0) -> NoReturn:
    """End one process of a finished multi-process launch now, skipping interpreter teardown.

    After a gloo run, interpreter teardown sometimes aborts in native code ("terminate called
    without an active exception", SIGABRT; seen about once in tens of runs on a loaded machine)
    although the run is complete and the process group destroyed; the launcher would then report a
    finished run as failed and kill its other ranks. Call it only once everything is written and
    the process group is closed (:meth:`Processes.close`).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def shard(n: int, rank: int, world: int) -> slice:
    """The contiguous share of ``n`` items that ``rank`` of ``world`` takes (the first ``n % world``
    ranks take one more), so the ranks' shares concatenated in rank order are the items in order."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not a rank of {world} process(es)")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


@dataclass
class Processes:
    """This process's place in the run: ``rank`` of ``world`` (``local_rank`` on its machine).

    With ``world == 1`` every collective is the identity and nothing of ``torch.distributed`` is used.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, *, cuda: bool = False) -> Processes:
        """Join the launcher's process group (``WORLD_SIZE`` > 1), or the trivial one of a single process.

        ``cuda``: the models of this process run on its GPU (``nccl``; each rank takes GPU ``LOCAL_RANK``);
        else ``gloo`` on CPUs. A process group someone already started is joined as it is.
        """
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch
        import torch.distributed as dist

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            backend = "nccl" if cuda else "gloo"
            if cuda:
                torch.cuda.set_device(local_rank)
            dist.init_process_group(backend=backend)
        return cls(
            rank=dist.get_rank(),
            world=dist.get_world_size(),
            local_rank=local_rank,
            backend=dist.get_backend(),
        )

    # -- collectives ---------------------------------------------------------------------------
    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_reduce_sum(self, tensors: Sequence[Any]) -> None:
        """Sum ``tensors`` (``torch.Tensor``, same shapes and dtype on every rank) over the ranks, in place,
        as one flat buffer (one collective whatever their number)."""
        if not self.distributed or not tensors:
            return
        import torch
        import torch.distributed as dist

        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()

    def broadcast_(self, tensors: Sequence[Any], src: int = 0) -> None:
        """Overwrite ``tensors`` on every rank with rank ``src``'s, in place."""
        if not self.distributed or not tensors:
            return
        import torch
        import torch.distributed as dist

        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        dist.broadcast(flat, src=src)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def close(self) -> None:
        """Leave the process group (only one this object's :meth:`from_env` may have started).

        Every rank calls it once it is done communicating. The barrier first makes no rank tear down
        its connections while a peer may still be completing the last collective with it (gloo's
        connection threads otherwise see a peer vanish mid-operation)."""
        if self.distributed:
            close_process_group(barrier=True)


def close_process_group(*, barrier: bool = False) -> None:
    """Leave the open ``torch.distributed`` process group, whoever started it (:meth:`Processes.from_env`,
    or a library's launcher such as Accelerate under TRL); nothing if none is open.

    ``barrier``: wait for every rank first (a clean end, see :meth:`Processes.close`). Leave it off
    where this runs in a ``finally`` after an error: a rank that failed would wait forever for peers
    that are not coming. Leaving the group open instead can abort the interpreter at exit.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
