"""The ``wmrl`` console command.

Core owns the top-level parser, the ``bench`` commands and the *shape* of every training and
evaluation command. A domain package (``wmrl.autoresearch``, ``wmrl.embodied``, or a third party's)
adds its commands through the ``wmrl.cli`` entry-point group, so core never imports it: each entry
point is a ``register(root)`` function that receives a :class:`CommandRoot` and calls

* ``root.train(NAME, help, config=..., run=...)``: ``wmrl train NAME`` with the shared flags
  (``--config``, ``--out``, ``--resume``, ``--resume-from``, ``--print-config``, ``--no-progress``,
  ``key=value`` overrides; see :mod:`wmrl.core.cli_runs`);
* ``root.evaluate(NAME, help, config=..., run=...)``: ``wmrl eval NAME`` with the same flags;
* ``root.domain(NAME, help)``: a command group for the domain's own verbs (``wmrl autoresearch grade``).

Register functions must import only the standard library and ``wmrl.core``; configs and runs are
named as ``"module:attribute"`` strings and imported when the command runs (``--help`` imports the
config class only, to list its keys), so ``wmrl --help`` is fast and works on a base install.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Generator, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, ClassVar

Handler = Callable[[argparse.Namespace], int | None]

__all__ = ["CommandRoot", "build_parser", "main"]


class _Formatter(argparse.HelpFormatter):
    """Hides the aliases registered with ``help=argparse.SUPPRESS`` from command listings."""

    def _iter_indented_subactions(self, action: argparse.Action) -> Generator[argparse.Action, None, None]:
        for sub in super()._iter_indented_subactions(action):
            if sub.help != argparse.SUPPRESS:
                yield sub


class _Parser(argparse.ArgumentParser):
    """An argument parser whose help can end with text computed only when help is shown."""

    def __init__(self, *args: Any, late_epilog: Callable[[], str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.late_epilog = late_epilog

    def format_help(self) -> str:
        text = super().format_help()
        hidden = self._hidden_commands()
        if hidden:
            text += f"\nalso: {', '.join(hidden)} (short forms or aliases of the commands above; each has --help)\n"
        if self.late_epilog is not None:
            text += "\n" + self.late_epilog() + "\n"
        return text

    def _hidden_commands(self) -> list[str]:
        """The sub-commands kept out of the listing (aliases), so the help still names them."""
        names: list[str] = []
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                listed = {a.dest for a in action._choices_actions if a.help != argparse.SUPPRESS}
                names += [name for name in action.choices if name not in listed]
        return names


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


class CommandRoot:
    """The command tree a plugin extends (see the module docstring)."""

    GROUP_HELP: ClassVar[dict[str, str]] = {
        "train": "train a policy with world-model rewards (wmrl train DOMAIN --help lists its settings)",
        "eval": "evaluate a trained policy",
        "bench": "measure the method and its overhead",
    }

    def __init__(self, parser: argparse.ArgumentParser, path: str = "wmrl") -> None:
        self.parser = parser
        self.path = path
        self._top = parser.add_subparsers(dest=f"{path}_command", metavar="COMMAND", parser_class=_Parser)
        self._groups: dict[str, argparse._SubParsersAction[_Parser]] = {}
        self._domains: dict[str, CommandRoot] = {}

    def command(
        self, name: str, help: str, handler: Handler, hidden: bool = False
    ) -> argparse.ArgumentParser:
        """A command of its own (``wmrl NAME``); ``hidden`` keeps an alias out of the listing."""
        sub = self._top.add_parser(name, help=argparse.SUPPRESS if hidden else help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    def group(
        self, name: str, help: str | None = None, hidden: bool = False
    ) -> argparse._SubParsersAction[_Parser]:
        """The sub-command set of a shared verb (``wmrl train ...``, ``wmrl eval ...``)."""
        if name not in self._groups:
            text = help or self.GROUP_HELP.get(name, name)
            parent = self._top.add_parser(name, help=argparse.SUPPRESS if hidden else text, description=text)
            parent.set_defaults(handler=lambda _args, p=parent: _print_help(p))
            self._groups[name] = parent.add_subparsers(
                dest=f"{self.path}_{name}_target", metavar="TARGET", parser_class=_Parser
            )
        return self._groups[name]

    def subcommand(self, group: str, name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        sub = self.group(group).add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    def domain(self, name: str, help: str) -> CommandRoot:
        """The command group of a domain's own verbs: ``wmrl NAME VERB``."""
        if name not in self._domains:
            parent = self._top.add_parser(name, help=help, description=help)
            parent.set_defaults(handler=lambda _args, p=parent: _print_help(p))
            self._domains[name] = CommandRoot(parent, path=f"{self.path}_{name}")
        return self._domains[name]

    def train(self, name: str, help: str, **options: Any) -> argparse.ArgumentParser:
        """``wmrl train NAME``; ``options`` as :func:`wmrl.core.cli_runs.add_train_command` takes them."""
        from wmrl.core.cli_runs import add_train_command

        parser: argparse.ArgumentParser = add_train_command(self, name, help, **options)
        return parser

    def evaluate(self, name: str, help: str, **options: Any) -> argparse.ArgumentParser:
        """``wmrl eval NAME``; ``options`` as :func:`wmrl.core.cli_runs.add_eval_command` takes them."""
        from wmrl.core.cli_runs import add_eval_command

        parser: argparse.ArgumentParser = add_eval_command(self, name, help, **options)
        return parser


def _version() -> str:
    try:
        return version("wmrl")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="wmrl",
        description="Reinforcement learning with world-model rewards, anchored by real execution.",
    )
    parser.add_argument("--version", action="version", version=f"wmrl {_version()}")
    root = CommandRoot(parser)
    from wmrl.core.bench.cli import register as register_bench

    root.group("train")
    root.group("eval")
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
    from wmrl.core.log import configure_cli

    configure_cli()  # one logging path: progress lines and warnings, to standard output
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
