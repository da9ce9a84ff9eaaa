"""The execution memory: every real outcome a run obtains, kept by solution key.

Real execution is the expensive, trusted stream. Once a solution has been executed, asking the world
model about it again (or the sandbox) buys nothing that is not already known: the memory keeps the
outcome and grades every later rollout of that solution with it, in every stream, for free.

* **Keys.** A domain names what makes two rollouts "the same solution" (AutoResearch: a normalised
  hash of the script executed on its task; a domain without a natural key gives none and loses
  nothing). ``None`` is never a key.
* **Values.** Per key: the number of executions ``n``, their mean and their sum of squared deviations
  (Welford). A deterministic source's known result is exact; a noisy source's is a sample mean whose
  variance is ``σ²/n`` (``σ²`` the execution noise the corrector measures or the source declares).
* **Bounded.** At most ``max_keys`` keys; the least recently used are forgotten first.
* **Persistent, optionally.** ``store`` names a JSON-lines file that outlives the run: it is read
  when the memory is built and every new outcome is appended, so a later run (another seed, a
  resumed sweep) starts knowing what earlier runs executed. Lines are ``{"key", "n", "mean", "m2"}``;
  a later line for a key replaces the earlier one.
* **Checkpointed.** :meth:`ExecutionMemory.state_dict` holds every entry in recency order, so a
  resumed run continues exactly.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from wmrl.core.config import require

__all__ = ["ExecutionMemory", "MemoryConfig", "MemoryLookup"]


@dataclass(frozen=True)
class MemoryConfig:
    """Settings of the execution memory.

    Attributes:
        enabled: keep real outcomes by solution key and grade known solutions from them. ``None``
            (default): on in mode ``wmrl``, off in ``real`` (plain real-execution GRPO, the paper's
            baseline); ``true`` with mode ``real`` is real-execution GRPO with a result cache.
        max_keys: keys kept at most (least recently used forgotten first).
        store: a JSON-lines file kept across runs (read at start, appended to); ``None``: this run only.
    """

    enabled: bool | None = None
    max_keys: int = 200_000
    store: str | None = None

    def __post_init__(self) -> None:
        require(
            self.enabled is None or isinstance(self.enabled, bool),
            f"memory.enabled must be true, false or null; got {self.enabled!r}",
        )
        require(
            isinstance(self.max_keys, int) and not isinstance(self.max_keys, bool) and self.max_keys >= 1,
            f"memory.max_keys must be an integer >= 1; got {self.max_keys!r}",
        )
        require(
            self.store is None or (isinstance(self.store, str) and self.store.strip() != ""),
            f"memory.store must be a file path or null; got {self.store!r}",
        )


@dataclass
class MemoryLookup:
    """What the memory knows about a ``(n_groups, G)`` matrix of solution keys.

    Attributes:
        known: bool ``(n_groups, G)``, rollouts whose solution has a real outcome.
        mean: ``(n_groups, G)`` that outcome (mean of its executions), NaN where unknown.
        count: ``(n_groups, G)`` executions behind it (0 where unknown).
    """

    known: npt.NDArray[Any]
    mean: npt.NDArray[Any]
    count: npt.NDArray[Any]

    @classmethod
    def nothing(cls, shape: tuple[int, int]) -> MemoryLookup:
        return cls(np.zeros(shape, dtype=bool), np.full(shape, np.nan), np.zeros(shape, dtype=np.int64))


class ExecutionMemory:
    """Real outcomes by solution key (see the module docstring)."""

    def __init__(self, max_keys: int = 200_000, store: str | Path | None = None) -> None:
        require(isinstance(max_keys, int) and max_keys >= 1, f"max_keys must be >= 1; got {max_keys!r}")
        self.max_keys = max_keys
        self._entries: OrderedDict[str, list[float]] = OrderedDict()  # key -> [n, mean, m2]
        self.hits_total = 0
        self.misses_total = 0
        self.evicted_total = 0
        self.store = None if store is None else Path(store)
        if self.store is not None and self.store.exists():
            self._read_store(self.store)

    # -- reading -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._entries

    def get(self, key: str) -> tuple[int, float, float] | None:
        """``(n, mean, variance of the executions)`` of ``key``, ``None`` when unknown (no recency change)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        n, mean, m2 = entry
        return int(n), mean, (m2 / (n - 1) if n > 1 else 0.0)

    def lookup(
        self, keys: npt.NDArray[Any] | None, shape: tuple[int, int], count: bool = True
    ) -> MemoryLookup:
        """What is known about each rollout of a ``(n_groups, G)`` matrix of keys (``None`` = no key).

        ``count``: add this lookup's hits and misses (rollouts with a key) to the running totals and
        mark the hit keys as recently used. Call it with ``False`` for a second look at the same step.
        """
        out = MemoryLookup.nothing(shape)
        if keys is None:
            return out
        for (r, c), key in np.ndenumerate(keys):
            if key is None:
                continue
            entry = self._entries.get(key)
            if entry is None:
                if count:
                    self.misses_total += 1
                continue
            out.known[r, c] = True
            out.mean[r, c] = entry[1]
            out.count[r, c] = int(entry[0])
            if count:
                self.hits_total += 1
                self._entries.move_to_end(key)
        return out

    # -- writing -----------------------------------------------------------------------------
    def record(self, keys: Iterable[str | None], values: Iterable[float]) -> int:
        """Add one execution's outcome per key (NaN values, unknown outcomes, are not recorded).

        Returns the number of outcomes recorded. A key recorded twice in one call counts twice.
        """
        added: list[str] = []
        for key, value in zip(keys, values, strict=True):
            if key is None or not math.isfinite(value):
                continue
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = [1.0, float(value), 0.0]
            else:
                n = entry[0] + 1.0
                delta = float(value) - entry[1]
                entry[1] += delta / n
                entry[2] += delta * (float(value) - entry[1])
                entry[0] = n
                self._entries.move_to_end(key)
            added.append(key)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)
            self.evicted_total += 1
        if added and self.store is not None:
            self._append_store(self.store, dict.fromkeys(added))
        return len(added)

    # -- persistence ---------------------------------------------------------------------------
    def _append_store(self, store: Path, keys: Iterable[str]) -> None:
        store.parent.mkdir(parents=True, exist_ok=True)
        with store.open("a") as f:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:  # evicted at once (max_keys smaller than one step): not stored
                    f.write(json.dumps({"key": key, "n": entry[0], "mean": entry[1], "m2": entry[2]}) + "\n")

    def _read_store(self, path: Path) -> None:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                key, n, mean, m2 = str(row["key"]), float(row["n"]), float(row["mean"]), float(row["m2"])
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"memory store {path}, line {number}: not a memory entry ({err})") from None
            if not (n >= 1 and math.isfinite(mean) and math.isfinite(m2) and m2 >= 0):
                raise ValueError(f"memory store {path}, line {number}: invalid entry {row}")
            self._entries[key] = [n, mean, m2]
            self._entries.move_to_end(key)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def state_dict(self) -> dict[str, Any]:
        """Every entry in recency order (oldest first) and the running counters."""
        return {
            "keys": list(self._entries),
            "values": [list(v) for v in self._entries.values()],
            "hits_total": self.hits_total,
            "misses_total": self.misses_total,
            "evicted_total": self.evicted_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        keys: Sequence[str] = state["keys"]
        values: Sequence[Sequence[float]] = state["values"]
        if len(keys) != len(values):
            raise ValueError("memory state: keys and values differ in length")
        entries: OrderedDict[str, list[float]] = OrderedDict()
        for key, value in zip(keys, values, strict=True):
            n, mean, m2 = (float(v) for v in value)
            if not (n >= 1 and math.isfinite(mean) and math.isfinite(m2) and m2 >= 0):
                raise ValueError(f"memory state holds an invalid entry for {key!r}: {value}")
            entries[str(key)] = [n, mean, m2]
        self._entries = entries
        self.hits_total = int(state["hits_total"])
        self.misses_total = int(state["misses_total"])
        self.evicted_total = int(state["evicted_total"])
