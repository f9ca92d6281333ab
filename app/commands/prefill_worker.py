"""`tandem prefill-worker`: prefill prompts for a decode box and stream their KV (two-box
mode; protocol in docs/two-box.md).

Binds 127.0.0.1:7070 by default; any other address needs `--secret-file`. Ctrl+C or SIGTERM
stop it; a decode box mid-transfer then prefills the rest itself. Everything it prints goes
to stderr: the listening line, then one line per request (tokens, bytes, seconds, GB/s).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from app.commands.common import port_number, user_errors
from app.commands.engine_flags import (
    BACKEND,
    CTX_SIZE,
    EXACT,
    KV_CACHE_TYPE,
    MODEL,
    THREADS,
    add_engine_args,
    engine_args_from,
    non_negative_int,
    positive_int,
)
from app.commands.peer_flags import add_secret_arg
from app.config import check_worker_kv
from app.disagg.peer import DEFAULT_PORT, check_bind, read_secret

# --kv-cache-type: f16 or q8_0, the type the wire carries (q4_0 refused below, one line)
FLAGS = (MODEL, BACKEND, CTX_SIZE, THREADS, KV_CACHE_TYPE, EXACT)
DEFAULT_MAX_PROMPTS = 2  # a prompt's last chunk shares its step with the next one's first


def positive_seconds(text: str) -> float:
    """argparse type: seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "prefill-worker",
        help="prefill prompts for another machine (two-box mode)",
        description="Prefill prompts sent by a `tandem serve/chat/run --prefill-peer` on "
        "another machine and stream their KV cache to it while computing. Both machines "
        "must run the same model file.")
    add_engine_args(p, FLAGS)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1; others need --secret-file)")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                   help=f"TCP port (default: {DEFAULT_PORT})")
    add_secret_arg(p)
    from app.disagg import peer as w

    p.add_argument("--max-prompts", type=positive_int, default=DEFAULT_MAX_PROMPTS,
                   metavar="N", help="prompts prefilled together, from any decode boxes "
                   f"(sequence slots; default: {DEFAULT_MAX_PROMPTS})")
    p.add_argument("--max-queue", type=non_negative_int, default=w.DEFAULT_MAX_QUEUE,
                   metavar="N", help="prompts allowed to wait beyond --max-prompts; one more "
                   f"gets `busy` and is prefilled by its decode box (default: "
                   f"{w.DEFAULT_MAX_QUEUE})")
    p.add_argument("--max-handshakes", type=positive_int, default=w.DEFAULT_MAX_HANDSHAKES,
                   metavar="N", help="connections in the handshake at once; more are refused "
                   f"at once (default: {w.DEFAULT_MAX_HANDSHAKES})")
    p.add_argument("--write-timeout", type=positive_seconds,
                   default=w.DEFAULT_WRITE_TIMEOUT_S, metavar="SECONDS",
                   help="a decode box that takes no frame for this long is dropped and its "
                   f"prompt freed (default: {w.DEFAULT_WRITE_TIMEOUT_S:g})")
    p.add_argument("--log-level", default="info", choices=("error", "warning", "info", "debug"),
                   help="log level (default: info)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # `app.cli.main` gave tandem's loggers their stderr handler (`tandem: MESSAGE`)
    logging.getLogger("tandem").setLevel(args.log_level.upper())
    try:
        secret = read_secret(args.secret_file)
        check_bind(args.host, secret)
        engine_args = engine_args_from(args, FLAGS, runner__max_seqs=args.max_prompts)
        check_worker_kv(engine_args)
    except ValueError as exc:
        print(f"tandem prefill-worker: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(args, engine_args, secret))
    except user_errors() as exc:
        print(f"tandem prefill-worker: {exc}", file=sys.stderr)
        return 1


async def _serve(args, engine_args, secret: bytes) -> int:
    from app.disagg.fingerprints import model_fingerprint
    from app.disagg.worker import PrefillWorker
    from app.loader import display_name, load_prefill_engine

    engine, path = load_prefill_engine(engine_args)
    worker = PrefillWorker(engine, model_fingerprint(path), secret,
                           threads=getattr(engine.runner, "n_threads", None),
                           max_queue=args.max_queue, max_handshakes=args.max_handshakes,
                           write_timeout_s=args.write_timeout)
    try:
        try:
            server = await worker.serve(args.host, args.port)
        except OSError as exc:
            print(f"tandem prefill-worker: cannot listen on {args.host}:{args.port}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"tandem: prefill worker for {display_name(engine_args.model)} listening on "
              f"{shown}:{args.port}" + (" (secret required)" if secret else
                                        " (loopback, no secret)"), file=sys.stderr, flush=True)
        async with server:
            await stop.wait()
        return 0
    finally:
        worker.close()
