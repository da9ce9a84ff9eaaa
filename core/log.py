"""One logging path: every progress line and every warning of WMRL goes through the ``wmrl`` logger.

Library code calls :func:`progress` (or takes a ``log`` callable that defaults to it) for the lines a
person follows a run by (``[wmrl] policy loaded in 0.5 s``), and ``logging.getLogger("wmrl....")``
for warnings. The ``wmrl`` command routes the ``wmrl`` logger to standard output, one line per
message (:func:`configure_cli`); a program that configures ``logging`` itself gets the lines where
it sends them. With no handler configured anywhere, a progress line is printed, so it is never lost.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_cli", "logger", "progress"]

logger = logging.getLogger("wmrl")


def progress(message: str) -> None:
    """A progress line of the run (INFO on the ``wmrl`` logger; printed when nothing handles it)."""
    if logger.hasHandlers():
        logger.info(message)
    else:
        print(message, flush=True)


def configure_cli(level: int = logging.INFO) -> None:
    """The command's routing: the ``wmrl`` logger's lines to standard output as they are (once)."""
    if any(getattr(h, "_wmrl_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler._wmrl_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
