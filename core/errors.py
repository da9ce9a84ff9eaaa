"""Errors the ``wmrl`` command reports as one line (exit code 2), and the end of an interrupted run.

A domain raises :class:`UserError` (or a subclass: a missing model, an unreadable task, a sandbox
that cannot run here) for a problem in the user's input or machine that no traceback would help
with. :class:`Interrupted` ends a run that was stopped with Ctrl-C after it saved what it could.
"""

from __future__ import annotations

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "Interrupted", "UserError"]

#: Exit status of a command that was given something it cannot use.
EXIT_USAGE = 2
#: Exit status of a command stopped with Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A problem with the user's input or environment; the message says what to do instead."""


class Interrupted(Exception):
    """A run was stopped (Ctrl-C); the message says what was kept and how to continue."""
