"""Stage a task's public data where the sandbox can mount it.

The bubblewrap sandbox hides the installed ``wmrl`` package from solutions, because the bundled
suite keeps its private answers there. The bundled tasks' public folders live in the same
package, so they are copied once to a staging folder outside it (under the system temp dir, or
``WMRL_STAGING_DIR``), keyed by a fingerprint of the files so that a rebuilt task gets a fresh copy.
External tasks (MLE-bench, MLE-Dojo, DSBench folders on the user's disk) are mounted in place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["package_roots", "staged_public_dir"]


def package_roots() -> list[Path]:
    """Folders of the installed ``wmrl`` packages (the sandbox hides these)."""
    import wmrl.autoresearch
    import wmrl.core

    roots = [Path(wmrl.core.__file__).resolve().parent, Path(wmrl.autoresearch.__file__).resolve().parent]
    # The other domain is located, never imported (the domains stay independent of each other).
    spec = importlib.util.find_spec("wmrl.embodied")
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).resolve().parent)
    return roots


def _fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def staged_public_dir(task_id: str, public_dir: Path) -> Path:
    """``public_dir`` itself, or a read-only copy outside the ``wmrl`` package when it lies inside."""
    public_dir = public_dir.resolve()
    if not any(root == public_dir or root in public_dir.parents for root in package_roots()):
        return public_dir
    base = Path(os.environ.get("WMRL_STAGING_DIR") or Path(tempfile.gettempdir()) / "wmrl-public-data")
    target = base / f"{task_id}-{_fingerprint(public_dir)}" / "public"
    if target.is_dir():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{task_id}-", dir=target.parent.parent))
    shutil.copytree(public_dir, scratch / "public")
    for path in (scratch / "public").rglob("*"):
        path.chmod(0o444 if path.is_file() else 0o555)
    (scratch / "public").chmod(0o555)
    try:
        scratch.rename(target.parent)
    except OSError:  # another process staged it first; use theirs
        shutil.rmtree(scratch, ignore_errors=True)
    return target
