"""Subcommands of the ``wmrl`` command contributed by ``wmrl.embodied``.

``register`` must import only the standard library and ``wmrl.core``; heavy imports go inside handlers.
"""

from __future__ import annotations


def register(root) -> None:
    """Add this package's commands to the ``wmrl`` command tree (see ``wmrl.core.cli.CommandRoot``)."""
