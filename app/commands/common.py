"""Flags and helpers shared by commands that load a model."""

from __future__ import annotations

import argparse
import sys

from models.registry import DEFAULT_MODEL


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1..65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
    return value


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", default=DEFAULT_MODEL,
                        help=f"registry name or path to a .gguf (default: {DEFAULT_MODEL})")
    parser.add_argument("--backend", choices=["llamacpp", "mlx"], default=None,
                        help="override automatic backend selection")
    parser.add_argument("--ctx-size", type=positive_int, default=8192,
                        help="context window per sequence, tokens (default: 8192)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="llama.cpp threads (default: all available CPUs)")
    add_kv_layout_arg(parser)


def add_kv_layout_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kv-layout", choices=["auto", "split", "unified"], default="auto",
                        help="llama.cpp KV cache: a stream per sequence (split: faster decode, "
                             "concurrency x ctx-size cells allocated up front) or one shared "
                             "pool (unified); auto picks split when that fits 2 GiB")


def load_engine(args: argparse.Namespace, max_seqs: int = 32, **kwargs):
    """Load the engine for `args`; raises the store's and backend's errors unchanged."""
    from app.engine import AsyncEngine

    return AsyncEngine.from_model(
        args.model, n_ctx=args.ctx_size, max_seqs=max_seqs, threads=args.threads,
        backend=args.backend, kv_layout=args.kv_layout, **kwargs,
    )


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
