"""The run directory's life: start, resume, restart, and what is left when a run stops early.

Every trainer writes the same layout::

    RUN/config.json                  the resolved config (what ran)
    RUN/metrics.jsonl                one line per step
    RUN/completions.jsonl            the completions table (``logging.completions``)
    RUN/cost_report.json             compute per stream and the real-mode estimate
    RUN/plots/*.png                  calibration curve, fusion weights, reward
    RUN/checkpoints/checkpoint-N/    N = steps completed; each holds the policy, the optimiser,
                                     wmrl_corrector.json and wmrl_ledger.json (written last: a
                                     folder without them is incomplete and never resumed from);
                                     a stage with no corrector (supervised fine-tuning) writes
                                     wmrl_stage.json last instead (write_stage_marker) and
                                     names it as its RunDirectory's marker

The rules (:class:`RunDirectory`):

* a new run refuses a folder that already holds a run (``metrics.jsonl`` or checkpoints) and says
  how to continue it;
* ``--resume`` continues from the newest complete checkpoint (``--resume-from`` names one); a run
  that died before its first checkpoint is *restarted* from step 0 (its log is cleared), so a run
  folder is never a trap where neither a rerun nor ``--resume`` works;
* a run that stops (an error, Ctrl-C) before it completed a step leaves no folder behind, if this
  run created it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.core.pipeline import CORRECTOR_FILE

__all__ = [
    "CHECKPOINTS",
    "STAGE_FILE",
    "WALL_FILE",
    "RunDirectory",
    "add_attempt_wall",
    "checkpoint_step",
    "earlier_wall_s",
    "latest_checkpoint",
    "list_checkpoints",
    "read_stage_marker",
    "write_stage_marker",
]

#: The checkpoints' folder inside a run directory, and each checkpoint's name.
CHECKPOINTS = "checkpoints"
#: The completion marker of a checkpoint written by a stage that has no corrector (a supervised
#: warm start): written last, like ``wmrl_corrector.json`` in an RL checkpoint.
STAGE_FILE = "wmrl_stage.json"
#: Wall seconds of the earlier attempts of a run that stopped (Ctrl-C, an error, a step budget) and
#: is continued from a checkpoint: the finished run's wall time is theirs plus its own.
WALL_FILE = "wall_spent.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(folder: str | Path) -> int:
    """Steps completed by the checkpoint ``folder`` (``checkpoint-N``)."""
    match = _NAME.match(Path(folder).name)
    if not match:
        raise ValueError(f"{folder} is not a checkpoint folder (checkpoint-N)")
    return int(match.group(1))


def write_stage_marker(folder: str | Path, **info: object) -> Path:
    """Mark ``folder`` as a complete checkpoint of a stage without a corrector (call it last).

    ``info`` (JSON-serialisable: the stage's name, the step, what the stage needs to resume) is
    stored in the marker; :func:`read_stage_marker` reads it back.
    """
    import json

    path = Path(folder) / STAGE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str))
    tmp.replace(path)
    return path


def read_stage_marker(folder: str | Path) -> dict[str, Any]:
    """What :func:`write_stage_marker` stored in ``folder``."""
    import json

    marker: dict[str, Any] = json.loads((Path(folder) / STAGE_FILE).read_text())
    return marker


def list_checkpoints(run_dir: str | Path, marker: str = CORRECTOR_FILE) -> list[Path]:
    """Complete checkpoints of a run, oldest first.

    A checkpoint is complete when it holds ``marker``, the file its trainer writes last: the
    correction's state for every RL trainer; a stage without a correction (supervised fine-tuning)
    writes :data:`STAGE_FILE` with :func:`write_stage_marker` and passes ``marker=STAGE_FILE``.
    """
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / marker).is_file()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(run_dir: str | Path, marker: str = CORRECTOR_FILE) -> Path | None:
    found = list_checkpoints(run_dir, marker)
    return found[-1] if found else None


class RunDirError(FileExistsError):
    """The run folder cannot be used as asked; the message says what would work."""


@dataclass
class RunDirectory:
    """Decides how a run uses its folder (see the module docstring).

    Args:
        path: the run directory.
        resume: continue the run in ``path``.
        resume_from: continue from this checkpoint folder (implies ``resume``).
        command: the command line that resumes, for messages (``wmrl train autoresearch``).
        marker: the file that makes a checkpoint folder complete (see :func:`list_checkpoints`):
            :data:`STAGE_FILE` for a stage without a corrector.

    Attributes (after construction):
        checkpoint: the checkpoint to continue from (``None``: start at step 0).
        restarted: the folder held a run that never wrote a checkpoint; it starts over.
        created: this run created the folder (so it may remove it if nothing was done).
    """

    path: Path
    resume: bool = False
    resume_from: Path | None = None
    command: str = "wmrl train"
    marker: str = CORRECTOR_FILE

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.restarted = False
        #: one line the command prints before the run: what --resume did when there was nothing to resume
        self.notice: str | None = None
        self.created = not self.path.exists()
        self.checkpoint: Path | None = None
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"--out {self.path} is a file, not a run directory")
        holds_run = (self.path / "metrics.jsonl").exists() or bool(list_checkpoints(self.path, self.marker))
        if self.resume_from is not None:
            self.resume = True
            folder = Path(self.resume_from)
            if not (folder / self.marker).is_file():
                raise RunDirError(
                    f"--resume-from {folder} is not a complete WMRL checkpoint (it has no {self.marker})"
                )
            self.checkpoint = folder
        elif self.resume:
            self.checkpoint = latest_checkpoint(self.path, self.marker)
            incomplete = sorted(
                p.name
                for p in (self.path / CHECKPOINTS).glob("checkpoint-*")
                if not (p / self.marker).is_file()
            )
            if self.checkpoint is None and incomplete:
                # Checkpoints were written and are now unusable (a deleted file, a copy cut short):
                # restarting would silently discard the run they belonged to.
                raise RunDirError(
                    f"--resume: {self.path} has no complete checkpoint ({', '.join(incomplete)} lack "
                    f"{self.marker}); nothing to continue from. Move those folders away to restart the run "
                    "from step 0, or choose another --out"
                )
            if self.checkpoint is None:
                self.restarted = holds_run
                if holds_run:
                    self.notice = f"{self.path} never wrote a checkpoint: restarting it from step 0 (its log is cleared)"
                else:
                    self.notice = f"{self.path} holds no run yet: starting one"
        elif holds_run:
            hint = (
                "continue it with --resume"
                if list_checkpoints(self.path, self.marker)
                else "it never wrote a checkpoint: restart it with --resume"
            )
            raise RunDirError(f"{self.path} already holds a run; {hint}, or choose another --out")

    def open(self) -> None:
        """Create the folder (checking that it can be written), clearing the log of a restarted run."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".wmrl-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise RunDirError(f"--out {self.path} cannot be written: {err.strerror or err}") from None
        if self.checkpoint is None:  # from step 0: no earlier attempt is continued
            (self.path / WALL_FILE).unlink(missing_ok=True)
        if self.restarted:
            for name in ("metrics.jsonl", "completions.jsonl"):
                (self.path / name).unlink(missing_ok=True)

    def abandon(self) -> bool:
        """After a run stopped before completing a step: remove the folder if this run created it.

        Returns whether it was removed.
        """
        if self.created and self.path.is_dir() and not list_checkpoints(self.path, self.marker):
            shutil.rmtree(self.path, ignore_errors=True)
            return True
        return False

    @property
    def resume_hint(self) -> str:
        return f"{self.command} --out {self.path} --resume"


def earlier_wall_s(run_dir: str | Path) -> float:
    """Wall seconds that the earlier attempts of the run in ``run_dir`` spent (0 for none)."""
    import json

    path = Path(run_dir) / WALL_FILE
    if not path.is_file():
        return 0.0
    return float(sum(json.loads(path.read_text()).get("attempts_s", [])))


def add_attempt_wall(run_dir: str | Path, seconds: float) -> None:
    """Record that an attempt of the run in ``run_dir`` stopped after ``seconds`` of wall time (the
    work after its last checkpoint, redone by the next attempt, included: it was spent). Nothing
    if the folder is gone (a run abandoned before its first step)."""
    import json

    from wmrl.core.runlog import write_json_atomic

    folder = Path(run_dir)
    if not folder.is_dir():
        return
    path = folder / WALL_FILE
    attempts = json.loads(path.read_text()).get("attempts_s", []) if path.is_file() else []
    write_json_atomic(path, {"attempts_s": [*attempts, float(seconds)]})
