"""`tandem serve`'s flags for serving the model store (`app.server.model_pool`):
`--max-loaded-models`, `--models-memory`, `--keep-alive`, `--alias`, and the pool they
build around the engine `serve` loaded first."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from app.server.model_pool import KEEP_ALIVE_S, MAX_LOADED, ModelPool, parse_duration
from app.server.store_models import model_names, scan_store, store_model

MEMORY_FRACTION = 0.75  # of physical memory, the default --models-memory


def keep_alive(text: str) -> float | None:
    """argparse type: seconds or a Go duration ("5m", "1h"); negative = forever (None)."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected seconds or a duration such as 5m or 1h, got {text!r}") from None
    return None if seconds < 0 else seconds


def gib(text: str) -> float:
    """argparse type: GiB > 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected GiB > 0, got {text!r}")
    return value


def alias(text: str) -> tuple[str, str]:
    """argparse type: NAME=MODEL."""
    name, sep, model = text.partition("=")
    if not sep or not name.strip() or not model.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=MODEL, got {text!r}")
    return name.strip(), model.strip()


def add_pool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-loaded-models", type=int, default=MAX_LOADED, metavar="N",
                   help="models kept loaded at once; a request naming another model of the "
                   "store loads it, unloading the least recently used idle one "
                   f"(default: {MAX_LOADED}, as Ollama on CPU)")
    p.add_argument("--models-memory", type=gib, default=None, metavar="GIB",
                   help="memory the loaded models may hold together (weights + KV cache), "
                   f"GiB (default: {MEMORY_FRACTION * 100:.0f}%% of physical memory)")
    p.add_argument("--keep-alive", type=keep_alive, default=KEEP_ALIVE_S, metavar="DURATION",
                   help="how long a model loaded on demand stays after its last request: "
                   "seconds or a duration (5m, 1h), 0 = unload after each reply, negative = "
                   "until evicted; a request's keep_alive (Ollama API) overrides it; the "
                   "--model model stays until evicted (default: 5m)")
    p.add_argument("--alias", type=alias, action="append", default=[], metavar="NAME=MODEL",
                   help="let requests name MODEL (a model of the store) NAME too, e.g. "
                   "gpt-4o-mini=qwen2.5-coder-1.5b-instruct (repeatable; default: none)")


def make_pool(args: argparse.Namespace, engine: Any, flags: tuple, spec_names: set[str]
              ) -> ModelPool:
    """The pool serving the store around `engine` (the --model one, the default).
    Raises ValueError for an --alias to no model, or --max-loaded-models < 1."""
    from app.commands.engine_flags import engine_args_from
    from app.loader import load_engine
    from backends.llamacpp.runtime import physical_memory_bytes
    from models.registry import generation_defaults
    from models.store import store_dir

    if args.max_loaded_models < 1:
        raise ValueError(f"--max-loaded-models must be >= 1, got {args.max_loaded_models}")

    def load(path: Path) -> Any:
        # the other models get the same engine flags, without the --model's draft or peer
        eargs = engine_args_from(args, flags, model=str(path), draft_model=None)
        eargs.prefill_peer = None
        return load_engine(eargs, pull_missing=False)

    path = Path(getattr(engine, "model_path", None) or args.model)
    found = store_model(path, engine.model_name)
    start = type(found)(found.name, path, found.names | model_names(found.name, path,
                                                                    tuple(spec_names)))
    budget = (int(args.models_memory * 2**30) if args.models_memory is not None
              else int(physical_memory_bytes() * MEMORY_FRACTION))
    pool = ModelPool(load, lambda: scan_store(store_dir()), start, engine,
                     defaults_of=lambda p: generation_defaults(str(p)),
                     start_defaults=generation_defaults(args.model),
                     max_loaded=args.max_loaded_models, memory_budget=budget,
                     keep_alive_s=args.keep_alive, max_waiting=args.max_queue)
    for name, target in args.alias:
        pool.add_alias(name, target)
    return pool
