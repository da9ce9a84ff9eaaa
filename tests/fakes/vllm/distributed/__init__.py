"""The fake vLLM's ``vllm.distributed``: NCCL weight transfer (server mode) is not faked."""
