"""Read-only staged copies of public data, verified before every reuse.

A staged copy is made when a folder cannot be shown to a sandbox in place: the bundled suite's
public folders (they live in the checkout, beside the answers, and their host path would show in
the sandbox's mount table) and folders the unprivileged sandbox user cannot read (under a
``0700`` home or temp folder). The copy is

- owned by the trainer, files ``0444`` and folders ``0555`` below a root folder that only the
  trainer may write (a root folder created or made writable by anyone else is not used: a
  solution on the unisolated subprocess backend could pre-create one with poisoned data);
- recorded in a manifest beside it (outside the folder a solution sees) with each file's size,
  SHA-256 and inode/ctime;
- verified before *each* reuse: the same files, owners and modes, and the same inode/ctime
  (which nobody can set back); on any difference the contents are hashed again, and a copy whose
  contents differ is thrown away and made again. Hashing is the cost only of a changed copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

__all__ = ["StagingArea", "fingerprint", "readable_by_others"]

log = logging.getLogger("wmrl.autoresearch.sandbox")
_MANIFEST = "manifest.json"


def fingerprint(folder: Path) -> str:
    """Cheap identity of a source folder: every file's relative name, size and mtime."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            p = Path(root) / name
            with contextlib.suppress(OSError):
                st = p.stat()
                digest.update(f"{p.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def readable_by_others(folder: Path, *, ancestors: bool = True) -> bool:
    """Whether a user who is neither the owner nor in the group can read all of ``folder``.

    Every ancestor must be searchable by others (``o+x``; skipped with ``ancestors=False``, for
    a folder that is bind-mounted by root), every folder inside readable and searchable, every
    file readable; symbolic links are judged by their targets.
    """
    folder = Path(os.path.realpath(folder))
    for parent in folder.parents if ancestors else ():
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    for root, _dirs, files in os.walk(folder, followlinks=False):
        try:
            if os.stat(root).st_mode & (stat.S_IROTH | stat.S_IXOTH) != (stat.S_IROTH | stat.S_IXOTH):
                return False
            for name in files:
                if not os.stat(Path(root) / name).st_mode & stat.S_IROTH:
                    return False
        except OSError:
            return False
    return True


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _safe_root(root: Path) -> bool:
    """Owned by us and writable by nobody else (the sticky /tmp itself is the parent, not this)."""
    try:
        st = os.lstat(root)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


class StagingArea:
    """A folder of verified read-only copies (``<root>/<key>/public`` + ``<root>/<key>/manifest.json``).

    Args:
        root: where the copies live. Created ``0755`` if missing; if it exists but belongs to
            someone else or others may write it, a private folder is used instead (and logged).
    """

    def __init__(self, root: str | os.PathLike) -> None:
        root = Path(root)
        with contextlib.suppress(OSError):
            root.mkdir(mode=0o755, parents=True, exist_ok=True)
        if not _safe_root(root):
            private = Path(tempfile.mkdtemp(prefix="wmrl-staging-"))
            os.chmod(private, 0o755)
            log.warning("staging folder %s is not ours alone; staging in %s instead", root, private)
            root = private
        self.root = root
        self._lock = threading.Lock()
        self.restaged = 0  # copies found altered and made again (for tests and logs)

    def stage(self, key: str, source: Path) -> Path:
        """A verified read-only copy of ``source`` under ``key`` (made or reused)."""
        with self._lock:
            found = self._reuse(key)
            return found if found is not None else self._make(self.root / key, Path(source))

    def verified(self, key: str) -> Path | None:
        """The copy under ``key`` if it exists and verifies (an altered one is thrown away), else
        ``None``: for callers that make the source only when no copy is there."""
        with self._lock:
            return self._reuse(key)

    # -- internals ----------------------------------------------------------------------------
    def _reuse(self, key: str) -> Path | None:
        if "/" in key or key in ("", ".", ".."):
            raise ValueError(f"staging key must be a plain name; got {key!r}")
        entry = self.root / key
        if not os.path.lexists(entry):
            return None
        if self._verify(entry):
            return entry / "public"
        self.restaged += 1
        log.warning("staged copy %s was altered; making it again", entry)
        self._discard(entry)
        return None

    def _make(self, entry: Path, source: Path) -> Path:
        scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=self.root))
        public = scratch / "public"
        shutil.copytree(source, public, symlinks=False)
        files = {}
        for root, _dirs, names in os.walk(public):
            for n in names:
                p = Path(root) / n
                os.chmod(p, 0o444)
                files[str(p.relative_to(public))] = {"size": p.stat().st_size, "sha256": _hash_file(p)}
        # Folders last (bottom-up, never through a link: copytree copied links' targets).
        for root, _dirs, _names in os.walk(public, topdown=False):
            os.chmod(root, 0o555)
        # inode and ctime are read after the last chmod: nothing but a change can move them.
        for rel, info in files.items():
            st = os.stat(public / rel)
            info.update(ino=st.st_ino, ctime_ns=st.st_ctime_ns)
        (scratch / _MANIFEST).write_text(json.dumps({"files": files}, sort_keys=True))
        os.chmod(scratch / _MANIFEST, 0o444)
        os.chmod(scratch, 0o755)
        try:
            os.rename(scratch, entry)
        except OSError:  # another process staged it first: verify theirs
            self._discard(scratch)
            if not self._verify(entry):
                raise RuntimeError(f"staged copy {entry} made by another process does not verify") from None
        return entry / "public"

    def _verify(self, entry: Path) -> bool:
        public = entry / "public"
        try:
            manifest = json.loads((entry / _MANIFEST).read_text())["files"]
            for p in (entry, public, entry / _MANIFEST):
                st = os.lstat(p)
                if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    return False
            seen = {}
            for root, dirs, names in os.walk(public):
                for d in dirs:
                    st = os.lstat(Path(root) / d)
                    if not stat.S_ISDIR(st.st_mode) or stat.S_IMODE(st.st_mode) != 0o555:
                        return False
                for n in names:
                    p = Path(root) / n
                    seen[str(p.relative_to(public))] = os.lstat(p)
            if stat.S_IMODE(os.lstat(public).st_mode) != 0o555 or set(seen) != set(manifest):
                return False
            changed = []
            for rel, st in seen.items():
                want = manifest[rel]
                if (
                    not stat.S_ISREG(st.st_mode)
                    or stat.S_IMODE(st.st_mode) != 0o444
                    or st.st_uid != os.geteuid()
                ):
                    return False
                if (st.st_size, st.st_ino, st.st_ctime_ns) != (want["size"], want["ino"], want["ctime_ns"]):
                    changed.append(rel)
            # Metadata moved (a restore from backup, a copy tool): the contents decide.
            return all(_hash_file(public / rel) == manifest[rel]["sha256"] for rel in changed)
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def _discard(self, entry: Path) -> None:
        if os.geteuid() != 0:  # root needs no write permission to delete
            for root, _dirs, _names in os.walk(entry, followlinks=False):
                with contextlib.suppress(OSError):
                    if not os.path.islink(root):
                        os.chmod(root, 0o700)
        shutil.rmtree(entry, ignore_errors=True)
