"""Finished benchmark runs kept on disk, so an interrupted ``wmrl bench`` loses only the run in progress.

A benchmark is many independent runs (an arm on a seed under one configuration). Each finished run
is written to ``DIR/runs/<key>.json`` as soon as it ends, ``key`` a hash of everything that
determines its result; rerunning the same command reads the finished runs back instead of
recomputing them, so Ctrl-C (exit 130) followed by the same command continues where it stopped.
A run whose inputs changed has another key and is computed afresh: a stored result is never used
for a configuration, or a version of ``wmrl.core``, it did not come from.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = ["RunStore"]

T = TypeVar("T")


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays (``json.dumps``'s ``default``)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def code_digest() -> str:
    """A hash of the source of ``wmrl.core``: a run computed by other code is not reused."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class RunStore:
    """One JSON file per finished run under ``root/runs``.

    Args:
        root: the benchmark's output directory (created on the first write).
        version: bumped by a benchmark whose results change meaning, so older files are not reused.
    """

    def __init__(self, root: str | os.PathLike[str], version: str = "1") -> None:
        self.dir = Path(root) / "runs"
        self.version = version
        self.code = code_digest()
        self.reused = 0
        self.computed = 0

    def key(self, inputs: Mapping[str, Any]) -> str:
        """A 20-hex-digit hash of ``inputs`` (JSON-able, order-insensitive), the version and the code."""
        text = json.dumps(
            {"version": self.version, "code": self.code, **inputs}, sort_keys=True, default=_plain
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored result of ``key``, or ``None`` if that run has not finished (or its file is unreadable)."""
        path = self.dir / f"{key}.json"
        try:
            result: dict[str, Any] | None = json.loads(path.read_text())["result"]
            return result
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            # A file cut short by a kill during its write is a run that did not finish.
            return None

    def put(self, key: str, inputs: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        """Write one finished run atomically (a kill leaves either the old state or the whole file)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{key}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"inputs": inputs, "result": result}, default=_plain))
        os.replace(tmp, path)

    def run(
        self,
        inputs: Mapping[str, Any],
        compute: Callable[[], T],
        encode: Callable[[T], Mapping[str, Any]],
        decode: Callable[[Mapping[str, Any]], T],
    ) -> T:
        """The stored result for ``inputs`` if there is one, else ``compute()``, stored before it returns."""
        key = self.key(inputs)
        stored = self.get(key)
        if stored is not None:
            self.reused += 1
            return decode(stored)
        value = compute()
        self.put(key, inputs, encode(value))
        self.computed += 1
        return value
