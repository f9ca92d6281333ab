"""The composition root: `EngineArgs` -> a running `AsyncEngine`.

The only place that resolves a model, picks a backend and wires runner, engine and step
thread together; every entry point calls `load_engine`.
"""

from __future__ import annotations

from pathlib import Path

from app.config import EngineArgs
from app.engine.async_engine import AsyncEngine
from app.engine.engine import LLMEngine
from app.engine.spec_decode.speculator import Speculator
from app.spec_profile import step_time_curve
from backends.loader import load_runner
from models.store import resolve_model


def display_name(model: str) -> str:
    """The name an engine reports for `model`: a registry name as given, a file's stem."""
    return Path(model).stem if model.endswith(".gguf") else model


def load_engine(args: EngineArgs, *, pull_missing: bool = True) -> AsyncEngine:
    """Resolve `args.model` (fetching a registry model unless `pull_missing` is False),
    load it on the chosen backend, give it a speculator (measuring or reading the cached
    step-time curve) when speculation is on and the runner truncates exactly, and start
    the step thread.

    Raises:
        FileNotFoundError / models.errors.ModelStoreError: no such model (or not fetched).
        ValueError: the backend cannot load it, or the configuration does not fit.
        ImportError: the chosen backend is not installed.
    """
    path = resolve_model(args.model, pull_missing=pull_missing)
    runner, backend_name = load_runner(path, backend=args.backend, config=args.runner)
    try:
        engine_config = args.engine_config()
        speculator = None
        if args.spec.enabled and runner.capabilities.exact_truncate:
            curve = None
            if args.spec.fixed_k is None:
                curve, _ = step_time_curve(runner, Path(path), backend_name)
            context = min(engine_config.context_length, runner.info.n_ctx_train,
                          runner.max_seq_tokens)
            speculator = Speculator(args.spec, curve, context)
        engine = LLMEngine(runner, engine_config, speculator=speculator)
    except BaseException:
        runner.close()
        raise
    return AsyncEngine(engine, display_name(args.model), backend_name)
