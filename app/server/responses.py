"""The response side shared by `/v1/chat/completions` and `/v1/completions`.

`respond` answers a request whose jobs are submitted: a JSON body once every choice has
finished, or a stream of chunks (`stream_chunks`) in OpenAI's server-sent-event framing
(`data: {json}\\n\\n`, ending with `data: [DONE]`; `app.server.sse`), sent by Starlette's
`StreamingResponse`. Both cancel the engine streams when the client goes away.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.engine.types import RequestOutput
from app.server.context import ServerContext
from app.server.errors import APIError, shutting_down
from app.server.generation import (
    ChoiceState,
    ClientDisconnected,
    Job,
    cancel_all,
    collect,
    merge_outputs,
    until_disconnect,
    usage,
)
from app.server.sse import SSE_DONE, SSETemplate, sse

log = logging.getLogger("tandem.server")

Choice = dict[str, Any]


def stream_error(exc: BaseException) -> bytes:
    """The event reporting an error after streaming began (OpenAI's error shape)."""
    if isinstance(exc, APIError):
        return sse(exc.body())
    return sse({"error": {"message": f"Internal server error: {type(exc).__name__}: {exc}",
                          "type": "server_error", "param": None, "code": None}})


def response_head(ctx: ServerContext, id_prefix: str, model: str) -> dict[str, Any]:
    """`id`, `created`, `model` and `system_fingerprint`, common to a response's chunks."""
    backend = getattr(ctx.engine, "backend_name", "engine")
    return {"id": f"{id_prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": model, "system_fingerprint": f"tandem-{backend}"}


def envelope(head: dict[str, Any], object_name: str) -> dict[str, Any]:
    """`head` with OpenAI's `object` field, in OpenAI's key order (`id`, `object`, ...)."""
    return {"id": head["id"], "object": object_name, **head}


async def respond(
    request: Request,
    ctx: ServerContext,
    streams: list[Any],
    jobs: list[Job],
    events: AsyncIterator[bytes] | None,
    make_body: Callable[[list[ChoiceState]], dict[str, Any]],
    media_type: str = "text/event-stream",
) -> Response:
    """Stream `events` (as `media_type`) if given, else collect every choice and answer
    `make_body(states)`.

    Every API's responses come through here: the streams count as open in `ctx` until the
    response is over, so a shutdown's `ctx.end_streams` ends them all (a streamed response
    then sends its API's error event, which `events` renders). A client gone before the
    collected answer gets status 499 (nobody reads it); a streaming client gone, or dropped
    for not reading (`app.server.limits`), closes `events`; either way the engine streams
    are cancelled, which frees their KV blocks within one step. Raises APIError 503
    `server_shutting_down` when the server stopped before a choice ended, or had already
    ended its streams when the request came.
    """
    ctx.open(streams)  # past the grace period of a shutdown: 503 server_shutting_down
    if events is not None:

        def done() -> None:
            ctx.close(streams)
            cancel_all(streams)

        # not sse-starlette's EventSourceResponse: its per-send cancel scope and tasks cost
        # 0.3 ms per token at one stream (5% of a 135M model's decode on 2 cores)
        return EventStream(
            events, done, media_type=media_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        states = await until_disconnect(request, collect(streams, jobs, ctx.metrics))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        ctx.close(streams)
        cancel_all(streams)
    if ctx.stopping and any(s.finish_reason == "abort" for s in states):
        raise shutting_down()
    return JSONResponse(make_body(states))


class EventStream(StreamingResponse):
    """Starlette's `StreamingResponse` of `events` that, however it ends (sent in full, the
    client gone or dropped for not reading, the task cancelled), closes `events` (their
    `finally` runs now, not when collected) and then calls `done()`."""

    def __init__(self, events: AsyncIterator[bytes], done: Callable[[], None],
                 **kw: Any):
        super().__init__(events, **kw)
        self._events = events
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._events.aclose()  # type: ignore[attr-defined]
            finally:
                self._done()


async def stream_chunks(
    ctx: ServerContext,
    streams: list[Any],
    jobs: list[Job],
    base: dict[str, Any],
    include_usage: bool,
    opening: Callable[[int, Job], Choice | None],
    content: Callable[[int, ChoiceState, RequestOutput], Choice | list[Choice] | str | None],
    last: Callable[[ChoiceState], Choice],
    text_choice: Callable[[int, str], Choice],
) -> AsyncIterator[bytes]:
    """The chunk events of a streamed response: `{**base, "choices": [choice]}` for
    `opening(position, job)` of each job (if not None), `content(position, state, output)`
    of each engine output (if not None), `last(state)` when a choice finishes; then, with
    `include_usage`, a chunk with `choices: []` and the usage (earlier chunks carry
    `"usage": null`); an error event if generation fails; finally `[DONE]`.

    `content` may return a list of choices (one chunk each), or a string: the choice `text_choice(job index, text)`, the common
    chunk that carries only text, whose bytes come from an `SSETemplate` per choice."""

    def wrap(choice: Choice) -> dict[str, Any]:
        obj = {**base, "choices": [choice]}
        if include_usage:
            obj["usage"] = None
        return obj

    def chunk(choice: Choice) -> bytes:
        return sse(wrap(choice))

    templates: dict[int, SSETemplate] = {}

    def text_chunk(pos: int, text: str) -> bytes:
        template = templates.get(pos)
        if template is None:
            index = jobs[pos].index
            template = templates[pos] = SSETemplate(lambda t: wrap(text_choice(index, t)))
        return template(text)

    states = [ChoiceState(job) for job in jobs]
    outputs = merge_outputs(streams, ctx.metrics)
    try:
        for pos, job in enumerate(jobs):
            choice = opening(pos, job)
            if choice is not None:
                yield chunk(choice)
        async for pos, out in outputs:
            if ctx.stopping and out.finished and out.finish_reason == "abort":
                raise shutting_down()
            state = states[pos]
            state.add(out)
            choice = content(pos, state, out)
            if isinstance(choice, str):
                yield text_chunk(pos, choice)
            elif isinstance(choice, list):
                for c in choice:
                    yield chunk(c)
            elif choice is not None:
                yield chunk(choice)
            if out.finished:
                yield chunk(last(state))
        if include_usage:
            yield sse({**base, "choices": [], "usage": usage(states)})
    except Exception as exc:
        if not ctx.stopping:
            log.exception("stream %s failed", base.get("id"))
        yield stream_error(exc)
    finally:
        await outputs.aclose()
    yield SSE_DONE
