"""The typed configuration of ``wmrl eval autoresearch``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wmrl.autoresearch.training.config import SandboxSection
from wmrl.core.config import require

__all__ = ["EvalConfig"]


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation of an AutoResearch policy as in the paper: K turns with feedback, avg@k over seeds.

    Attributes:
        model: the policy: a run's ``final/`` folder, a Hugging Face folder, a ``.gguf`` file,
            ``smollm2`` (embedded) or ``smollm2-warm`` (its cached warm start). Required.
        tasks: ``eval`` (the bundled held-out tasks), ``train``, or task references (a list, or one
            comma-separated string).
        samples: trajectories per task and seed (avg@k).
        seeds: sampling seeds; every number is computed per seed and reported as mean ± SEM over
            seeds (MLE-bench asks for at least 3).
        turns: execution turns per trajectory (K); each turn's result is the next observation, in
            the same format as in training; a trajectory's grade is its best turn.
        train_tasks: the tasks the policy was trained on, a list or one comma-separated string (default:
            recorded by the policy's lineage, else read from the run's ``config.json``, else the bundled
            training split); the evaluated tasks must be disjoint from them.
        in_sample: evaluate on training tasks on purpose (the report is labelled in-sample).
        max_new_tokens: generated tokens per turn.
        overview_tokens: token budget of the task overview in the prompt (as in training).
        feedback_max_tokens: cap on each feedback message (as ``episode.feedback_max_tokens`` in training).
        temperature: sampling temperature.
        batch_size: prompts per generation call.
        device: where the policy runs: ``cpu``, ``cuda`` or ``auto`` (a GPU when one is visible).
        mledojo_root: an MLE-Dojo checkout whose leaderboards rank DSBench tasks (percentiles for
            DSBench; ``null``: DSBench's relative gap).
        data_dir: MLE-bench's data folder for MLE-bench competition tasks.
        sandbox: real execution of the solutions.
        action: what the policy writes, as in its training (``tasks.action``): ``script`` or
            ``model`` (the model block of a fixed pipeline; single-turn); ``null``: as the policy's
            run recorded it (its ``config.json``), else ``script``.
    """

    model: str | None = None
    tasks: str | tuple[str, ...] = "eval"
    samples: int = 4
    seeds: tuple[int, ...] = (0, 1, 2)
    turns: int = 1
    train_tasks: str | tuple[str, ...] = ()
    in_sample: bool = False
    max_new_tokens: int = 384
    overview_tokens: int = 400
    feedback_max_tokens: int = 300
    temperature: float = 0.7
    batch_size: int = 4
    device: Literal["cpu", "cuda", "auto"] = "auto"
    mledojo_root: str | None = None
    data_dir: str | None = None
    sandbox: SandboxSection = field(default_factory=SandboxSection)
    action: Literal["script", "model"] | None = None

    def __post_init__(self) -> None:
        require(
            self.action in ("script", "model", None), f"action must be script or model; got {self.action!r}"
        )
        require(
            self.action != "model" or self.turns == 1,
            "action=model is single-turn (its pipeline is fixed, there is nothing to revise): turns must be 1",
        )
        require(
            self.model is not None and str(self.model).strip() != "",
            "model is required: a run's final/ folder (from `wmrl train autoresearch`), a Hugging Face model "
            "folder, a .gguf file, or 'smollm2' for the embedded SmolLM2-135M-Instruct (--model PATH)",
        )
        require(
            isinstance(self.samples, int) and self.samples >= 1, f"samples must be >= 1; got {self.samples}"
        )
        require(
            len(self.seeds) >= 1
            and len(set(self.seeds)) == len(self.seeds)
            and all(isinstance(s, int) and s >= 0 for s in self.seeds),
            f"seeds must be distinct integers >= 0, at least one; got {list(self.seeds)}",
        )
        require(isinstance(self.turns, int) and self.turns >= 1, f"turns must be >= 1; got {self.turns}")
        require(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1; got {self.max_new_tokens}")
        require(self.overview_tokens >= 150, f"overview_tokens must be >= 150; got {self.overview_tokens}")
        require(
            self.feedback_max_tokens >= 64,
            f"feedback_max_tokens must be >= 64; got {self.feedback_max_tokens}",
        )
        require(self.temperature >= 0, f"temperature must be >= 0; got {self.temperature}")
        require(
            self.temperature > 0 or (self.samples == 1 and len(self.seeds) == 1),
            f"temperature=0 (greedy) writes the same reply in every sample and seed, so samples={self.samples} "
            f"x seeds {list(self.seeds)} would report a spread of identical draws: use samples=1 and one seed",
        )
        require(self.batch_size >= 1, f"batch_size must be >= 1; got {self.batch_size}")
        # The evaluation executes in a local pool with the result cache on (evaluate_policy): a
        # setting of the training sandbox it cannot honour is refused, not ignored.
        require(
            self.sandbox.pool == "local",
            f"sandbox.pool={self.sandbox.pool!r}: the evaluation runs its sandbox on this machine (pool local); "
            "a Ray pool is a training setting",
        )
        require(
            self.sandbox.cache,
            "sandbox.cache=false: the evaluation keeps its result cache (a resubmitted script is graded once)",
        )
