"""Part of the fake vLLM: importable, but NCCL weight transfer needs real vLLM on GPUs."""

from __future__ import annotations


def _no_nccl(*args, **kwargs):
    raise RuntimeError("the fake vLLM has no NCCL weight transfer: vLLM server mode runs on GPUs only")


trainer_init = packed_nccl_broadcast_producer = _no_nccl


class NCCLTrainerSendWeightsArgs:
    def __init__(self, *args, **kwargs):
        _no_nccl()


class NCCLWeightTransferEngine:
    def __init__(self, *args, **kwargs):
        _no_nccl()
