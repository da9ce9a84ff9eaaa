"""The ``wmrl`` console command.

Core owns the top-level parser and the ``bench`` commands. The domain packages
(``wmrl.autoresearch``, ``wmrl.embodied``) add their own subcommands through the ``wmrl.cli``
entry-point group, so core never imports them: each entry point is a ``register(root)``
function that receives a :class:`CommandRoot`. Register functions must import only the
standard library and ``wmrl.core``; heavy imports belong inside the command handlers, so that
``wmrl --help`` is fast and works on a base install.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import ClassVar

Handler = Callable[[argparse.Namespace], int | None]


class CommandRoot:
    """The command tree a plugin extends.

    ``command(name)`` adds a top-level command (``wmrl grade``); ``group(name)`` returns the
    sub-command set of a shared verb (``wmrl train autoresearch``, ``wmrl eval libero``).
    """

    GROUP_HELP: ClassVar[dict[str, str]] = {
        "train": "train a policy with world-model rewards",
        "eval": "evaluate a trained policy",
        "bench": "measure the method and its overhead",
    }

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        self._top = parser.add_subparsers(dest="command", metavar="COMMAND")
        self._groups: dict[str, argparse._SubParsersAction] = {}

    def command(self, name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        sub = self._top.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    def group(self, name: str, help: str | None = None) -> argparse._SubParsersAction:
        if name not in self._groups:
            text = help or self.GROUP_HELP.get(name, name)
            parent = self._top.add_parser(name, help=text, description=text)
            parent.set_defaults(handler=lambda _args, p=parent: _print_help(p))
            self._groups[name] = parent.add_subparsers(dest=f"{name}_target", metavar="TARGET")
        return self._groups[name]

    def subcommand(self, group: str, name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        sub = self.group(group).add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wmrl",
        description="Reinforcement learning with world-model rewards, anchored by real execution.",
    )
    root = CommandRoot(parser)
    from wmrl.core.bench.cli import register as register_bench

    register_bench(root)
    for entry in sorted(entry_points(group="wmrl.cli"), key=lambda e: e.name):
        # A broken plugin of our own must fail loudly, not vanish from --help.
        entry.load()(root)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        result = handler(args)
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error of ours. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
