"""What every route needs: the engine, the served model's names, the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from app.server.errors import APIError, shutting_down
from app.server.metrics import ServerMetrics
from models.registry import GenerationDefaults


@dataclass
class ServerContext:
    """Per-app state, stored on `app.state.ctx`.

    `engine` is an `AsyncEngine` (or anything with its API); `model_name` is the id
    `/v1/models` lists; `aliases` are further names a request's `model` may use (the registry
    name, the file name and stem); `defaults` the model's recommended sampling settings
    (None: OpenAI's defaults), used for every field a request leaves out. `pool`: the
    `app.server.model_pool.ModelPool` of a server that serves the model store (None: this
    one model); routes then serve through `model_pool.model_context`.
    """

    engine: Any
    model_name: str
    aliases: frozenset[str] = frozenset()
    metrics: ServerMetrics | None = None
    defaults: GenerationDefaults | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    open_streams: set[Any] = field(default_factory=set)  # engine streams of open responses
    stopping: bool = False
    pool: Any = None

    def open(self, streams: list[Any]) -> None:
        """Count a response's engine streams as open until `close`, so that `end_streams`
        ends them. Raises APIError 503 `server_shutting_down` (after cancelling them) once
        the streams have been ended: a request that comes in after that gets no reply."""
        if self.stopping:
            for s in streams:
                s.cancel()
            raise shutting_down()
        self.open_streams.update(streams)

    def close(self, streams: list[Any]) -> None:
        """The response of `streams` is over (idempotent)."""
        self.open_streams.difference_update(streams)

    def end_streams(self) -> int:
        """The server is stopping and its grace period is over: end every open engine
        stream now with a `server_shutting_down` error, so each streamed response sends its
        error event (and `[DONE]` on the OpenAI APIs) and each collected one answers 503
        (`app.server.responses`) without waiting for the engine's step in progress, which
        may take seconds (a long prefill chunk); their requests are aborted, freeing their
        KV blocks after that step. Requests waiting for a model to load (`pool`) answer 503
        `server_shutting_down` too. Returns how many streams and waiting requests there
        were."""
        self.stopping = True
        streams = list(self.open_streams)
        for s in streams:
            s.end(shutting_down())
        waiting = self.pool.end_waiting() if self.pool is not None else 0
        return len(streams) + waiting

    def resolve_model(self, requested: str | None) -> str:
        """The name to answer with for a request's `model` field.

        Raises APIError 404 `model_not_found` when the name is neither the served model nor
        one of its aliases (compared case-insensitively). A missing `model` means the served one.
        With a pool, any model of the pool (the 404 lists them).
        """
        if requested is None or requested == "":
            return self.model_name
        if self.pool is not None:
            self.pool.slot(requested)
            return requested
        names = {self.model_name.lower(), *(a.lower() for a in self.aliases)}
        if requested.lower() in names:
            return requested
        raise APIError(
            404,
            f"The model `{requested}` does not exist. This server serves `{self.model_name}`.",
            param="model",
            code="model_not_found",
        )

    @property
    def context_length(self) -> int:
        return int(self.engine.context_length)


def get_ctx(request: Request) -> ServerContext:
    """FastAPI dependency: the app's `ServerContext`."""
    return request.app.state.ctx


Ctx = Annotated[ServerContext, Depends(get_ctx)]
