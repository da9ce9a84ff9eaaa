"""Ctrl-C during training: finish the step in progress, save a checkpoint, stop.

A training step changes the policy, the optimiser and the correction together; stopping in the
middle of one would leave them out of step with each other. :class:`GracefulStop` turns the first
Ctrl-C (SIGINT) into a request the trainer reads between steps (it then checkpoints and raises
:class:`~wmrl.core.errors.Interrupted`); a second Ctrl-C stops at once (nothing past the last
checkpoint is kept). Outside the main thread, or when disabled, it does nothing.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["GracefulStop"]


class GracefulStop:
    """Context manager: ``requested`` becomes true at the first Ctrl-C; the second raises ``KeyboardInterrupt``.

    Args:
        message: printed (to stderr) at the first Ctrl-C.
    """

    def __init__(
        self, message: str = "stopping after this step and saving a checkpoint (Ctrl-C again to stop now)"
    ) -> None:
        self.message = message
        self.requested = False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n[wmrl] {self.message}", file=sys.stderr, flush=True)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(
                signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler
            )
            self._installed = False
