"""The reward side of one training step, the same for every domain and engine.

A training step, whatever the engine, is: groups of rollouts → plan anchors (outcome-blind) →
score with the two injected sources → correct → advantages → update → log, checkpoint. Everything
in that list except generation and the update is :class:`RewardPipeline`:

* **plan** (:meth:`RewardPipeline.plan`): the corrector's scheduler picks the anchor groups from
  their keys alone (identically on every rank);
* **score** (:meth:`RewardPipeline.score`): the world model grades every rollout while real
  execution grades the anchor groups' rollouts, concurrently, each booked to its ledger stream;
  :class:`~wmrl.core.rollouts.Exact` rollouts cost nothing and reach both streams exactly;
* **correct** (:meth:`RewardPipeline.correct`): calibration, fusion and group advantages on the
  whole batch (an engine that scores per rank gathers first);
* :meth:`RewardPipeline.step` does all three, for a single process or, given the run's
  :class:`~wmrl.core.distributed.Processes`, for this rank's share of a data-parallel step (the
  plan and the correction on the whole gathered batch, identically on every rank; each rank grades
  only its own rollouts).

It also owns what every run shares: the **mode** (``real`` / ``world_model`` / ``wmrl``, applied
to the corrector in one place, :mod:`wmrl.core.modes`), the **checkpoint files** of the correction
(:data:`CORRECTOR_FILE` and :data:`LEDGER_FILE` inside every checkpoint folder, in every domain
and engine), and the **cost report** (:meth:`RewardPipeline.cost_report`, one layout everywhere).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from wmrl.core.corrector import Correction, Corrector, CorrectorConfig, Plan
from wmrl.core.distributed import Processes
from wmrl.core.late import AnchorsInFlight, InFlight, LateGroups, running_keys
from wmrl.core.ledger import CostLedger
from wmrl.core.modes import Mode, check_mode, resolve_corrector
from wmrl.core.rollouts import Exact, Group
from wmrl.core.sources import (
    Grade,
    RewardSource,
    Role,
    SourceError,
    check_pair,
    check_source,
    collect_grades,
    declared_noise,
)
from wmrl.core.surrogate import learn_from

__all__ = [
    "CORRECTOR_FILE",
    "COST_REPORT_KEYS",
    "LEDGER_FILE",
    "RewardPipeline",
    "Scores",
    "StepResult",
]

#: The keys of every ``cost_report.json`` (see :meth:`RewardPipeline.cost_report`).
COST_REPORT_KEYS = frozenset(
    {
        "spent",
        "total",
        "graded_rollouts",
        "real_mode_estimate",
        "note",
        "mode",
        "steps",
        "per_item_s",
        "accelerators_held",
        "processes",
        "device",
        "details",
    }
)
#: The correction's files inside every checkpoint folder (TRL's, verl's and the loop trainer's).
CORRECTOR_FILE = "wmrl_corrector.json"
LEDGER_FILE = "wmrl_ledger.json"
#: What a world model learned from the run (one with ``state_dict``: a surrogate, a fusion of several).
WORLD_MODEL_FILE = "wmrl_world_model.json"


_NO_REPEATS = np.full(0, np.nan)  # the default of Scores.real_repeat: no repeats given


@dataclass
class Scores:
    """What one scoring pass produced for a flat list of rollouts (``n`` = rollouts).

    Attributes:
        wm: ``(n,)`` world-model scores, NaN = unknown or not scored.
        wm_variance: ``(n,)`` per-call noise variance the world model reported (NaN: none).
        real: ``(n,)`` real-execution scores, NaN = unknown or not executed.
        real_repeat: ``(n,)`` scores of second executions (``Plan.repeat``), NaN where not repeated
            (left out: all NaN).
        wm_grades / real_grades: per rollout the source's :class:`~wmrl.core.sources.Grade`
            (``None``: that stream did not grade it); Exact rollouts get a Grade built from them.
        statuses: per anchor rollout its outcome label (``"unknown"`` for a source without one).
        seconds: wall seconds spent per stream in this pass.
    """

    wm: npt.NDArray[Any]
    wm_variance: npt.NDArray[Any]
    real: npt.NDArray[Any]
    wm_grades: list[Grade | None]
    real_grades: list[Grade | None]
    statuses: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    # ``_NO_REPEATS`` (the default) becomes ``(n,)`` NaN in ``__post_init__``: every stream is an array
    real_repeat: npt.NDArray[Any] = field(default_factory=lambda: _NO_REPEATS)

    def __post_init__(self) -> None:
        if self.real_repeat is _NO_REPEATS:
            self.real_repeat = np.full(len(self.wm), np.nan)
        if len(self.real_repeat) != len(self.wm):
            raise ValueError(f"real_repeat has {len(self.real_repeat)} scores for {len(self.wm)} rollouts")

    @classmethod
    def empty(cls, n: int) -> Scores:
        nan = np.full(n, np.nan)
        return cls(nan.copy(), nan.copy(), nan.copy(), [None] * n, [None] * n)  # real_repeat: (n,) NaN

    def columns(self) -> npt.NDArray[Any]:
        """``(n, 4)``: world-model score, its variance, real score, repeated real score (what an engine
        gathers across ranks)."""
        return np.stack([self.wm, self.wm_variance, self.real, self.real_repeat], axis=1)

    @classmethod
    def concat(cls, parts: Sequence[Scores]) -> Scores:
        """The scores of several flat lists of rollouts, one after the other (every rank's, in rank order)."""
        seconds: dict[str, float] = {}
        for part in parts:
            for name, value in part.seconds.items():
                seconds[name] = seconds.get(name, 0.0) + value
        return cls(
            np.concatenate([p.wm for p in parts]),
            np.concatenate([p.wm_variance for p in parts]),
            np.concatenate([p.real for p in parts]),
            [g for p in parts for g in p.wm_grades],
            [g for p in parts for g in p.real_grades],
            [s for p in parts for s in p.statuses],
            seconds,
            np.concatenate([p.real_repeat for p in parts]),
        )

    def take_real(self, other: Scores) -> None:
        """Adopt ``other``'s real-execution results (an engine that scored the two streams apart)."""
        self.real, self.real_grades, self.real_repeat = other.real, other.real_grades, other.real_repeat
        self.statuses = other.statuses
        for name, value in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + value

    def feedback(self, anchor_rows: Sequence[bool]) -> list[Any]:
        """Per rollout the feedback of the stream that trains it: real for anchor rows, predicted otherwise."""
        return [
            (real.feedback if real is not None else None)
            if is_anchor
            else (wm.feedback if wm is not None else None)
            for is_anchor, wm, real in zip(anchor_rows, self.wm_grades, self.real_grades, strict=True)
        ]


@dataclass
class StepResult:
    """One step through :meth:`RewardPipeline.step`: the correction and the scores behind it.

    ``advantages``, ``rewards``, ``weights``, ``anchor`` and ``metrics`` are the correction's
    (``(n_groups, G)`` arrays, NaN = masked; see :class:`~wmrl.core.corrector.Correction`) of the
    whole step; ``scores`` the whole step's too. ``rows``: the rows of those arrays that are this
    process's groups (every row for a single process; a rank's contiguous share in a data-parallel
    step), so ``advantages[rows]`` is what this process trains on (:attr:`local_advantages`).
    """

    correction: Correction
    plan: Plan
    scores: Scores
    rows: slice = field(default_factory=lambda: slice(None))
    #: earlier steps' groups whose executions landed now, with what they add to this step's update
    #: (asynchronous anchors, :mod:`wmrl.core.late`; empty when synchronous)
    late: list[LateGroups] = field(default_factory=list)

    @property
    def local_advantages(self) -> npt.NDArray[Any]:
        """``(n_local_groups, G)``: the advantages of this process's groups."""
        return cast("npt.NDArray[Any]", self.correction.advantages[self.rows])

    @property
    def advantages(self) -> npt.NDArray[Any]:
        return cast("npt.NDArray[Any]", self.correction.advantages)

    @property
    def rewards(self) -> npt.NDArray[Any]:
        return cast("npt.NDArray[Any]", self.correction.rewards)

    @property
    def weights(self) -> npt.NDArray[Any]:
        return cast("npt.NDArray[Any]", self.correction.weights)

    @property
    def anchor(self) -> npt.NDArray[Any]:
        return cast("npt.NDArray[Any]", self.correction.anchor)

    @property
    def metrics(self) -> dict[str, float | None]:
        return self.correction.metrics


#: ``(entry, its execution pass's Scores) -> (real, repeats)``, the entry's whole step as ``(n_groups, G)``.
Matrices = Callable[[InFlight, "Scores"], tuple[npt.NDArray[Any], npt.NDArray[Any] | None]]


def _add_metrics(into: dict[str, float | None], more: Mapping[str, float | None]) -> None:
    """Sum ``more`` into ``into`` key by key (``None`` stays ``None`` only where nothing is known)."""
    for key, value in more.items():
        if value is None:
            into.setdefault(key, None)
        else:
            into[key] = (into.get(key) or 0.0) + float(value)


def _put(out: Scores, part: Scores, rows: npt.NDArray[Any], real: bool) -> None:
    """Copy one stream of ``part`` (scores of ``items[rows]``) into ``out`` at ``rows``."""
    for k, i in enumerate(rows.tolist()):
        if real:
            out.real[i], out.real_repeat[i] = part.real[k], part.real_repeat[k]
            out.real_grades[i] = part.real_grades[k]
        else:
            out.wm[i], out.wm_variance[i] = part.wm[k], part.wm_variance[k]
            out.wm_grades[i] = part.wm_grades[k]
    if real:
        out.statuses.extend(part.statuses)
    for name, value in part.seconds.items():
        out.seconds[name] = out.seconds.get(name, 0.0) + value


def _nan(value: float | None) -> float:
    return np.nan if value is None else float(value)


class RewardPipeline:
    """Plans, scores, books and corrects one training step; owns the run's correction state.

    Args:
        world_model: the world-model :class:`~wmrl.core.sources.RewardSource` (role ``world_model``).
            Needed unless ``mode`` is ``real`` (see ``world_model_in_real``).
        anchor: the real-execution source (role ``anchor``); needed unless ``mode`` is ``world_model``.
        mode: ``real`` | ``world_model`` | ``wmrl`` (:class:`~wmrl.core.modes.Mode`).
        corrector: a :class:`~wmrl.core.corrector.CorrectorConfig` (the mode's preset is applied on top,
            refusing contradictions) or a built :class:`~wmrl.core.corrector.Corrector` (checked
            against the mode).
        ledger: the run's cost ledger (default: a new CPU-only one).
        world_model_in_real: in ``real`` mode, still let the world model grade every rollout (its
            pairs with real execution are recorded: diagnostics of what ``wmrl`` would have seen; the
            update uses real scores only). Off by default: ``real`` never calls the world model.
        solution_key: ``item -> str | None``, what makes two rollouts "the same solution" (a hash of a
            program, of an action sequence): the execution memory keeps real outcomes by it (a solution
            executed once is graded from memory afterwards, never sent to either source again), the
            fusion measures from it how far the world model's error on a solution persists, and
            per-rollout anchors execute each solution once per step.
        stream_chunks: when the plan reads world-model scores (per-rollout anchors), a step's groups
            are scored by the world model in this many chunks, and each chunk's executions start as
            soon as its scores are in, while the world model scores the next chunk (1: the world model
            scores everything first). Single process only; ranks gather first.

    The anchor source's declared execution noise (its optional ``noise`` attribute, a
    :class:`~wmrl.core.sources.NoiseModel`) reaches the corrector; repeated executions
    (``scheduler.repeat_share``) measure it instead. A repeat calls the anchor source a second time on
    the same items: a source that caches its results must not (or it reports no noise).
    """

    def __init__(
        self,
        world_model: RewardSource | None = None,
        anchor: RewardSource | None = None,
        *,
        mode: Mode | str = Mode.WMRL,
        corrector: CorrectorConfig | Corrector | None = None,
        ledger: CostLedger | None = None,
        world_model_in_real: bool = False,
        solution_key: Callable[[Any], str | None] | None = None,
        stream_chunks: int = 4,
    ) -> None:
        self.mode = Mode.parse(mode)
        if isinstance(corrector, Corrector):
            check_mode(self.mode, corrector.config)
            self.corrector = corrector
        else:
            config = corrector or CorrectorConfig()
            self.corrector = Corrector(resolve_corrector(self.mode, config, defaults=CorrectorConfig()))
        if self.mode is Mode.REAL and not world_model_in_real:
            world_model = None  # real-execution GRPO: the world model is never called
        self._check_sources(world_model, anchor)
        self.world_model = world_model
        self.anchor = anchor if self.mode.executes else None
        self.anchor_noise = declared_noise(self.anchor) if self.anchor is not None else None
        self.ledger = ledger or CostLedger()
        self.solution_key = solution_key
        if isinstance(stream_chunks, bool) or not isinstance(stream_chunks, int) or stream_chunks < 1:
            raise ValueError(f"stream_chunks must be an integer >= 1; got {stream_chunks!r}")
        self.stream_chunks = stream_chunks
        self.asynchrony = self.corrector.config.asynchrony
        if self.asynchrony.enabled and self.mode is Mode.WORLD_MODEL:
            raise ValueError(
                "asynchrony.max_anchor_lag > 0 holds real executions in flight, but mode 'world_model' "
                "executes nothing: set it to 0"
            )
        self.in_flight = AnchorsInFlight(self.asynchrony.workers)

    def _check_sources(self, world_model: Any, anchor: Any) -> None:
        mode = self.mode.value
        if self.mode is Mode.WMRL:
            check_pair(world_model, anchor)
            return
        if self.mode.needs_world_model or world_model is not None:
            problems = (
                check_source(world_model, role=Role.WORLD_MODEL)
                if world_model is not None
                else ["none given"]
            )
            if problems:
                raise SourceError(f"mode {mode!r} needs a world-model reward source: {'; '.join(problems)}")
        if self.mode.executes:
            problems = check_source(anchor, role=Role.ANCHOR) if anchor is not None else ["none given"]
            if problems:
                raise SourceError(
                    f"mode {mode!r} needs a real-execution (anchor) source: {'; '.join(problems)}"
                )

    # -- plan -------------------------------------------------------------------------------------
    def plan(
        self,
        group_keys: Sequence[str],
        task_keys: Sequence[str] | None = None,
        wm_scores: npt.NDArray[Any] | None = None,
        in_flight: int = 0,
        group_size: int | None = None,
        solution_keys: npt.NDArray[Any] | None = None,
        in_flight_keys: frozenset[str] = frozenset(),
    ) -> Plan:
        """Choose this step's executions (see :meth:`Corrector.plan`)."""
        return self.corrector.plan(
            group_keys,
            task_keys,
            wm_scores,
            in_flight,
            group_size,
            solution_keys,
            in_flight_keys=in_flight_keys,
        )

    @property
    def plans_after_scoring(self) -> bool:
        """The active scheduler and per-rollout anchors read world-model scores, so they plan after the
        world model scored."""
        sched = self.corrector.config.scheduler
        return sched.active_share > 0 or sched.rollout_share > 0

    def keys_of(self, items: Sequence[Any]) -> list[str | None] | None:
        """The solution key of each item (``None`` without a ``solution_key`` function)."""
        if self.solution_key is None:
            return None
        return [None if isinstance(item, Exact) else self.solution_key(item) for item in items]

    def known_items(self, items: Sequence[Any]) -> npt.NDArray[Any]:
        """``(n,)`` bool: the items whose solution the execution memory knows (none without a memory or keys)."""
        keys = self.keys_of(items)
        if keys is None or self.corrector.memory is None:
            return np.zeros(len(items), dtype=bool)
        return np.array([k is not None and k in self.corrector.memory for k in keys], dtype=bool)

    def _skipped(
        self, items: Sequence[Any], need_feedback: bool, known: Sequence[bool] | npt.NDArray[Any] | None
    ) -> npt.NDArray[np.bool_]:
        """``(n,)`` bool: the items :meth:`score` sends to no source (see its ``known``)."""
        n = len(items)
        if need_feedback:
            return np.zeros(n, dtype=bool)
        if known is None:
            return self.known_items(items)
        skip = np.asarray(known, dtype=bool)
        if skip.shape != (n,):
            raise ValueError(f"known must have one entry per item ({n}); got shape {skip.shape}")
        return skip

    # -- score ------------------------------------------------------------------------------------
    def score(
        self,
        items: Sequence[Any],
        anchor_rows: Sequence[bool] | npt.NDArray[Any] | None = None,
        *,
        world_model: bool = True,
        anchor: bool = True,
        repeat_rows: Sequence[bool] | npt.NDArray[Any] | None = None,
        need_feedback: bool = False,
        known: Sequence[bool] | npt.NDArray[Any] | None = None,
    ) -> Scores:
        """Grade a flat list of rollouts: the world model every one, real execution the anchor rows.

        The two sources run concurrently (real execution is the slow part; the world model scores
        meanwhile); each call is booked to its ledger stream. ``world_model=False`` / ``anchor=False``
        skip a stream (an engine that must plan between the two).

        Args:
            items: the rollouts; an :class:`~wmrl.core.rollouts.Exact` is never sent to a source.
            anchor_rows: ``(n,)`` bool, the rollouts to execute (``Plan.execute``, flat; default: none).
            repeat_rows: ``(n,)`` bool, executed rollouts to execute a second time (``Plan.repeat``).
            need_feedback: the caller shows each outcome's feedback to the policy (K-turn episodes); the
                execution memory keeps outcomes, not feedback, so nothing is skipped then.
            known: ``(n,)`` bool, the items the execution memory knows, as the caller decided them
                (default: looked up now). An execution submitted off the critical path decides on the
                main thread when it is submitted: the memory may learn more before the worker runs it,
                and what it skips must not depend on when that happens.

        Items whose solution the execution memory knows (:meth:`known_items`) are sent to neither
        source: their scores stay NaN here and :meth:`correct` grades them from the memory.
        """
        n = len(items)
        rows = np.zeros(n, dtype=bool) if anchor_rows is None else np.asarray(anchor_rows, dtype=bool)
        if rows.shape != (n,):
            raise ValueError(f"anchor_rows must have one entry per item ({n}); got shape {rows.shape}")
        out = Scores.empty(n)
        use_wm = world_model and self.world_model is not None
        use_real = anchor and self.anchor is not None
        # Solutions the execution memory knows are graded from it (by the corrector): no source is asked.
        exact = [isinstance(item, Exact) for item in items]
        skip = self._skipped(items, need_feedback, known)
        for i, item in enumerate(items):
            if not exact[i]:
                continue
            exact_grade = Grade(
                item.value, item.status, 0.0 if item.value is not None else None, {}, item.feedback
            )
            if use_wm:
                out.wm[i], out.wm_variance[i], out.wm_grades[i] = _nan(item.value), 0.0, exact_grade
            if use_real and rows[i]:
                out.real[i], out.real_grades[i] = _nan(item.value), exact_grade
                out.statuses.append(item.status)
        wm_rows = [i for i in range(n) if use_wm and not exact[i] and not skip[i]]
        real_rows = [i for i in range(n) if use_real and rows[i] and not exact[i] and not skip[i]]
        # Exact rollouts are free items of both streams: per-item costs (and so the real-mode
        # estimate of the ledger) stay true to the whole mix of rollouts.
        if use_wm and any(exact):
            self.ledger.add("world_model", 0.0, items=sum(exact))
        free_anchor = sum(1 for i in range(n) if use_real and rows[i] and exact[i])
        if free_anchor:
            self.ledger.add("anchor", 0.0, items=free_anchor)

        def grade(source: RewardSource, picked: list[int], stream: str) -> list[Grade]:
            start = time.perf_counter()
            try:
                return collect_grades(source, [items[i] for i in picked])
            finally:
                elapsed = time.perf_counter() - start
                self.ledger.add(stream, elapsed, items=len(picked))
                out.seconds[stream] = out.seconds.get(stream, 0.0) + elapsed

        repeats = np.zeros(n, dtype=bool) if repeat_rows is None else np.asarray(repeat_rows, dtype=bool)
        again_rows = [i for i in real_rows if repeats[i]]

        def execute() -> tuple[list[Grade], list[Grade]]:
            assert self.anchor is not None  # real_rows are chosen only with use_real
            first = grade(self.anchor, real_rows, "anchor") if real_rows else []
            # the second execution of the same items, independently: what it differs by is execution noise
            second = grade(self.anchor, again_rows, "anchor") if again_rows else []
            return first, second

        with ThreadPoolExecutor(max_workers=2) as pool:
            wm_future = None
            if wm_rows:
                assert self.world_model is not None  # wm_rows are chosen only with use_wm
                wm_future = pool.submit(grade, self.world_model, wm_rows, "world_model")
            real_future = pool.submit(execute) if real_rows else None
            wm_grades = wm_future.result() if wm_future else []
            real_grades, repeat_grades = real_future.result() if real_future else ([], [])
        for i, g in zip(again_rows, repeat_grades, strict=True):
            out.real_repeat[i] = _nan(g.value)
        for i, g in zip(wm_rows, wm_grades, strict=True):
            out.wm[i] = _nan(g.value)
            out.wm_variance[i] = _nan(g.variance) if g.value is not None else np.nan
            out.wm_grades[i] = g
        for i, g in zip(real_rows, real_grades, strict=True):
            out.real[i] = _nan(g.value)
            out.real_grades[i] = g
            out.statuses.append(g.status or "unknown")
        return out

    # -- correct ----------------------------------------------------------------------------------
    def correct(
        self,
        plan: Plan,
        wm: npt.NDArray[Any],
        real: npt.NDArray[Any],
        wm_variance: npt.NDArray[Any] | None = None,
        rollouts: int | None = None,
        repeats: npt.NDArray[Any] | None = None,
        solution_keys: npt.NDArray[Any] | None = None,
    ) -> Correction:
        """Calibrate, fuse and form advantages on the whole step's ``(n_groups, G)`` scores.

        Args:
            plan / wm / real / wm_variance: as :meth:`Corrector.correct` takes them.
            rollouts: rollouts this process graded (default: every cell of ``wm``), counted for the
                ledger's real-mode estimate (each rank counts its own; merged ledgers add them up).
            repeats: ``(n_groups, G)`` scores of the second executions (NaN where none).
            solution_keys: ``(n_groups, G)`` solution keys (``None`` = unknown).
        """
        wm = np.asarray(wm, dtype=np.float64)
        variance = None
        if wm_variance is not None:
            wm_variance = np.asarray(wm_variance, dtype=np.float64)
            variance = wm_variance if (~np.isnan(wm_variance)).any() else None
        if repeats is not None:
            repeats = np.asarray(repeats, dtype=np.float64)
            repeats = repeats if (~np.isnan(repeats)).any() else None
        correction = self.corrector.correct(
            plan,
            wm,
            real,
            variance,
            anchor_repeats=repeats,
            anchor_noise=self.anchor_noise,
            solution_keys=solution_keys,
        )
        self.ledger.count_rollouts(wm.size if rollouts is None else rollouts)
        return correction

    def step(
        self,
        groups: Sequence[Group],
        in_flight: int = 0,
        processes: Processes | None = None,
        *,
        drain: bool = False,
        scored: Scores | None = None,
    ) -> StepResult:
        """Plan, score and correct ``groups`` (see the module docstring).

        ``processes``: the ranks of a data-parallel step; ``groups`` are then this rank's share of the
        step, every rank's shares concatenated in rank order make the step's batch, and every rank must
        call this together. Keys, tasks and group sizes are gathered first, so the plan is the whole
        batch's on every rank; each rank grades its own rollouts (the world model all of them, real
        execution the anchor groups' among them) and books them to its own ledger; the scores are
        gathered and every rank corrects the same whole batch. The result's ``rows`` are this rank's.

        With ``asynchrony.max_anchor_lag > 0`` (:mod:`wmrl.core.late`) the step's executions are submitted
        and not awaited, the executions due at this step are consumed first, and the result's ``late``
        holds their groups with what they add to this step's update. ``drain``: wait for every execution
        in flight and run this step's own synchronously (a step that writes a checkpoint).

        ``scored``: the world model's scores of the step's rollouts (flat, in ``groups``' order) when an
        engine graded them already (verl scores in its reward loop, while rollouts finish); the pipeline's
        world model is then not called, and only real execution runs here. Single process only.
        """
        if scored is not None:
            if processes is not None and processes.distributed:
                raise ValueError(
                    "scored= is for a single process: each rank would need the whole step's scores"
                )
            rollouts = sum(len(g.items) for g in groups)
            if len(scored.wm) != rollouts:
                raise ValueError(f"scored has {len(scored.wm)} world-model scores for {rollouts} rollouts")
        if self.asynchrony.enabled:
            if processes is not None and processes.distributed:
                raise ValueError(
                    "asynchrony.max_anchor_lag > 0 is not supported on several processes yet: every rank would "
                    "need the landed groups of its own share; set it to 0"
                )
            return self._step_async(groups, in_flight, drain, scored)
        if processes is not None and processes.distributed:
            return self._step_ranks(groups, in_flight, processes)
        keys, tasks, width, items, cells, solution_keys = self._layout(groups)
        if scored is None and self.plans_after_scoring and self._can_stream():
            scores, plan = self._score_streamed(items, keys, tasks, width, cells, solution_keys, in_flight)
        elif scored is not None or self.plans_after_scoring:
            # the world model grades first (or graded already, ``scored``), then the plan reads its
            # scores where it plans after scoring, then the chosen rollouts are executed
            scores = self.score(items, anchor=False) if scored is None else scored
            wm_matrix = self._matrix(groups, scores.wm, width) if self.plans_after_scoring else None
            plan = self.plan(keys, tasks, wm_matrix, in_flight, width, solution_keys)
            scores.take_real(
                self.score(
                    items,
                    plan.execute_mask(width)[cells],
                    world_model=False,
                    repeat_rows=plan.repeat_mask(width)[cells],
                )
            )
        else:
            plan = self.plan(keys, tasks, None, in_flight, width, solution_keys)
            scores = self.score(
                items, plan.execute_mask(width)[cells], repeat_rows=plan.repeat_mask(width)[cells]
            )
        correction = self.correct(
            plan,
            self._matrix(groups, scores.wm, width),
            self._matrix(groups, scores.real, width),
            self._matrix(groups, scores.wm_variance, width),
            repeats=self._matrix(groups, scores.real_repeat, width),
            solution_keys=solution_keys,
        )
        self.learn(items, scores.real)
        return StepResult(correction, plan, scores)

    def _layout(
        self, groups: Sequence[Group]
    ) -> tuple[list[str], list[str] | None, int, list[Any], npt.NDArray[np.bool_], npt.NDArray[Any] | None]:
        """A single process's step as matrices: ``(group keys, tasks or None, width G, flat items,
        cells, solution keys or None)``; ``cells[i, j]``: group ``i`` has a rollout ``j`` (shorter groups
        are padded), ``solution keys`` an ``(n_groups, G)`` object matrix.

        Raises:
            ValueError: no group, or an empty one.
        """
        if not groups:
            raise ValueError("step() needs at least one group")
        for g in groups:
            if len(g.items) == 0:
                raise ValueError(f"group {g.key!r} is empty: every group needs at least one rollout")
        keys = [g.key for g in groups]
        tasks = None if all(g.task is None for g in groups) else [str(g.task) for g in groups]
        width = max(len(g.items) for g in groups)
        items = [item for g in groups for item in g.items]
        cells = np.zeros((len(groups), width), dtype=bool)
        for i, g in enumerate(groups):
            cells[i, : len(g.items)] = True
        flat_keys = self.keys_of(items)
        solution_keys = None
        if flat_keys is not None:
            solution_keys = np.full((len(groups), width), None, dtype=object)
            solution_keys[cells] = flat_keys
        return keys, tasks, width, items, cells, solution_keys

    def _step_async(
        self, groups: Sequence[Group], in_flight: int, drain: bool, scored: Scores | None = None
    ) -> StepResult:
        """:meth:`step` with executions off the critical path (see :mod:`wmrl.core.late`)."""
        keys, tasks, width, items, cells, solution_keys = self._layout(groups)
        now = self.corrector.step_count
        late, late_metrics = self.land_due(None if drain else now)
        scores = self.score(items, anchor=False) if scored is None else scored
        wm = self._matrix(groups, scores.wm, width)
        plan = self.corrector.plan(
            keys,
            tasks,
            wm if self.plans_after_scoring else None,
            in_flight + self.in_flight.group_equivalents(width),
            width,
            solution_keys,
            in_flight_keys=self.in_flight.solution_keys(),
        )
        execute_rows = plan.execute_mask(width)[cells]
        repeat_rows = plan.repeat_mask(width)[cells]
        known = self.known_items(items)  # now, on this thread: what the worker skips is deterministic

        def execute() -> Scores:
            return self.score(items, execute_rows, world_model=False, repeat_rows=repeat_rows, known=known)

        pending = None
        if drain or not execute_rows.any():
            scores.take_real(execute())
        else:
            pending = self.in_flight.submit(execute)
        wm_variance = self._matrix(groups, scores.wm_variance, width)
        correction = self.correct(
            plan,
            wm,
            self._matrix(groups, scores.real, width),
            wm_variance,
            repeats=self._matrix(groups, scores.real_repeat, width),
            solution_keys=solution_keys,
        )
        if pending is None:
            self.learn(items, scores.real)
        else:
            self.in_flight.add(
                InFlight(
                    step=now,
                    due=now + self.asynchrony.max_anchor_lag,
                    plan=plan,
                    groups=list(groups),
                    items=items,
                    cells=cells,
                    wm=wm,
                    wm_variance=wm_variance,
                    rewards=correction.rewards.copy(),
                    advantages=correction.advantages.copy(),
                    solution_keys=solution_keys,
                    executions=int(execute_rows.sum() + repeat_rows.sum()),
                    future=pending,
                    keys=running_keys(solution_keys, plan.execute_mask(width) & cells),
                )
            )
        late_metrics["async/in_flight_executions"] = float(self.in_flight.executions())
        late_metrics["async/overdue_pending"] = float(len(self.in_flight.overdue))
        correction.metrics.update(late_metrics)
        return StepResult(correction, plan, scores, late=late)

    def land_due(
        self, step: int | None, matrices: Matrices | None = None
    ) -> tuple[list[LateGroups], dict[str, float | None]]:
        """Consume the executions due at ``step`` (every one with ``None``: a drain), waiting for them as
        long as ``asynchrony.overdue_after_s`` allows (a drain waits for everything, the overdue too), and
        the overdue ones that have landed since (calibration only). Returns the late groups and the
        step's ``async/*`` metrics.

        ``matrices``: ``(entry, its execution pass's Scores) -> (real, repeats)`` as ``(n_groups, G)``
        matrices of the entry's whole step (default: the pass's flat scores placed at ``entry.cells``; an
        engine whose ranks execute their own rows gathers them here, on every rank at once).
        """
        metrics: dict[str, float | None] = {
            "async/landed_executions": 0.0,
            "async/landed_pairs": 0.0,
            "async/landed_groups": 0.0,
            "async/late_rollouts": 0.0,
            "async/recorded": 0.0,
            "async/overdue": 0.0,
            "async/overdue_landed": 0.0,
            "async/lag_mean": None,
        }
        late: list[LateGroups] = []
        if step is None:  # a drain waits for the overdue ones too
            for entry in self.in_flight.overdue:
                entry.future.result()
        for entry, result in self.in_flight.landed_overdue():
            self._apply_landing(entry, result, False, matrices)
            metrics["async/overdue_landed"] = (metrics["async/overdue_landed"] or 0.0) + 1.0
        due = self.in_flight.due(step)
        timeout = None if step is None else self.asynchrony.overdue_after_s
        results, waited = self.in_flight.wait(due, timeout)
        if waited > 0 and due:
            self.ledger.add("anchor_wait", waited, items=len(due))
        metrics["async/wait_s"] = waited
        now = self.corrector.step_count
        lags = []
        for entry, result in zip(due, results, strict=True):
            if result is None:
                metrics["async/overdue"] = (metrics["async/overdue"] or 0.0) + 1.0
                continue
            rewards, advantages, more = self._apply_landing(entry, result, True, matrices)
            _add_metrics(metrics, more)
            lags.append(now - entry.step)
            late.append(LateGroups(entry.step, now - entry.step, entry.groups, advantages, rewards))
        metrics["async/lag_mean"] = float(np.mean(lags)) if lags else None
        return late, metrics

    def _apply_landing(
        self, entry: InFlight, result: Scores, gradient: bool, matrices: Matrices | None = None
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any], dict[str, float | None]]:
        """Hand the corrector (and a learning world model) one landed step's executions."""

        def placed(flat: npt.NDArray[Any]) -> npt.NDArray[Any]:
            out = np.full(entry.cells.shape, np.nan)
            out[entry.cells] = flat
            return out

        repeats: npt.NDArray[Any] | None  # a Matrices callable may have no repeats (the corrector takes None)
        if matrices is None:
            real = placed(result.real)
            repeats = placed(result.real_repeat)
        else:
            real, repeats = matrices(entry, result)
        rewards, advantages, metrics = self.corrector.land(
            entry.plan,
            entry.wm,
            real,
            entry.rewards,
            entry.advantages,
            entry.wm_variance if (~np.isnan(entry.wm_variance)).any() else None,
            anchor_repeats=repeats,
            anchor_noise=self.anchor_noise,
            solution_keys=entry.solution_keys,
            gradient=gradient,
        )
        self.learn(entry.items, result.real)  # this process's own executions
        return rewards, advantages, metrics

    def drain(self, matrices: Matrices | None = None) -> dict[str, float | None]:
        """Wait for every execution in flight and use it for calibration and the memory only (a run
        stopped between its checkpoints: their gradient has no step left to go to). Returns metrics."""
        metrics: dict[str, float | None] = {"async/drained": 0.0}
        entries = self.in_flight.due(None) + self.in_flight.overdue
        self.in_flight.overdue = []
        for entry in entries:
            self._apply_landing(entry, entry.future.result(), False, matrices)
            metrics["async/drained"] = (metrics["async/drained"] or 0.0) + 1.0
        return metrics

    def close(self) -> None:
        """Stop the executions' worker thread (after the ones in flight finish)."""
        self.in_flight.close()

    def _can_stream(self) -> bool:
        sched = self.corrector.config.scheduler
        return self.stream_chunks > 1 and sched.active_share == 0 and sched.rollout_share in (0.0, 1.0)

    def _score_streamed(
        self,
        items: Sequence[Any],
        keys: Sequence[str],
        tasks: Sequence[str] | None,
        width: int,
        cells: npt.NDArray[Any],
        solution_keys: npt.NDArray[Any] | None,
        in_flight: int,
    ) -> tuple[Scores, Plan]:
        """Score and plan a step chunk by chunk: each chunk's executions start as soon as its world-model
        scores are in, while the world model scores the next chunk (:class:`~wmrl.core.corrector.PlanStream`
        makes the same plan :meth:`plan` would from the same scores).

        The anchor source is called one batch at a time, in order (sources need not be thread-safe);
        the world model runs beside it.
        """
        n_groups = len(keys)
        stream = self.corrector.plan_stream(keys, tasks, width, solution_keys, in_flight)
        index = np.full((n_groups, width), -1)
        index[cells] = np.arange(len(items))
        out = Scores.empty(len(items))
        out.statuses = []
        sched = self.corrector.scheduler
        pending = []

        def execute(mask: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Scores] | None:
            mask = mask & cells
            if not mask.any():
                return None
            rows = index[mask]
            repeat = sched.select_repeats(stream.step, stream.keys, mask)[mask]
            picked = [items[i] for i in rows]
            return rows, self.score(
                picked, np.ones(len(picked), dtype=bool), world_model=False, repeat_rows=repeat
            )

        with ThreadPoolExecutor(max_workers=1) as anchor_pool:
            pending.append(anchor_pool.submit(execute, stream.anchor_rows()))
            for chunk in np.array_split(np.arange(n_groups), min(self.stream_chunks, n_groups)):
                chunk_cells = np.zeros_like(cells)
                chunk_cells[chunk] = cells[chunk]
                rows = index[chunk_cells]
                part = self.score([items[i] for i in rows], anchor=False)
                _put(out, part, rows, real=False)
                chosen = np.zeros((n_groups, width), dtype=bool)
                for r in chunk.tolist():
                    wm_row = np.full(width, np.nan)
                    wm_row[cells[r]] = out.wm[index[r][cells[r]]]
                    chosen[r] = stream.add(int(r), wm_row)
                pending.append(anchor_pool.submit(execute, chosen))
            for future in pending:
                result = future.result()
                if result is not None:
                    _put(out, result[1], result[0], real=True)
        return out, stream.finish()

    def _step_ranks(self, groups: Sequence[Group], in_flight: int, processes: Processes) -> StepResult:
        """:meth:`step` for this rank's share of a data-parallel step."""
        for g in groups:
            if len(g.items) == 0:
                raise ValueError(f"group {g.key!r} is empty: every group needs at least one rollout")
        items = [item for g in groups for item in g.items]
        mine = (
            [g.key for g in groups],
            [None if g.task is None else str(g.task) for g in groups],
            [len(g.items) for g in groups],
            self.keys_of(items),
        )
        every = processes.all_gather_object(mine)
        keys = [k for part in every for k in part[0]]
        if not keys:
            raise ValueError("step() needs at least one group (on all ranks together)")
        if len(set(keys)) != len(keys):
            raise ValueError(
                "the ranks' groups share keys: each rank must roll out its own share of the step"
            )
        all_tasks = [t for part in every for t in part[1]]
        tasks = None if all(t is None for t in all_tasks) else [str(t) for t in all_tasks]
        sizes = [n for part in every for n in part[2]]
        width = max(sizes)
        cells = np.zeros((len(keys), width), dtype=bool)
        for i, n in enumerate(sizes):
            cells[i, :n] = True
        solution_keys = None
        if self.solution_key is not None:
            solution_keys = np.full((len(keys), width), None, dtype=object)
            solution_keys[cells] = [k for part in every for k in part[3]]
        start = sum(len(part[0]) for part in every[: processes.rank])
        rows = slice(start, start + len(groups))
        own = np.zeros((len(keys), width), dtype=bool)
        own[rows] = cells[rows]
        mine_in_flat = own[cells]  # this rank's rollouts among the step's, flat

        def gathered(part: Scores) -> Scores:
            return Scores.concat(processes.all_gather_object(part))

        def matrix(flat: npt.NDArray[Any]) -> npt.NDArray[Any]:
            out = np.full((len(keys), width), np.nan)
            out[cells] = flat
            return out

        if self.plans_after_scoring:  # the plan reads every rank's world-model scores
            scores = gathered(self.score(items, anchor=False))
            plan = self.plan(keys, tasks, matrix(scores.wm), in_flight, width, solution_keys)
            real = gathered(
                self.score(
                    items,
                    plan.execute_mask(width)[cells][mine_in_flat],
                    world_model=False,
                    repeat_rows=plan.repeat_mask(width)[cells][mine_in_flat],
                )
            )
            scores.take_real(real)
        else:
            plan = self.plan(keys, tasks, None, in_flight, width, solution_keys)
            scores = gathered(
                self.score(
                    items,
                    plan.execute_mask(width)[cells][mine_in_flat],
                    repeat_rows=plan.repeat_mask(width)[cells][mine_in_flat],
                )
            )
        correction = self.correct(
            plan,
            matrix(scores.wm),
            matrix(scores.real),
            matrix(scores.wm_variance),
            rollouts=len(items),
            repeats=matrix(scores.real_repeat),
            solution_keys=solution_keys,
        )
        mine = np.asarray(scores.real)[mine_in_flat]  # each rank teaches its own source its own rollouts
        self.learn(items, mine)
        return StepResult(correction, plan, scores, rows)

    @staticmethod
    def _matrix(groups: Sequence[Group], flat: npt.NDArray[Any], width: int) -> npt.NDArray[Any]:
        """Flat per-rollout values as ``(n_groups, width)``, NaN-padded for shorter groups."""
        out = np.full((len(groups), width), np.nan)
        cursor = 0
        for i, g in enumerate(groups):
            out[i, : len(g.items)] = flat[cursor : cursor + len(g.items)]
            cursor += len(g.items)
        return out

    def learn(self, items: Sequence[Any], real: Sequence[float] | npt.NDArray[np.float64]) -> None:
        """Hand the world-model source the real outcomes of the rollouts executed (``real``, NaN where
        not executed or unknown), when it learns from them (an optional ``learn(items, values)``, as
        :class:`~wmrl.core.surrogate.SurrogateSource` and :class:`~wmrl.core.surrogate.FusedWorldModel`
        have)."""
        if self.world_model is None or not callable(getattr(self.world_model, "learn", None)):
            return
        values = np.asarray(real, dtype=float)
        done = [i for i in range(len(items)) if not np.isnan(values[i]) and not isinstance(items[i], Exact)]
        if done:
            learn_from(self.world_model, [items[i] for i in done], [float(values[i]) for i in done])

    # -- checkpoint -------------------------------------------------------------------------------
    def save(
        self, folder: str | os.PathLike[str], ledger_states: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Write the corrector's state and the ledger into a checkpoint ``folder``.

        ``ledger_states``: every rank's ledger (``CostLedger.state_dict``) of a multi-process run, in rank
        order (default: this process's); they are kept apart so a resume with the same number of ranks
        gives each rank back its own costs.
        """
        if self.in_flight.pending or self.in_flight.overdue:
            raise RuntimeError(
                "a checkpoint cannot hold real executions in flight: drain them first (step(..., drain=True) "
                "or drain())"
            )
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.corrector.save(folder / CORRECTOR_FILE)
        ranks = list(ledger_states) if ledger_states is not None else [self.ledger.state_dict()]
        tmp = folder / (LEDGER_FILE + ".tmp")
        tmp.write_text(json.dumps({"ranks": ranks}))
        tmp.replace(folder / LEDGER_FILE)  # atomic: never a truncated ledger
        if self._world_model_has_state():
            tmp = folder / (WORLD_MODEL_FILE + ".tmp")
            tmp.write_text(json.dumps(self.world_model.state_dict()))  # type: ignore[union-attr]
            tmp.replace(folder / WORLD_MODEL_FILE)

    def _world_model_has_state(self) -> bool:
        """Whether the world model holds what it learned from the run (``state_dict`` and ``load_state_dict``)."""
        return all(callable(getattr(self.world_model, m, None)) for m in ("state_dict", "load_state_dict"))

    def load(self, folder: str | os.PathLike[str], rank: int = 0, world: int = 1) -> None:
        """Restore the corrector and this rank's ledger from a checkpoint ``folder`` written by :meth:`save`.

        With a different number of ranks than at saving, rank 0 takes the saved total and the others
        start from zero, so the run-wide sum stays right.

        Raises:
            FileNotFoundError: the folder holds no correction state (it was not written by WMRL), no
                ledger (the costs spent before it would be lost from the cost report), or no state of a
                world model that learns from the run (what it learned would be lost).
            ValueError: the saved corrector was configured differently from this run's.
        """
        folder = Path(folder)
        path = folder / CORRECTOR_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"checkpoint {folder} has no {CORRECTOR_FILE}: it was not written by a WMRL trainer, so the "
                "correction (calibration map, fusion estimates, anchor counts) cannot be restored"
            )
        restored = Corrector.load(path)
        if restored.config != self.corrector.config:
            raise ValueError(
                f"the corrector saved in {folder} was configured differently from this run's; resume with "
                "the same corrector configuration and mode"
            )
        self.corrector.load_state_dict(restored.state_dict())
        ledger_path = folder / LEDGER_FILE
        if not ledger_path.exists():
            # Without it, the resumed run's cost report would book only the steps after the checkpoint.
            raise FileNotFoundError(
                2, f"no {LEDGER_FILE}: the costs spent before this checkpoint are unknown", str(ledger_path)
            )
        ranks = json.loads(ledger_path.read_text())["ranks"]
        if len(ranks) == world:
            own = dict(ranks[rank])
        elif rank == 0:
            own = CostLedger.merged(ranks).state_dict()
        else:
            own = CostLedger().state_dict()
        own["accelerators"] = dict(self.ledger.accelerators)  # what this process holds now
        self.ledger.load_state_dict(own)
        if self._world_model_has_state():
            state_path = folder / WORLD_MODEL_FILE
            if not state_path.exists():
                raise FileNotFoundError(
                    2,
                    f"no {WORLD_MODEL_FILE}: this run's world model learns from the run, and the checkpoint "
                    "holds nothing it learned (it was written by a run whose world model did not learn)",
                    str(state_path),
                )
            self.world_model.load_state_dict(json.loads(state_path.read_text()))  # type: ignore[union-attr]

    # -- report -----------------------------------------------------------------------------------
    def cost_report(
        self,
        *,
        steps: int,
        ledger: CostLedger | None = None,
        processes: int = 1,
        device: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The run's ``cost_report.json``: one layout in every domain and engine.

        Keys: ``spent`` / ``total`` / ``graded_rollouts`` / ``real_mode_estimate`` / ``note`` (the
        ledger's :meth:`~wmrl.core.ledger.CostLedger.report`), ``mode``, ``steps``, ``per_item_s``
        (wall seconds per item and stream, ``None`` where nothing was graded), ``accelerators_held``,
        ``processes``, ``device`` and ``details`` (what the domain adds, e.g. how to read the
        accounting there).

        ``ledger``: the whole run's ledger (a multi-process run's merged one; default: this one).
        """
        ledger = ledger or self.ledger
        report: dict[str, Any] = ledger.report()
        report.update(
            mode=self.mode.value,
            steps=int(steps),
            per_item_s={
                name: (c["wall_s"] / c["items"] if c["items"] else None)
                for name, c in report["spent"].items()
            },
            accelerators_held=dict(ledger.accelerators),
            processes=int(processes),
            device=device,
            details=dict(details or {}),
        )
        return report
