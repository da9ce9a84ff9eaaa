"""The cost ledger: what a run spent per stream, and what real-execution GRPO would have spent.

Streams: ``world_model`` (predictions), ``anchor`` (real execution), ``generation`` (sampling
rollouts) and ``update`` (the optimiser step); any other name may be added, as ``anchor_wait`` is with
asynchronous anchors (the trainer idle on executions due at a step; its accelerators are the trainer's,
so its accelerator-seconds are what waiting on anchors wastes). A sandbox with GPUs books them on
``anchor`` (its GPUs held x its wall seconds). Each record holds
wall seconds, accelerator-seconds (wall × accelerators held, the paper's GPU-hours unit) and the
number of items processed, so per-item costs can be extrapolated.

The counterfactual: a run in ``real`` mode grades *every* rollout by real execution and pays no
world model. Its estimated cost is this run's generation + update, plus every rollout graded at
the measured per-item anchor cost. That is an estimate (real execution cost varies by solution),
and the report says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["CostLedger", "StreamCost"]


@dataclass
class StreamCost:
    """Totals of one stream: wall seconds, accelerator-seconds, items, calls."""

    wall_s: float = 0.0
    accel_s: float = 0.0
    items: int = 0
    calls: int = 0

    def per_item(self, field: str) -> float | None:
        return getattr(self, field) / self.items if self.items else None


#: one lock for every ledger's bookings (a module lock, not an attribute: a ledger stays picklable)
_BOOKING = threading.Lock()


class CostLedger:
    """Accumulates costs per stream; safe to book from several threads (asynchronous execution passes
    run on worker threads, several at once with ``asynchrony.workers > 1``)."""

    STREAMS = ("world_model", "anchor", "generation", "update")

    def __init__(self, accelerators: dict[str, float] | None = None) -> None:
        """``accelerators``: accelerators held per stream (default 0 = CPU-only; the GPU count on GPUs)."""
        self.accelerators = dict.fromkeys(self.STREAMS, 0.0) | dict(accelerators or {})
        self.streams: dict[str, StreamCost] = {s: StreamCost() for s in self.STREAMS}
        self.graded_rollouts = 0

    def add(self, stream: str, wall_s: float, items: int = 0, accelerators: float | None = None) -> None:
        if wall_s < 0 or items < 0:
            raise ValueError(f"costs must be >= 0; got wall_s={wall_s}, items={items}")
        held = self.accelerators.get(stream, 0.0) if accelerators is None else accelerators
        with _BOOKING:
            cost = self.streams.setdefault(stream, StreamCost())
            cost.wall_s += wall_s
            cost.accel_s += wall_s * held
            cost.items += items
            cost.calls += 1

    @contextmanager
    def measure(self, stream: str, items: int = 0, accelerators: float | None = None) -> Iterator[None]:
        """Time a block and book it to ``stream``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stream, time.perf_counter() - start, items, accelerators)

    def count_rollouts(self, n: int) -> None:
        """Rollouts the run graded in total (by either source): the real-mode counterfactual's workload."""
        self.graded_rollouts += int(n)

    @classmethod
    def merged(cls, states: Sequence[dict[str, Any]]) -> CostLedger:
        """One ledger from the ledgers of several ranks (their :meth:`state_dict`), summed.

        Every field adds up: wall seconds become rank-seconds (the compute all ranks spent, the
        paper's GPU-hours when each rank holds one accelerator), accelerators held are those of all
        ranks together, and graded rollouts are every rank's own. Per-item costs and the real-mode
        estimate of the merged ledger are then those of the whole run.
        """
        if not states:
            raise ValueError("merged() needs at least one ledger state")
        out = cls(dict.fromkeys(cls.STREAMS, 0.0))
        for state in states:
            for name, held in state["accelerators"].items():
                out.accelerators[name] = out.accelerators.get(name, 0.0) + float(held)
            for name, fields in state["streams"].items():
                cost = out.streams.setdefault(name, StreamCost())
                cost.wall_s += float(fields["wall_s"])
                cost.accel_s += float(fields["accel_s"])
                cost.items += int(fields["items"])
                cost.calls += int(fields["calls"])
            out.graded_rollouts += int(state["graded_rollouts"])
        return out

    def report(self) -> dict[str, Any]:
        """Spent per stream, totals, and the estimated cost of grading every rollout by real execution."""
        spent = {
            name: {"wall_s": c.wall_s, "accel_s": c.accel_s, "items": c.items, "calls": c.calls}
            for name, c in self.streams.items()
        }
        total_wall = sum(c.wall_s for c in self.streams.values())
        total_accel = sum(c.accel_s for c in self.streams.values())
        anchor = self.streams["anchor"]
        estimate: dict[str, Any] = {"wall_s": None, "accel_s": None, "ratio_wall": None, "ratio_accel": None}
        if anchor.items and self.graded_rollouts:
            base_wall = self.streams["generation"].wall_s + self.streams["update"].wall_s
            base_accel = self.streams["generation"].accel_s + self.streams["update"].accel_s
            est_wall = base_wall + self.graded_rollouts * anchor.wall_s / anchor.items
            est_accel = base_accel + self.graded_rollouts * anchor.accel_s / anchor.items
            estimate = {
                "wall_s": est_wall,
                "accel_s": est_accel,
                "ratio_wall": est_wall / total_wall if total_wall > 0 else None,
                "ratio_accel": est_accel / total_accel if total_accel > 0 else None,
            }
        return {
            "spent": spent,
            "total": {"wall_s": total_wall, "accel_s": total_accel},
            "graded_rollouts": self.graded_rollouts,
            "real_mode_estimate": estimate,
            "note": "real_mode_estimate = generation + update + every graded rollout at the measured mean anchor cost per item",
        }

    def format(self) -> str:
        rep = self.report()
        lines = [f"{'stream':<12} {'wall s':>10} {'accel s':>10} {'items':>8}"]
        for name, c in rep["spent"].items():
            lines.append(f"{name:<12} {c['wall_s']:>10.2f} {c['accel_s']:>10.2f} {c['items']:>8d}")
        lines.append(f"{'total':<12} {rep['total']['wall_s']:>10.2f} {rep['total']['accel_s']:>10.2f}")
        est = rep["real_mode_estimate"]
        if est["wall_s"] is not None:
            lines.append(
                f"real-execution GRPO, estimated: {est['wall_s']:.2f} wall s ({est['ratio_wall']:.2f}x this run); "
                "a model, not a measurement: every graded rollout at this run's mean anchor cost per item "
                "(no result cache; the streams' seconds overlap, so they can exceed the run's wall time)"
            )
        else:
            lines.append("real-execution GRPO estimate: unknown (no anchor execution was measured)")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, Any]:
        return {
            "accelerators": dict(self.accelerators),
            "streams": {k: vars(v).copy() for k, v in self.streams.items()},
            "graded_rollouts": self.graded_rollouts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accelerators = dict(state["accelerators"])
        self.streams = {k: StreamCost(**v) for k, v in state["streams"].items()}
        self.graded_rollouts = int(state["graded_rollouts"])
