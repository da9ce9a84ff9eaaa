"""One rank's failure stops every rank, instead of leaving the others blocked in the next collective.

Several TRL processes meet in collectives (``gather``, ``gather_object``) after work each does alone:
scoring its own rows, waiting for its own anchor executions. If that work raises on one rank, that
rank leaves while the others wait in the collective for it, until the process group's timeout
(30 minutes for gloo, longer with NCCL), and the run looks hung. :func:`fail_together` runs the work,
then every rank reports success or its error in one ``gather_object``; the failing rank re-raises its
own exception, and every other rank raises :class:`PeerRankFailed` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["PeerRankFailed", "fail_together"]

T = TypeVar("T")


class PeerRankFailed(RuntimeError):
    """Another rank's local work raised; this rank stops with it."""


def fail_together(work: Callable[[], T], processes: int, what: str) -> T:
    """Run this rank's ``work`` and agree with every rank that none failed.

    Args:
        work: this rank's part (it must not itself enter a collective).
        processes: the number of processes (1: ``work`` runs plainly, no collective).
        what: what the work is, for the error (``"an anchor execution"``).

    Returns:
        ``work()``'s result when no rank failed.

    Raises:
        Exception: ``work``'s own exception, on the rank where it was raised.
        PeerRankFailed: on every other rank, naming the failed ranks and their errors.
    """
    if processes <= 1:
        return work()
    from accelerate.utils import gather_object

    error: BaseException | None = None
    result: T | None = None
    try:
        result = work()
    except Exception as exc:  # every rank must reach the gather below, whatever the failure
        error = exc
    report = None if error is None else f"{type(error).__name__}: {error}"
    reports = gather_object([report])
    if error is not None:
        raise error
    failed = [(rank, text) for rank, text in enumerate(reports) if text is not None]
    if failed:
        named = "; ".join(f"rank {rank}: {text}" for rank, text in failed)
        raise PeerRankFailed(f"{what} failed on another rank ({named}); every rank stops")
    return result  # type: ignore[return-value]
