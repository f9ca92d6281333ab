"""Flags and helpers shared by commands that load a model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands.engine_flags import (
    COMMON,
    add_engine_args,
    default_of,
    engine_args_from,
    positive_int,
)

__all__ = ["add_model_args", "fail", "load_engine", "model_notes", "port_number", "positive_int",
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


def load_engine(args: argparse.Namespace, max_seqs: int | None = None, flags=COMMON,
                **overrides):
    """Load the engine for parsed flags; `max_seqs` overrides the batch size. A `--model`
    directory (an MLX model) picks the mlx backend when `--backend` is unset. Notes on
    stderr what was decided for the user (`model_notes`). Raises the store's and backend's
    errors unchanged. `flags`: the engine flags the command has."""
    from app.loader import load_engine as load

    if max_seqs is not None:
        overrides["runner__max_seqs"] = max_seqs
    if Path(args.model).expanduser().is_dir() and getattr(args, "backend", None) is None:
        overrides["backend"] = "mlx"  # only MLX loads a model directory
    engine = load(engine_args_from(args, flags, **overrides))
    for note in model_notes(args, engine):
        print(f"tandem: note: {note}", file=sys.stderr)
    return engine


def model_notes(args: argparse.Namespace, engine) -> list[str]:
    """What the engine decided that the flags did not say: a `--ctx-size` above the
    model's trained context was capped; a quantized KV cache turned flash attention on; the
    MLX backend runs a converted copy of the GGUF
    (`tandem models convert --to mlx`) instead of the file itself."""
    notes = []
    asked = getattr(args, "ctx_size", None)
    if asked and asked > engine.context_length and asked != default_of("runner.seq_tokens"):
        notes.append(f"--ctx-size {asked} is above the model's context; using "
                     f"{engine.context_length} tokens")
    runner = engine.runner
    if getattr(runner, "flash_attn_forced", False):
        notes.append(f"--kv-cache-type {runner.kv_cache_type} needs flash attention for its "
                     "V cache; turned it on")
    if engine.backend_name == "mlx":
        from backends.mlx.convert import converted_dir, is_current
        from models.store import resolve_model

        path = resolve_model(args.model, pull_missing=False)
        if path.suffix == ".gguf" and is_current(converted_dir(path), path):
            notes.append(f"using the MLX conversion {converted_dir(path)}")
    return notes


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
