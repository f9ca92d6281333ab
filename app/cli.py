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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem", description="Local LLM inference on llama.cpp and MLX."
    )
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
