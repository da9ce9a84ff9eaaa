"""WMRL for robot VLA policies: LIBERO-Long, MiniVLA-1B, Robometer."""
