"""The FastAPI application of `tandem serve`.

`create_app(engine, ...)` wires the routes, the OpenAI error shape, the API key, CORS,
Prometheus metrics and the request limits (body size and body timeout, `app.server.limits`)
around an engine that is already loaded; the caller owns the engine (and shuts it down).
The header timeout lives in the HTTP protocol: run the app with
`uvicorn.Config(app, ..., **app.server.limits.uvicorn_options())`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.server import routes_chat, routes_completions, routes_misc, routes_ollama, routes_pool
from app.server.auth import APIKeyMiddleware
from app.server.context import ServerContext
from app.server.errors import install_error_handlers
from app.server.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, RequestLimitsMiddleware
from app.server.metrics import ServerMetrics
from app.server.model_pool import DefaultEngine, ModelLeases
from app.server.openapi import install_openapi
from app.server.routes_embeddings import router as embeddings_router
from app.server.routes_messages import router as messages_router
from app.server.routes_responses import router as responses_router
from models.registry import GenerationDefaults


class _CountResponses:
    """Pure ASGI middleware counting responses by path and status (keeps streaming intact)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.observe_response(path, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)


def create_app(
    engine: Any,
    api_key: str | None = None,
    model_name: str | None = None,
    aliases: Iterable[str] = (),
    cors_origins: Iterable[str] = (),
    defaults: GenerationDefaults | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout_s: float = BODY_TIMEOUT_S,
    pool: Any = None,
) -> FastAPI:
    """An app serving `engine` (an `AsyncEngine`, or anything with its API).

    `model_name` is the id listed by `/v1/models` (default `engine.model_name`); requests may
    also name any of `aliases`. With `api_key`, every `/v1` route needs `Authorization:
    Bearer <api_key>`; `/health` and `/metrics` stay open. `cors_origins` enables CORS for
    those origins (`"*"` for any). `defaults`: the model's recommended sampling settings
    for what a request leaves out (None: OpenAI's). A body over `max_body_bytes` is a 413,
    one whose next chunk takes over `body_timeout_s` seconds a 408. `pool`: a
    `model_pool.ModelPool` whose default model `engine` is, to serve the model store.
    """
    name = model_name or str(engine.model_name)
    metrics = ServerMetrics(
        engine if pool is None else DefaultEngine(pool, engine),
        models=(lambda: [(name, engine)]) if pool is None else pool.loaded)
    app = FastAPI(title="tandem", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.ctx = ServerContext(
        engine=engine, model_name=name, aliases=frozenset(aliases), metrics=metrics,
        defaults=defaults, pool=pool,
    )
    install_error_handlers(app)
    app.include_router(routes_chat.router)
    app.include_router(routes_completions.router)
    app.include_router(messages_router)
    app.include_router(routes_misc.router)
    app.include_router(embeddings_router)
    app.include_router(responses_router)
    app.include_router(routes_misc.public)
    app.include_router(routes_ollama.router)
    if pool is not None:
        app.include_router(routes_pool.router)
        app.add_middleware(ModelLeases)  # innermost: a request's leases end with its reply

    def served_names() -> list[str]:  # what a request's `model` may say, for /openapi.json
        if pool is None:
            return [name, *sorted(app.state.ctx.aliases)]
        slots = pool.slots()
        return [*(s.name for s in slots), *sorted(a for s in slots for a in s.aliases)]

    install_openapi(app, served_names, guarded=bool(api_key))
    if api_key:  # added first: innermost, so CORS answers preflights without a key
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    origins = list(cors_origins)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["*"],
            allow_headers=["*"],
            allow_credentials="*" not in origins,
        )
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=max_body_bytes,
                       timeout_s=body_timeout_s)
    app.add_middleware(_CountResponses, metrics=metrics)
    return app
