"""Evaluation of a trained AutoResearch policy on held-out tasks (``wmrl eval autoresearch``)."""
