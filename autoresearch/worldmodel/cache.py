"""A cache of world-model predictions keyed by (task, code hash, model, prompt version, sampling).

GRPO groups often hold identical scripts, and forced K-turn agents resubmit unchanged code; a
seeded world model gives the same samples for the same input, so they are computed once. The
cache stores the parsed samples and the parse failures (not the score), so a different reward
ladder reuses them. Backend errors are never cached: they are transient.

In memory (least-recently-used eviction past ``max_entries``), optionally persisted as JSON lines
in ``path`` (appended on every insert, read back at construction), so a restarted run or the
fidelity report reuses earlier predictions.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.autoresearch.worldmodel.prediction import Prediction

__all__ = ["CachedPrediction", "PredictionCache", "cache_key", "code_hash"]


def code_hash(code: str) -> str:
    """SHA-256 of the script text (exact: whitespace changes make a different script)."""
    return hashlib.sha256(code.encode("utf-8", errors="surrogatepass")).hexdigest()


def cache_key(
    task_id: str, code: str, model_id: str, prompt_version: str, settings: Mapping[str, Any]
) -> str:
    """The cache key: a hash of every input that changes the model's samples."""
    payload = json.dumps(
        {
            "task": task_id,
            "code": code_hash(code),
            "model": model_id,
            "prompt": prompt_version,
            "settings": dict(settings),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class CachedPrediction:
    """What one model call produced for one script.

    Attributes:
        samples: the parsed samples (sampling mode), or the single most likely outcome
            (probability mode).
        failures: why each unparsed sample failed.
        status_probs: probability mode only: status -> probability.
        expected_position: probability mode only: E[position | valid].
    """

    samples: tuple[Prediction, ...]
    failures: tuple[str, ...]
    status_probs: Mapping[str, float] | None = None
    expected_position: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": [p.to_dict() for p in self.samples],
            "failures": list(self.failures),
            "status_probs": dict(self.status_probs) if self.status_probs is not None else None,
            "expected_position": self.expected_position,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CachedPrediction:
        return cls(
            tuple(Prediction.from_dict(p) for p in data["samples"]),
            tuple(data["failures"]),
            data.get("status_probs"),
            data.get("expected_position"),
        )


class PredictionCache:
    """LRU cache of :class:`CachedPrediction` by :func:`cache_key`; thread-safe."""

    def __init__(self, max_entries: int = 100_000, path: str | os.PathLike[str] | None = None) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int >= 1; got {max_entries!r}")
        self.max_entries = max_entries
        self.path = Path(path) if path is not None else None
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, CachedPrediction] = OrderedDict()
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        with open(self.path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    self._store(record["key"], CachedPrediction.from_json(record["entry"]))
                except (json.JSONDecodeError, KeyError, TypeError) as err:
                    # A torn last line (a killed writer) is skipped; anything earlier is corruption.
                    if number > 1 and not line.endswith("\n"):
                        continue
                    raise ValueError(f"{self.path}:{number}: not a prediction-cache record ({err})") from None

    def _store(self, key: str, entry: CachedPrediction) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, key: str) -> CachedPrediction | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: str, entry: CachedPrediction) -> None:
        with self._lock:
            self._store(key, entry)
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"key": key, "entry": entry.to_json()}) + "\n")

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries
