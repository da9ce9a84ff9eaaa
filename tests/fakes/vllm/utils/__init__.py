"""The fake vLLM's ``vllm.utils`` (only what TRL imports)."""
