"""``wmrl train DOMAIN`` and ``wmrl eval DOMAIN``: one set of flags and one behaviour for every domain.

Flags of both: ``--config FILE|PRESET`` (YAML, JSON or TOML; a run's ``config.json`` works),
``key=value`` overrides (``tasks.ids=[a,b]`` needs no quoting; a typo gets a "did you mean"),
``--out DIR``, ``--resume``, ``--resume-from CHECKPOINT`` (eval: ``--resume`` continues an
interrupted evaluation), ``--print-config`` (the config *after* mode resolution as YAML, each key
with its documentation and default: exactly what would run; ``--json`` for JSON) and
``--no-progress``. ``--help`` lists every key.

Errors in what the user gave (a config that does not parse, an unknown key, a folder that cannot be
written, a missing model) are one line on stderr and exit code 2, no traceback. Ctrl-C ends a run
with exit code 130 after the run saved what it could (:class:`~wmrl.core.errors.Interrupted` says
what and how to continue).

What a domain supplies (named as ``"module:attribute"``, imported only when the command runs):

* train: a config class (a frozen dataclass, usually extending
  :class:`~wmrl.core.train_config.TrainConfigBase`), optional presets (name -> settings), and
  ``run(config, run_dir, *, progress) -> lines`` taking a :class:`~wmrl.core.rundir.RunDirectory`
  and returning the summary lines to print;
* eval: a config class and ``run(config, out, *, resume, progress) -> (report, lines)``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wmrl.core.config import ConfigError, load_config, to_dict
from wmrl.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, Interrupted, UserError

if TYPE_CHECKING:
    from wmrl.core.cli import CommandRoot

__all__ = ["USER_ERRORS", "add_eval_command", "add_train_command", "load_object"]

#: Exceptions that are the user's to fix: printed as one line with exit code 2.
USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError,
    ConfigError,
    FileExistsError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


def load_object(path: str) -> Any:
    """The object named ``"package.module:attribute"``."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return EXIT_USAGE


def _key_help(config: str) -> str:
    from wmrl.core.config_docs import key_listing

    cls = load_object(config)
    listing: str = key_listing(cls)
    return "settings (key=value; --print-config shows the resolved values):\n" + listing


def _presets_help(presets: str | None) -> str:
    """The names ``--config`` and ``corrector_preset=`` take, for the help's end."""
    from wmrl.core.corrector import PRESETS

    lines = []
    if presets:
        lines.append(f"--config presets: {', '.join(sorted(load_object(presets)))}")
    corrector = sorted(p for p in PRESETS if p not in ("real", "world_model"))
    lines.append("corrector presets (corrector_preset=NAME; docs/method.md): " + ", ".join(corrector) + "\n")
    return "\n".join(lines) + "\n"


def _common_flags(
    sub: argparse.ArgumentParser, what: str, overrides: str = "config overrides, e.g. steps=5 mode=real"
) -> None:
    sub.add_argument(
        "--config",
        metavar="FILE|PRESET",
        help="a .yaml/.json/.toml config (a run's config.json works) or a preset",
    )
    sub.add_argument("--out", metavar="DIR", help=f"the {what} directory")
    sub.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (what would run) as YAML with each key's documentation, and exit "
        "(with --json: as JSON)",
    )
    sub.add_argument("--no-progress", action="store_true", help="hide progress bars")
    sub.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=overrides)


def _print_config(config: Any, fmt: str, title: str) -> int:
    if fmt == "json":
        print(json.dumps(to_dict(config), indent=2, default=str))
    else:
        from wmrl.core.config_docs import annotated_yaml

        print(annotated_yaml(config, header=title), end="")
    return 0


# ------------------------------------------------------------------------------------------- train


def add_train_command(
    root: CommandRoot,
    name: str,
    help: str,
    *,
    config: str,
    run: str,
    presets: str | None = None,
    default_out: str | None = None,
    preset_flags: Mapping[str, tuple[str, str]] | None = None,
    stage: bool = False,
) -> argparse.ArgumentParser:
    """Register ``wmrl train NAME`` (see the module docstring).

    ``preset_flags``: ``{"--smoke": ("smoke", "help")}``, switches that mean ``--config PRESET``.
    ``stage``: the trainer is a stage without a correction (supervised fine-tuning): its checkpoints
    are complete when they hold ``wmrl_stage.json`` (:func:`~wmrl.core.rundir.write_stage_marker`),
    not the correction's state (:class:`~wmrl.core.rundir.RunDirectory`'s ``marker``).
    """
    prog = f"wmrl train {name}"
    sub: argparse.ArgumentParser = root.group("train").add_parser(
        name, help=help, description=help, late_epilog=lambda: _presets_help(presets) + _key_help(config)
    )
    _common_flags(sub, "run")
    sub.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    sub.add_argument("--resume-from", metavar="CHECKPOINT", help="continue from this checkpoint folder")
    sub.add_argument("--json", action="store_true", help="with --print-config: print JSON")
    for flag, (preset, text) in (preset_flags or {}).items():
        sub.add_argument(flag, dest="preset_flag", action="append_const", const=preset, help=text)
    out_pattern = default_out or f"runs/{name}-{{time}}"

    def handler(args: argparse.Namespace) -> int:
        return _train(args, prog, config, run, presets, out_pattern, stage)

    sub.set_defaults(handler=handler)
    return sub


def _train(
    args: argparse.Namespace,
    prog: str,
    config_path: str,
    run_path: str,
    presets: str | None,
    out_pattern: str,
    stage: bool = False,
) -> int:
    from wmrl.core.rundir import STAGE_FILE, RunDirectory

    out = args.out
    if args.resume_from and not out:
        out = str(Path(args.resume_from).resolve().parent.parent)  # RUN/checkpoints/checkpoint-N
    if args.resume and not out:
        return _fail(prog, "--resume needs --out (the run directory to continue)")
    source: Any = args.config
    chosen = getattr(args, "preset_flag", None) or []
    if chosen:
        if len(set(chosen)) > 1 or (source is not None and source not in chosen):
            return _fail(prog, "give one preset switch or --config, not both")
        source = chosen[0]
    if source is None and (args.resume or args.resume_from) and (Path(out) / "config.json").is_file():
        source = Path(out) / "config.json"  # continue with the run's own settings (overrides on top)
    try:
        cls = load_object(config_path)
        config = load_config(cls, source, args.overrides, load_object(presets) if presets else None)
    except ConfigError as err:
        return _fail(prog, f"invalid config: {err}")
    if args.print_config:
        return _print_config(
            config, "json" if args.json else "yaml", f"{prog}: the resolved configuration (what runs)"
        )
    if not out and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # the default name holds the time, which the ranks would each read differently
        return _fail(
            prog, "a run on several processes (torchrun) needs --out: every rank must use the same folder"
        )
    out = out or out_pattern.format(time=time.strftime("%Y%m%d-%H%M%S"), mode=getattr(config, "mode", "run"))
    try:
        marker = {"marker": STAGE_FILE} if stage else {}
        run_dir = RunDirectory(
            Path(out), resume=args.resume, resume_from=args.resume_from, command=prog, **marker
        )
        if run_dir.notice:
            print(f"{prog}: {run_dir.notice}", file=sys.stderr)
        lines = load_object(run_path)(config, run_dir, progress=not args.no_progress)
    except Interrupted as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as err:
        return _fail(prog, str(err))
    for line in lines or ():
        print(line)
    return 0


# -------------------------------------------------------------------------------------------- eval


def add_eval_command(
    root: CommandRoot,
    name: str,
    help: str,
    *,
    config: str,
    run: str,
    shorthands: Mapping[str, tuple[str, str]] | None = None,
    default_out: str | None = None,
    aliases: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """Register ``wmrl eval NAME`` (and hidden ``aliases``).

    ``shorthands``: ``{"--model": ("model", "help")}``, flags that set one config key (``--model P``
    is ``model=P``), for the settings given on every call.
    """
    prog = f"wmrl eval {name}"
    out_pattern = default_out or f"runs/eval-{name}-{{time}}"
    parsers: list[argparse.ArgumentParser] = []
    for alias in (name, *aliases):
        sub = root.group("eval").add_parser(
            alias,
            help=help if alias == name else argparse.SUPPRESS,
            description=help,
            late_epilog=lambda: _key_help(config),
        )
        _common_flags(sub, "evaluation", overrides="config overrides: any key listed at the end of this help")
        sub.add_argument("--resume", action="store_true", help="continue an interrupted evaluation in --out")
        sub.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
        for flags, spec in (shorthands or {}).items():
            key, text = spec[0], spec[1]
            names = flags.split("|")
            if len(spec) > 2:  # a switch that sets the key to a fixed value
                sub.add_argument(
                    *names,
                    dest=f"shorthand__{key}",
                    action="store_const",
                    const=spec[2],
                    help=f"{text} (= {key}={json.dumps(spec[2])})",
                )
            else:
                sub.add_argument(
                    *names,
                    dest=f"shorthand__{key}",
                    metavar=key.rsplit(".", 1)[-1].upper(),
                    help=f"{text} (= {key}=...)",
                )

        def handler(args: argparse.Namespace) -> int:
            return _eval(args, prog, config, run, out_pattern)

        sub.set_defaults(handler=handler)
        parsers.append(sub)
    return parsers[0]


def _eval(args: argparse.Namespace, prog: str, config_path: str, run_path: str, out_pattern: str) -> int:
    overrides = list(args.overrides)
    for attr, value in vars(args).items():
        if attr.startswith("shorthand__") and value is not None:
            shown = json.dumps(value) if isinstance(value, bool) else value
            overrides.insert(0, f"{attr.removeprefix('shorthand__')}={shown}")
    if args.resume and not args.out:
        return _fail(prog, "--resume needs --out (the evaluation directory to continue)")
    source: Any = args.config
    if source is None and args.resume and (Path(args.out) / "config.json").is_file():
        source = Path(args.out) / "config.json"
    try:
        config = load_config(load_object(config_path), source, overrides)
    except ConfigError as err:
        return _fail(prog, f"invalid config: {err}")
    if args.print_config:
        return _print_config(config, "json" if args.json else "yaml", f"{prog}: the resolved configuration")
    out = Path(args.out or out_pattern.format(time=time.strftime("%Y%m%d-%H%M%S")))
    try:
        report, lines = load_object(run_path)(config, out, resume=args.resume, progress=not args.no_progress)
    except Interrupted as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print(
            f"{prog}: interrupted; what was evaluated is in {out} (continue with --out {out} --resume)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except USER_ERRORS as err:
        return _fail(prog, str(err))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        for line in lines or ():
            print(line)
    return 0
