"""The bundled fidelity corpus: solution scripts with known real outcomes on bundled training tasks.

``corpus/manifest.json`` lists each script (``<task>/<name>.py``), its task and the status the real
sandbox gives it under the corpus's limits (``time_limit_s``, ``memory_limit_mb``): valid
submissions of different strength, runtime errors, runs without a submission, invalid submissions,
syntax errors and timeouts. A test re-runs every script in the sandbox and checks the manifest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CORPUS_DIR", "Corpus", "CorpusEntry", "load_corpus"]

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"


@dataclass(frozen=True)
class CorpusEntry:
    """One script: its task (a bundled id), file (relative to the corpus), code and known status."""

    task: str
    file: str
    code: str
    expected_status: str
    note: str = ""


@dataclass(frozen=True)
class Corpus:
    root: Path
    time_limit_s: float
    memory_limit_mb: int
    entries: tuple[CorpusEntry, ...]


def load_corpus(root: str | os.PathLike | None = None) -> Corpus:
    """Read the manifest and the scripts (default: the bundled corpus)."""
    base = Path(root) if root is not None else CORPUS_DIR
    manifest = base / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"no fidelity corpus at {base} (manifest.json missing)")
    data = json.loads(manifest.read_text(encoding="utf-8"))
    entries = []
    for item in data["solutions"]:
        path = base / item["file"]
        entries.append(
            CorpusEntry(
                task=item["task"],
                file=item["file"],
                code=path.read_text(encoding="utf-8"),
                expected_status=item["expected_status"],
                note=item.get("note", ""),
            )
        )
    return Corpus(base, float(data["time_limit_s"]), int(data["memory_limit_mb"]), tuple(entries))
