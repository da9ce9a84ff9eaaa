"""Benchmarks of the method itself (a simulated GRPO problem) and of the corrector's overhead."""
