"""Names TRL's vLLM server client imports; calling any of them says the fake cannot do NCCL."""
