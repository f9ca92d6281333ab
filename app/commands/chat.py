"""`tandem chat`: the terminal chat (Textual), in-process or against a server."""

from __future__ import annotations

import argparse

from app.commands.engine_flags import COMMON, MODEL, add_engine_args, engine_args_from
from app.commands.peer_flags import add_peer_args
from models.registry import DEFAULT_MODEL

ENGINE_FLAGS = tuple(f for f in COMMON if f is not MODEL)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="interactive terminal chat",
        description="Chat in the terminal. Runs the engine in-process, or talks to any "
        "OpenAI-compatible server with --server. Press F1 inside for all keys.",
    )
    parser.add_argument(
        "--model", "-m", default=None,
        help=f"registry name or GGUF path (default: {DEFAULT_MODEL}; with --server: the "
        "server's first model)",
    )
    parser.add_argument(
        "--server", metavar="URL", default=None,
        help="OpenAI-compatible server, e.g. http://127.0.0.1:8000 (no local model is loaded; "
        "default: the engine in-process)",
    )
    parser.add_argument("--api-key", default=None, help="bearer token for --server (default: none)")
    parser.add_argument(
        "--system", metavar="TEXT", default=None,
        help="start a new chat with this system prompt (default: none)",
    )
    # the engine flags of run/serve/bench, for the in-process engine (--model is above)
    add_engine_args(parser, ENGINE_FLAGS)
    add_peer_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Heavy imports stay here so `tandem --help` is fast.
    from tui.app import ChatApp
    from tui.client import ChatClient
    from tui.config import load_config
    from tui.paths import config_path, data_dir
    from tui.store import ChatStore, SchemaTooNewError

    backend: ChatClient
    if args.server:
        from tui.server_client import ServerClient

        backend = ServerClient(args.server, model=args.model, api_key=args.api_key)
    else:
        from tui.engine_client import EngineClient, engine_factory

        model = args.model or DEFAULT_MODEL
        try:
            engine_args = engine_args_from(args, ENGINE_FLAGS, model=model)
        except ValueError as exc:
            print(f"tandem chat: {exc}")
            return 2
        backend = EngineClient(model, factory=engine_factory(engine_args))
    path = config_path()
    try:
        store = ChatStore(data_dir() / "chats.db")
    except SchemaTooNewError as exc:
        print(f"tandem chat: {exc}")
        return 1
    try:
        # new chats sample with the model's recommended settings unless config.toml says
        # otherwise (with --server and no --model: llama.cpp's defaults)
        from tui.chat_settings import ChatSettings

        recommended = ChatSettings.for_model(args.model or (None if args.server else DEFAULT_MODEL))
        app = ChatApp(backend, store, load_config(path, recommended), system_prompt=args.system,
                      config_path=path)
        return app.run() or 0
    finally:
        backend.close()
        store.close()
