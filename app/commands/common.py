"""Flags and helpers shared by commands that load a model."""

from __future__ import annotations

import argparse
import sys

from app.commands.engine_flags import add_engine_args, engine_args_from, positive_int

__all__ = ["add_model_args", "fail", "load_engine", "port_number", "positive_int",
           "user_errors"]


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1..65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
    return value


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The engine flags every model-loading command takes (`engine_flags.COMMON`)."""
    add_engine_args(parser)


def load_engine(args: argparse.Namespace, max_seqs: int | None = None, **overrides):
    """Load the engine for parsed flags; `max_seqs` overrides the batch size. Raises the
    store's and backend's errors unchanged."""
    from app.loader import load_engine as load

    if max_seqs is not None:
        overrides["runner__max_seqs"] = max_seqs
    return load(engine_args_from(args, **overrides))


def fail(message: str) -> int:
    """Print one clear line on stderr; returns the exit code 1."""
    print(f"tandem: error: {message}", file=sys.stderr)
    return 1


# errors that are the user's to fix: printed as one line, no traceback
def user_errors() -> tuple[type[BaseException], ...]:
    from app.engine.types import EngineError
    from models.errors import ModelStoreError

    return (ModelStoreError, EngineError, FileNotFoundError, IsADirectoryError,
            PermissionError, ValueError)
