"""WMRL for LLM agents that write and run machine-learning code (MLE-bench, MLE-Dojo, DSBench)."""
