"""Stage a bundled task's public data outside the checkout before the sandbox mounts it.

The bundled suite lives inside the ``wmrl.autoresearch`` package, next to its private answers.
Solutions never see that package (they run with the separate solution environment, and only the
public folder is mounted), but a bind mount shows its source path in the sandbox's mount table,
which would name the checkout. The public folders are therefore copied once to a staging folder
(``$WMRL_STAGING_DIR``, default ``<temp>/wmrl-staged-public``) by
:class:`~wmrl.autoresearch.sandbox.staging.StagingArea`: read-only, owned by the trainer, keyed by
the task id and a fingerprint of the source files, and verified against its manifest before each
reuse. External tasks (MLE-bench, MLE-Dojo, DSBench folders on the user's disk) are mounted in
place.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from wmrl.autoresearch.sandbox.staging import StagingArea, fingerprint

__all__ = ["package_roots", "staged_public_dir", "staging_area"]

_AREAS: dict[Path, StagingArea] = {}
_LOCK = threading.Lock()


def package_roots() -> list[Path]:
    """The folder of the installed ``wmrl.autoresearch`` package (where the bundled suite lives).

    Located from this module's own path, so nothing else of ``wmrl`` is imported.
    """
    return [Path(__file__).resolve().parents[1]]


def staging_area() -> StagingArea:
    """The process's staging area at ``$WMRL_STAGING_DIR`` (default ``<temp>/wmrl-staged-public``)."""
    root = Path(os.environ.get("WMRL_STAGING_DIR") or Path(tempfile.gettempdir()) / "wmrl-staged-public")
    with _LOCK:
        if root not in _AREAS:
            _AREAS[root] = StagingArea(root)
        return _AREAS[root]


def staged_public_dir(task_id: str, public_dir: Path) -> Path:
    """``public_dir`` itself, or a verified read-only copy when it lies inside the package."""
    public_dir = Path(public_dir).resolve()
    if not any(root == public_dir or root in public_dir.parents for root in package_roots()):
        return public_dir
    return staging_area().stage(f"{task_id}-{fingerprint(public_dir)}", public_dir)
