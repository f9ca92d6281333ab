"""`tandem` command line: one subcommand per module in `app/commands/`.

Each command module exposes `register(subparsers)`, which adds its parser and sets `func`
(called with the parsed namespace, returns an exit code). Heavy imports happen inside `func`
so `tandem --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ["run", "bench", "serve", "chat", "prefill_worker", "models", "doctor", "two_box"]


def version() -> str:
    """The installed distribution's version (pyproject.toml's), or "unknown" when run from
    a tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("tandem")
    except PackageNotFoundError:
        return "unknown"


class Parser(argparse.ArgumentParser):
    """argparse with a short error: `tandem run: error: MESSAGE` and where to read more,
    instead of the whole usage first (the one line that matters would scroll away).
    Subcommands' parsers are of this class too (argparse makes them `type(parent)`)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\nsee `{self.prog} --help`\n")


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand's `--help` a description: its one-line help where it has none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    sub.description = helps[name][0].upper() + helps[name][1:] + "."
                _describe(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tandem", description="Local LLM inference on llama.cpp and MLX.")
    parser.add_argument("--version", action="version", version=f"tandem {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"app.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"app.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    _describe(parser)
    return parser


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace
            ) -> argparse.ArgumentParser:
    """The deepest subcommand parser `args` went through (`tandem models pull`'s, ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(getattr(args, action.dest, None) or "")
            if sub is not None:
                return _chosen(sub, args)
    return parser


def _log_to_stderr() -> None:
    """tandem's own loggers (`tandem.*`: two-box warnings, fallbacks) print on stderr as
    `tandem: MESSAGE`, warnings and up unless a command sets another level (`serve
    --log-level`)."""
    import logging

    logger = logging.getLogger("tandem")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tandem: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    _log_to_stderr()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand that was given them, so its --help is the pointer
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
