"""The typed configuration of ``wmrl eval autoresearch``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wmrl.autoresearch.training.config import SandboxSection
from wmrl.core.config import require

__all__ = ["EvalConfig"]


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation of an AutoResearch policy: valid rate and avg@k leaderboard position.

    Attributes:
        model: the policy: a run's ``final/`` folder, a Hugging Face folder, a ``.gguf`` file, or
            ``smollm2`` (embedded). Required.
        tasks: ``eval`` (the bundled held-out tasks), ``train``, or task references (a list, or one
            comma-separated string).
        samples: rollouts per task (avg@k).
        train_tasks: the tasks the policy was trained on, a list or one comma-separated string (default:
            read from the run's ``config.json``, else the bundled training split); the evaluated tasks
            must be disjoint from them.
        max_new_tokens: generated tokens per rollout.
        overview_tokens: token budget of the task overview in the prompt (as in training).
        temperature: sampling temperature.
        seed: seed of sampling.
        device: where the policy runs: ``cpu``, ``cuda`` or ``auto``.
        sandbox: real execution of the solutions.
    """

    model: str | None = None
    tasks: str | tuple[str, ...] = "eval"
    samples: int = 4
    train_tasks: str | tuple[str, ...] = ()
    max_new_tokens: int = 384
    overview_tokens: int = 400
    temperature: float = 0.7
    seed: int = 0
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    sandbox: SandboxSection = field(default_factory=SandboxSection)

    def __post_init__(self) -> None:
        require(
            self.model is not None and str(self.model).strip() != "",
            "model is required: a run's final/ folder (from `wmrl train autoresearch`), a Hugging Face model "
            "folder, a .gguf file, or 'smollm2' for the embedded SmolLM2-135M-Instruct (--model PATH)",
        )
        require(
            isinstance(self.samples, int) and self.samples >= 1, f"samples must be >= 1; got {self.samples}"
        )
        require(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1; got {self.max_new_tokens}")
        require(self.overview_tokens >= 150, f"overview_tokens must be >= 150; got {self.overview_tokens}")
        require(self.temperature >= 0, f"temperature must be >= 0; got {self.temperature}")
