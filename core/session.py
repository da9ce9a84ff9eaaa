"""A training run's life in its directory, the same for every engine (the loop trainer, TRL).

:class:`RunSession` owns what happens around the steps: it opens the run directory (a new run, a
resumed one, or one restarted from step 0; :class:`~wmrl.core.rundir.RunDirectory`), keeps the
writer of ``metrics.jsonl`` and ``config.json`` (the main process's; other ranks get a silent one),
turns a stop into one line that says what was kept and how to continue, books the wall time of
every attempt of a run that is continued later, and at the end writes ``cost_report.json``, the
plots and ``run_summary.json``::

    session = RunSession(run_dir, config, main=is_main)
    writer = session.open()
    with session.running(steps_done=lambda: trainer.step, last_saved=lambda: trainer.saved):
        ...train...
    if stopped_early:
        session.stopped(step)                      # raises Interrupted, after booking the wall time
    summary = session.finish(report, steps=step, plots=draw, summary={...})

``run_summary.json`` holds ``wall_s`` (this attempt), ``wall_s_total`` (with the earlier attempts
it continues), ``steps`` and what the engine adds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from wmrl.core.errors import Interrupted
from wmrl.core.rundir import RunDirectory, add_attempt_wall, earlier_wall_s
from wmrl.core.runlog import RunWriter, write_json_atomic

__all__ = ["RunSession", "SilentWriter"]


class SilentWriter:
    """The writer of a process that is not the main one: the main process writes the run."""

    def log(self, step: int, metrics: Any) -> None:
        pass

    def write_json(self, name: str, data: Any) -> None:
        pass

    def close(self) -> None:
        pass


class RunSession:
    """The run's life around its steps (see the module docstring).

    Args:
        run_dir: the run directory (fresh, resumed or restarted).
        config: the resolved config (written as ``config.json``; its ``logging.plots`` is honoured).
        main: whether this process writes the run (rank 0; the only process of a single run).
    """

    def __init__(self, run_dir: RunDirectory, config: Any, *, main: bool = True) -> None:
        self.run_dir = run_dir
        self.config = config
        self.main = main
        self.started = time.perf_counter()
        self.writer: RunWriter | SilentWriter = SilentWriter()

    @property
    def path(self) -> Path:
        return self.run_dir.path

    def open(
        self, report_to: Sequence[str] = (), on_fresh_start: Callable[[], None] | None = None
    ) -> RunWriter | SilentWriter:
        """:meth:`open_directory` then :meth:`open_writer`; returns the writer."""
        self.open_directory(on_fresh_start)
        return self.open_writer(report_to)

    def open_directory(self, on_fresh_start: Callable[[], None] | None = None) -> None:
        """Create (or continue) the run directory (main process).

        ``on_fresh_start``: run by the main process when the run starts from step 0, to remove what a
        stopped attempt of it left that is not part of the run (an engine's own side files).
        """
        if self.main:
            self.run_dir.open()
            if self.run_dir.checkpoint is None and on_fresh_start is not None:
                on_fresh_start()

    def open_writer(self, report_to: Sequence[str] = ()) -> RunWriter | SilentWriter:
        """The writer of ``metrics.jsonl`` and ``config.json`` (main process; a silent one elsewhere).

        ``report_to``: the trackers it reports to (an engine that reports to them itself, like TRL,
        gives none). Open it after a resumed run's log was cut back to its checkpoint.
        """
        if self.main:
            self.writer = RunWriter(self.run_dir.path, self.config, report_to=report_to)
        return self.writer

    def close(self) -> None:
        self.writer.close()

    @contextlib.contextmanager
    def running(
        self, steps_done: Callable[[], int], last_saved: Callable[[], int | None] = lambda: None
    ) -> Iterator[None]:
        """Around the training: a second Ctrl-C (``KeyboardInterrupt``) or an error ends the run with
        what was kept said in one line; a run that completed no step leaves no folder behind.

        Args:
            steps_done: steps completed by *this* attempt so far.
            last_saved: the step of the run's newest checkpoint, this attempt's or the one it resumed
                from (``None``: there is none).
        """
        try:
            yield
        except KeyboardInterrupt:
            self.close()
            if steps_done() == 0 and self.main and self.run_dir.abandon():
                raise Interrupted("interrupted before the first step completed; nothing was kept") from None
            self._book_wall()
            saved = last_saved()
            if saved:
                raise Interrupted(
                    f"interrupted; the checkpoint of step {saved} is kept; continue with: {self.run_dir.resume_hint}"
                ) from None
            raise Interrupted(
                "interrupted before any checkpoint was written: nothing to continue from "
                f"({self.run_dir.resume_hint} restarts the run from step 0)"
            ) from None
        except BaseException:
            self.close()
            if steps_done() == 0 and self.main:
                self.run_dir.abandon()  # nothing was done: leave no run folder behind
            self._book_wall()
            raise

    def stopped(self, step: int) -> NoReturn:
        """End a run stopped after a checkpoint (the first Ctrl-C): book the attempt, say how to continue."""
        self.close()
        self._book_wall()
        raise Interrupted(
            f"stopped after step {step}; checkpoint saved; continue with: {self.run_dir.resume_hint}"
        )

    def finish(
        self,
        report: Mapping[str, Any],
        *,
        steps: int,
        plots: Callable[[], object] | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Write ``cost_report.json``, the plots and ``run_summary.json`` (main process), close the
        writer; return the summary."""
        wall = time.perf_counter() - self.started
        out: dict[str, Any] = {
            "wall_s": wall,
            # this attempt and the earlier ones it continues (resumed from their checkpoints)
            "wall_s_total": earlier_wall_s(self.run_dir.path) + wall if self.main else wall,
            "steps": int(steps),
            **dict(summary or {}),
        }
        if self.main:
            self.writer.write_json("cost_report.json", dict(report))
            if plots is not None and self.config.logging.plots:
                plots()
            write_json_atomic(self.run_dir.path / "run_summary.json", out)
        self.close()
        return out

    def _book_wall(self) -> None:
        if self.main and self.run_dir.path.is_dir():
            add_attempt_wall(self.run_dir.path, time.perf_counter() - self.started)
