"""Training checkpoints: everything a resumed run needs to continue exactly where it stopped.

``RUN/checkpoints/step-000012/`` (12 = training steps completed) holds:

* ``policy/``: the policy folder (``MiniVLAPolicy.save``: base weights, LoRA adapter, tokenizer,
  statistics, ``policy.json``), loadable as is by ``wmrl eval libero --policy``;
* ``optimizer.pt``: the AdamW state;
* ``corrector.json``: the corrector's whole state (scheduler, isotonic window and map, fusion
  estimates, step counter), exact to the bit (``Corrector.save``);
* ``ledger.json``: the cost ledger so far;
* ``rng.pt``: torch's CPU (and CUDA) random state (dropout, if any);
* ``trainer.json``: the step, the format, and the training config the checkpoint was written under.

Group choice, episode seeds, timestep choice and minibatch order are pure functions of
``(seed, step, …)``, so they need no saved state. A checkpoint is written into a temporary folder
and renamed into place, so a crash never leaves a half-written one that resume would pick up.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT_FORMAT", "Checkpoint", "latest_checkpoint", "list_checkpoints", "save_checkpoint"]

CHECKPOINT_FORMAT = "wmrl-embodied-train-checkpoint/1"
_NAME = re.compile(r"^step-(\d{6,})$")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder on disk and the number of training steps it completed."""

    path: Path
    step: int

    @property
    def policy_dir(self) -> Path:
        return self.path / "policy"

    def trainer_state(self) -> dict[str, Any]:
        data = json.loads((self.path / "trainer.json").read_text())
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"{self.path} has checkpoint format {data.get('format')!r}, not {CHECKPOINT_FORMAT!r}"
            )
        return data

    def optimizer_state(self) -> dict[str, Any]:
        return torch.load(self.path / "optimizer.pt", map_location="cpu", weights_only=True)

    def rng_state(self) -> dict[str, Any]:
        return torch.load(self.path / "rng.pt", map_location="cpu", weights_only=True)


def list_checkpoints(run_dir: str | Path) -> list[Checkpoint]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir() and (child / "trainer.json").is_file():
            found.append(Checkpoint(child, int(match.group(1))))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(run_dir: str | Path) -> Checkpoint | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    policy: Any,
    optimizer_state: dict[str, Any],
    corrector: Any,
    ledger: Any,
    config: dict[str, Any],
    keep: int,
) -> Checkpoint:
    """Write the checkpoint of ``step`` completed steps; keep the newest ``keep`` checkpoints."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    policy.save(tmp / "policy")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    corrector.save(tmp / "corrector.json")
    (tmp / "ledger.json").write_text(json.dumps(ledger.state_dict(), indent=2))
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    # trainer.json last: list_checkpoints only counts folders that have it.
    (tmp / "trainer.json").write_text(
        json.dumps({"format": CHECKPOINT_FORMAT, "step": step, "config": config}, indent=2)
    )
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return Checkpoint(final, step)
