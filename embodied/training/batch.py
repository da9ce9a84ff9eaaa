"""From scored episodes to PPO samples: one sample per (episode, timestep), the episode's advantage on it.

Timesteps are chosen per episode by :func:`choose_timesteps` from a generator seeded by
``(seed, step, episode index)`` alone, so the choice does not depend on the order episodes finish in
and a resumed run makes the same choice. The rollout keeps only the chosen observations
(:func:`prune_observations`): an episode of 520 steps at 256 px would otherwise hold 100 MB of images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SampleBatch", "build_samples", "choose_timesteps", "keep_frame_window", "prune_observations"]

_STREAM = 0x74_69_6D_65  # the timestep-choice random stream


def choose_timesteps(n_steps: int, k: int | None, seed: int, step: int, episode: int) -> np.ndarray:
    """Sorted timesteps of one episode used for the update: all of them, or ``k`` drawn without replacement.

    Args:
        n_steps: ``T``, policy steps the episode took.
        k: timesteps to keep (``None`` or ``k >= T``: all ``T``).
        seed, step, episode: the coordinates the draw is a pure function of.

    Returns:
        ``int64 (min(k, T),)`` increasing indices in ``[0, T)``.
    """
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0; got {n_steps}")
    if k is None or k >= n_steps:
        return np.arange(n_steps, dtype=np.int64)
    rng = np.random.default_rng([int(seed), int(step), int(episode), _STREAM])
    return np.sort(rng.choice(n_steps, size=k, replace=False)).astype(np.int64)


def prune_observations(record: Any, keep: np.ndarray) -> None:
    """Drop, in place, every observation of ``record`` whose timestep is not in ``keep`` (``None`` there)."""
    obs = record.observations
    if obs is None:
        raise ValueError(
            "the episode kept no observations; run the rollout with RolloutConfig(keep_observations=True)"
        )
    wanted = {int(t) for t in keep}
    record.observations = [o if t in wanted else None for t, o in enumerate(obs)]


def keep_frame_window(record: Any, camera: str, num_frames: int) -> None:
    """Cut, in place, ``record``'s frames to the ``num_frames`` Robometer reads (and drop other cameras).

    The window is :func:`~wmrl.embodied.worldmodel.frames.subsample_indices` of the recorded frames, so
    a source that subsamples ``num_frames`` from the cut record gets exactly these frames back and
    scores the episode as it would have scored the whole video.
    """
    from wmrl.embodied.worldmodel.frames import subsample_indices

    frames = record.frames.get(camera)
    if frames is None or len(frames) == 0:
        record.frames = {}
        return
    window = subsample_indices(len(frames), num_frames)
    record.frames = {camera: frames[window]}
    if len(record.frame_steps) == len(frames):
        record.frame_steps = np.asarray(record.frame_steps)[window]


@dataclass
class SampleBatch:
    """The PPO samples of one training step. ``N`` samples, ``A`` action tokens.

    Attributes:
        episode: ``int64 (N,)`` index of each sample's episode in the step's (group-major) episode list.
        timestep: ``int64 (N,)`` policy step within the episode.
        advantage: ``float64 (N,)`` the episode's advantage (finite; masked episodes have no samples).
        token_ids: ``int64 (N, A)`` the tokens the behaviour policy sampled.
        behaviour_logp: ``float64 (N,)`` their summed log-probability as recorded while acting.
        observations: ``N`` observations the policy acted on.
        instructions: ``N`` instructions.
    """

    episode: np.ndarray
    timestep: np.ndarray
    advantage: np.ndarray
    token_ids: np.ndarray
    behaviour_logp: np.ndarray
    observations: list[Mapping[str, np.ndarray]]
    instructions: list[str]

    def __len__(self) -> int:
        return int(self.episode.shape[0])


def build_samples(
    episodes: Sequence[Any],
    advantages: Sequence[float] | np.ndarray,
    timesteps: Sequence[np.ndarray],
    drop_zero_advantage: bool = False,
) -> SampleBatch:
    """One sample per chosen (episode, timestep), carrying the episode's advantage.

    Args:
        episodes: ``E`` episode records (``token_ids (T, A)``, ``log_probs (T,)``, ``observations``, ``instruction``).
        advantages: ``(E,)`` per-episode advantages; NaN = no advantage (the episode yields no sample).
        timesteps: per episode, the timesteps to use (:func:`choose_timesteps`).
        drop_zero_advantage: also skip episodes whose advantage is exactly 0 (no surrogate gradient).

    Raises:
        ValueError: mismatched lengths, an episode without tokens, or a chosen observation that was pruned.
    """
    adv = np.asarray(advantages, dtype=np.float64)
    if adv.shape != (len(episodes),) or len(timesteps) != len(episodes):
        raise ValueError(
            f"need one advantage and one timestep set per episode: {len(episodes)} episodes, "
            f"advantages {adv.shape}, {len(timesteps)} timestep sets"
        )
    ep_idx, t_idx, sample_adv, tokens, logps, observations, instructions = [], [], [], [], [], [], []
    width = None
    for e, (record, a, ts) in enumerate(zip(episodes, adv, timesteps, strict=True)):
        if not np.isfinite(a) or (drop_zero_advantage and a == 0.0):
            continue
        if record.token_ids is None or record.log_probs is None:
            raise ValueError(
                f"episode {e} has no action tokens/log-probs: a token policy must act in RL rollouts"
            )
        if width is None:
            width = record.token_ids.shape[1]
        for t in np.asarray(ts, dtype=np.int64):
            if not 0 <= t < record.steps:
                raise ValueError(f"timestep {t} is outside episode {e} of {record.steps} steps")
            obs = record.observations[t] if record.observations is not None else None
            if obs is None:
                raise ValueError(f"the observation of episode {e} at timestep {t} was not kept")
            ep_idx.append(e)
            t_idx.append(int(t))
            sample_adv.append(float(a))
            tokens.append(record.token_ids[t])
            logps.append(float(record.log_probs[t]))
            observations.append(obs)
            instructions.append(record.instruction)
    a_dim = width if width is not None else 0
    return SampleBatch(
        episode=np.asarray(ep_idx, dtype=np.int64),
        timestep=np.asarray(t_idx, dtype=np.int64),
        advantage=np.asarray(sample_adv, dtype=np.float64),
        token_ids=np.asarray(tokens, dtype=np.int64).reshape(len(tokens), a_dim),
        behaviour_logp=np.asarray(logps, dtype=np.float64),
        observations=observations,
        instructions=instructions,
    )
