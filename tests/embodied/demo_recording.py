"""Demonstrations recorded in our simulator for the loader, replay and SFT tests (not a test module)."""

from __future__ import annotations

import numpy as np


def scripted_actions(steps: int, phase: float = 0.0) -> np.ndarray:
    """A smooth, deterministic arm motion with the gripper closing halfway: ``float32 (steps, 7)``."""
    t = np.arange(steps, dtype=np.float64)
    arm = np.stack([0.6 * np.sin(0.4 * t + phase + k) for k in range(6)], axis=1)
    arm[:, 3:] *= 0.3  # small rotations
    gripper = np.where(t < steps // 2, -1.0, 1.0)[:, None]
    return np.concatenate([arm, gripper], axis=1).astype(np.float32)


def record(env, init_states=(0, 1), steps: int = 12):
    """One demonstration per initial state of ``env``'s task, each ``steps`` scripted actions."""
    from wmrl.embodied.demos.replay import record_demo

    return [
        record_demo(env, scripted_actions(steps, phase=0.7 * i), init_state=s, name=f"scripted_state{s}")
        for i, s in enumerate(init_states)
    ]
