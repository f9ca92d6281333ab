"""`tandem serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn) on the engine.

Binds 127.0.0.1:8000 by default. The API key comes from `--api-key` or `TANDEM_API_KEY`;
without one, any key (or none) is accepted. A model that cannot be resolved prints one line
and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from app.commands.common import load_engine, port_number
from app.commands.engine_flags import (
    COMMON,
    MAX_CONCURRENCY,
    MAX_QUEUE,
    add_engine_args,
)
from app.commands.graceful import GracefulServer, bind_socket
from app.commands.peer_flags import add_peer_args
from app.commands.pool_flags import add_pool_args, make_pool
from app.config import EngineArgs
from app.disagg.report import startup_line
from models.registry import DEFAULT_MODEL, generation_defaults


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, "
        "/v1/completions, /v1/models, /health, /metrics).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (default: 8000)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $TANDEM_API_KEY)",
    )
    add_engine_args(p, COMMON + (MAX_CONCURRENCY, MAX_QUEUE),
                    defaults=EngineArgs(model=os.environ.get("TANDEM_MODEL") or DEFAULT_MODEL))
    add_peer_args(p)
    add_pool_args(p)
    p.add_argument(
        "--cors-origin",
        nargs="+",
        default=[],
        metavar="ORIGIN",
        help="allow browser requests from these origins ('*' for any; default: none)",
    )
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="uvicorn log level (default: warning)")
    p.add_argument("--shutdown-timeout", type=non_negative_float, default=10.0,
                   metavar="SECONDS",
                   help="on Ctrl+C or SIGTERM, seconds running requests may take to finish "
                   "before their streams are ended with an error (default: 10)")
    p.add_argument("--stream-write-timeout", type=non_negative_float, default=None,
                   metavar="SECONDS",  # the default: app.server.limits.WRITE_TIMEOUT_S
                   help="drop a client that takes none of its reply's bytes for this long and "
                   "abort its request (0: never; default: 30)")
    p.set_defaults(func=run)


def non_negative_float(text: str) -> float:
    """argparse type: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


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


def kv_line(d: dict) -> str | None:
    """The start-up line saying what KV the engine allocated, from `AsyncEngine.describe()`
    `d`; None when the runner does not report its KV bytes."""
    if d["kv_bytes"] is None:
        return None
    gib = d["kv_bytes"] / 2**30
    if d["kv_budget_bytes"] is None:  # MLX: one paged pool shared by all sequences
        return (f"tandem: paged KV ({d['kv_cache_type']}): {d['kv_tokens']} tokens shared by "
                f"{d['max_seqs']} sequences, {gib:.2f} GiB")
    exact = (", exact mode" if d["exact"] else
             ", flash attention off" if d.get("flash_attn") == "off" else "")
    return (f"tandem: {d['kv_layout']} KV ({d['kv_cache_type']}{exact}): {d['max_seqs']} "
            f"sequences x {d['context_length']} tokens, {gib:.1f} GiB (budget "
            f"{d['kv_budget_bytes'] / 2**30:.1f} GiB, 1/8 of memory)")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from app.server.app import create_app
    from app.server.limits import WRITE_TIMEOUT_S, uvicorn_options
    from app.server.prefill_log import PrefillLog

    # tandem's own loggers (two-box transfers and fallbacks, long prefills) at the server's
    # level; `app.cli.main` gave them their stderr handler
    logger = logging.getLogger("tandem")
    logger.setLevel(logging.DEBUG if args.log_level == "trace" else args.log_level.upper())
    spec = args.model
    write_timeout_s = (WRITE_TIMEOUT_S if args.stream_write_timeout is None
                       else args.stream_write_timeout or None)  # 0: never
    api_key = args.api_key if args.api_key is not None else os.environ.get("TANDEM_API_KEY")
    try:  # before the model loads: a busy port is reported at once
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"tandem serve: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        engine = load_engine(args, flags=COMMON + (MAX_CONCURRENCY, MAX_QUEUE))
    except Exception as exc:
        sock.close()
        if not _is_resolution_error(exc):
            raise
        print(f"tandem serve: {exc}", file=sys.stderr)
        return 1
    pool = None
    try:
        aliases = model_aliases(spec, engine.model_name)
        try:  # every model of the store, loaded on demand (`app.server.model_pool`)
            pool = make_pool(args, engine, COMMON + (MAX_CONCURRENCY, MAX_QUEUE), aliases)
        except ValueError as exc:
            print(f"tandem serve: {exc}", file=sys.stderr)
            return 1
        app = create_app(
            engine,
            api_key=api_key or None,
            model_name=engine.model_name,
            aliases=aliases,
            cors_origins=args.cors_origin,
            defaults=generation_defaults(spec),  # for what a request leaves out
            pool=pool,
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=args.log_level in ("debug", "info"),
            # header, keep-alive and write timeouts: slow clients hold nothing
            **uvicorn_options(write_timeout_s=write_timeout_s),
        )
        shown = f"[{args.host}]" if ":" in args.host else args.host
        d = engine.describe()
        layout = d["kv_layout"]
        if (line := kv_line(d)) is not None:
            print(line, flush=True)
        if d["weight_buffers"]:
            # here, not at the top: `--exact` picks the llama.cpp library before its import
            from backends.llamacpp.plain_prefill import PLAIN_PREFILL_MIN_TOKENS
            from backends.llamacpp.repack import describe as describe_repack
            from backends.llamacpp.repack import weight_summary

            plain = (f"; prefill chunks of {PLAIN_PREFILL_MIN_TOKENS}+ tokens on the plain "
                     "weights" if d["plain_prefill"] else "")
            print(f"tandem: weights: {weight_summary(d['weight_buffers'])} "
                  f"({describe_repack(d['repack'])}{plain})", flush=True)
        peer = engine.engine.scheduler.remote
        if peer is not None:  # what `auto` will do, from the estimates kept from last time
            print("tandem: " + startup_line(peer.peer.host, peer.peer.port, peer.policy,
                                            engine.context_length), flush=True)
        if layout == "unified":
            print("tandem: note: with --kv-layout unified, output (even at temperature 0) "
                  "may vary with load and cache history", flush=True)
        banner = (
            f"tandem: serving {engine.model_name} ({engine.backend_name}, context "
            f"{engine.context_length}" + (f", {layout} KV" if layout else "")
            + f") at http://{shown}:{args.port}/v1"
            + (" (API key required)" if api_key else "")
        )
        server = GracefulServer(config, args.shutdown_timeout,
                                on_grace_expired=app.state.ctx.end_streams,
                                on_listening=lambda: print(banner, flush=True))
        prefills = PrefillLog(engine).start()  # long prefills, at --log-level info
        try:
            server.run(sockets=[sock])
        finally:
            prefills.stop()
    finally:
        if pool is not None:
            pool.close()  # every model still loaded, the first one included
        else:
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
