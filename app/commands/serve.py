"""`tandem serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn) on the engine.

Binds 127.0.0.1:8000 by default. The API key comes from `--api-key` or `TANDEM_API_KEY`;
without one, any key (or none) is accepted. A model that cannot be resolved prints one line
and exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.commands.common import add_kv_layout_arg, port_number, positive_int
from models.registry import DEFAULT_MODEL


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, "
        "/v1/completions, /v1/models, /health, /metrics).",
    )
    p.add_argument(
        "--model", "-m", default=None, help=f"registry name or .gguf path (default {DEFAULT_MODEL})"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (default 8000)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $TANDEM_API_KEY)",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="sequences decoded together in one batch (engine default when unset)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=256,
        metavar="N",
        help="sequences allowed to wait for a batch slot; beyond that requests get 503 (default 256)",
    )
    p.add_argument(
        "--ctx-size", type=positive_int, default=8192, help="context window in tokens (default 8192)"
    )
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for the backend")
    add_kv_layout_arg(p)
    p.add_argument(
        "--cors-origin",
        nargs="+",
        default=[],
        metavar="ORIGIN",
        help="allow browser requests from these origins ('*' for any)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.set_defaults(func=run)


def model_aliases(spec: str, engine_name: str) -> set[str]:
    """Names a request's `model` may use: the name given, the engine's name, and the file
    name and stem of the model file (a path given, or the registry entry's file)."""
    names = {spec, engine_name}
    paths: list[str] = [spec] if spec.endswith(".gguf") else []
    try:
        from models.store import resolve_model

        paths.append(str(resolve_model(spec, pull_missing=False)))
    except Exception:  # noqa: BLE001 - aliases are a convenience
        pass
    for path in paths:
        p = Path(path)
        names.update({p.name, p.stem})
    return {n for n in names if n}


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from app.engine import AsyncEngine
    from app.server.app import create_app

    spec = args.model or os.environ.get("TANDEM_MODEL") or DEFAULT_MODEL
    api_key = args.api_key if args.api_key is not None else os.environ.get("TANDEM_API_KEY")
    engine_kwargs: dict[str, object] = {"n_ctx": args.ctx_size, "threads": args.threads,
                                        "kv_layout": args.kv_layout}
    if args.max_concurrency is not None:
        if args.max_concurrency < 1:
            print("tandem serve: --max-concurrency must be at least 1", file=sys.stderr)
            return 2
        engine_kwargs["max_seqs"] = args.max_concurrency
    engine_kwargs["max_waiting"] = max(args.max_queue, 0)
    try:
        engine = AsyncEngine.from_model(spec, **engine_kwargs)
    except Exception as exc:
        if not _is_resolution_error(exc):
            raise
        print(f"tandem serve: {exc}", file=sys.stderr)
        return 1
    try:
        app = create_app(
            engine,
            api_key=api_key or None,
            model_name=engine.model_name,
            aliases=model_aliases(spec, engine.model_name),
            cors_origins=args.cors_origin,
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=args.log_level in ("debug", "info"),
            timeout_graceful_shutdown=3,
        )
        server = uvicorn.Server(config)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        layout = getattr(engine.engine.runner, "kv_layout", None)
        print(
            f"tandem: serving {engine.model_name} ({engine.backend_name}, context "
            f"{engine.context_length}" + (f", {layout} KV" if layout else "")
            + f") at http://{shown}:{args.port}/v1"
            + (" (API key required)" if api_key else ""),
            flush=True,
        )
        server.run()
    finally:
        engine.shutdown()
    return 0


def _is_resolution_error(exc: Exception) -> bool:
    """A missing file, an unknown model name, a failed fetch or a file the backend cannot
    load — the user's to fix, reported in one line."""
    if isinstance(exc, FileNotFoundError | ValueError):
        return True
    try:
        from models.errors import ModelStoreError
    except ImportError:
        return False
    return isinstance(exc, ModelStoreError)
