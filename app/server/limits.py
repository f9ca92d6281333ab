"""Limits that keep one client's mistake or slowness from costing anyone else.

- Body size: at most `MAX_BODY_BYTES` (32 MiB: a full 128k-token context as JSON text or as
  token ids is a few MB). A larger declared `Content-Length` is refused with 413 before one
  byte of the body is read; a chunked body is refused as soon as it passes the limit.
  (Starlette's `RequestBodyLimitMiddleware` does the same but answers in plain text.)
- Slow bodies: a request whose next body chunk does not arrive within `BODY_TIMEOUT_S`
  seconds gets 408 and the connection is closed (nginx's `client_body_timeout`, a timeout
  between two reads, not for the whole body).
Both are `RequestLimitsMiddleware`, pure ASGI; the 413/408 bodies are in the shape of the path's API (`app.server.errors`).
- Slow or endless headers: a connection that has not delivered a request's complete headers
  within `HEADER_TIMEOUT_S` seconds of connecting (or of its first byte after a response) is
  closed (nginx's `client_header_timeout`), and headers still incomplete after
  `MAX_HEADER_BYTES` (16 KiB, Node's default), or whose URL and header lines (as parsed:
  name, value and 4 bytes each) add up to more, however many reads brought them, get 400. uvicorn has neither for
  its httptools protocol, which the server speaks (its event loop spends less CPU per
  streamed chunk than with h11: README, Benchmarks), so `header_limits_protocol` adds both.
  Idle keep-alive connections are closed after uvicorn's `timeout_keep_alive` (5 s).
- Clients that stop reading (`WRITE_TIMEOUT_S`, `tandem serve --stream-write-timeout`): a
  response's bytes go to the connection's transport, whose buffer uvicorn keeps under its
  64 KiB high-water mark (`send` waits while it is above, so a streamed response's
  generator, and with it the reading of the engine's outputs, waits too); a connection
  whose buffer stays above that mark for `write_timeout_s` seconds (the client took fewer
  than 48 KiB, down to the 16 KiB low-water mark, in that time), or that still holds
  unsent bytes `write_timeout_s` seconds after its response ended, is aborted. Its
  request then sees a disconnect: a stream's engine requests are aborted and their KV
  blocks freed within one step. What one stalled stream holds meanwhile: the kernel's
  socket buffers, at most 64 KiB plus one event in the transport, and the engine outputs
  produced while `send` waited (at most `write_timeout_s` seconds of decoding; never more
  than the request's `max_tokens`). The engine's step loop and the other streams never
  wait for it: outputs are queued to each stream without waiting for its consumer.

The server is one asyncio process: a slow client holds a socket, never a worker thread, so
other requests keep flowing while it dawdles; these limits bound how long it holds the socket.
`uvicorn_options()` gives the `uvicorn.Config` keyword arguments for the protocol limits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.server.errors import APIError

MAX_BODY_BYTES = 32 * 1024 * 1024
BODY_TIMEOUT_S = 30.0
HEADER_TIMEOUT_S = 30.0
MAX_HEADER_BYTES = 16 * 1024
KEEP_ALIVE_S = 5
WRITE_TIMEOUT_S = 30.0  # nginx's send_timeout is 60 s; a client that reads takes bytes at once

log = logging.getLogger("tandem.server")


class BodyTooLarge(HTTPException):
    """The body passed `limit` bytes: answered 413, connection closed (the rest is never read).
    An HTTPException for the same reason as `BodyTimeout`."""

    def __init__(self, limit: int):
        super().__init__(
            status_code=413,
            detail=f"The request body is larger than this server's limit of {limit} bytes.",
            headers={"Connection": "close"},
        )


class BodyTimeout(HTTPException):
    """The client stopped sending its body: answered 408, connection closed.

    An HTTPException, so FastAPI's body parsing re-raises it to the error handlers (any other
    exception there would become a generic 400)."""

    def __init__(self, timeout_s: float):
        super().__init__(
            status_code=408,
            detail=f"The request body did not arrive in time (no data for {timeout_s:g} s).",
            headers={"Connection": "close"},
        )


class RequestLimitsMiddleware:
    """Pure ASGI middleware for the body limits (see the module docstring).

    A declared `Content-Length` over `max_body_bytes` is answered 413 at once, before the app
    runs. Otherwise each `receive()` of the body waits at most `timeout_s` seconds (then
    raises `BodyTimeout`) and the bytes received are counted (past the limit: `BodyTooLarge`);
    the app's error handlers answer both. Once the body is complete, `receive()` (which then
    only reports a disconnect) waits as long as the app likes."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, timeout_s: float):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            exc = BodyTooLarge(self.max_body_bytes)
            await APIError(413, exc.detail, headers=exc.headers).response(
                scope["path"])(scope, receive, send)
            return
        body_done = False
        received = 0

        async def limited_receive() -> Message:
            nonlocal body_done, received
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                raise BodyTimeout(self.timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class _HeadersTooLarge(Exception):
    """Raised in a parser callback to stop httptools (see `header_limits_protocol`)."""


def header_limits_protocol(timeout_s: float, max_header_bytes: int = MAX_HEADER_BYTES,
                           write_timeout_s: float | None = WRITE_TIMEOUT_S
                           ) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header timeout of `timeout_s` seconds, a limit
    of `max_header_bytes` on a request's incomplete headers and a write timeout of
    `write_timeout_s` seconds (None: none) (see the module docstring); pass it as
    `uvicorn.Config(http=...)`."""

    class HeaderLimitsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _seen_cycle: Any = None
        _header_bytes = 0  # bytes received since the current request's headers began
        _parsed_header_bytes = 0  # the current request's URL and header lines, as parsed
        _headers_too_large = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                return
            if self.cycle is not None and self.cycle is not self._seen_cycle:
                self._seen_cycle = self.cycle  # a request's headers are complete
                self._header_bytes = 0
                self._disarm()
            elif self.cycle is None or self.cycle.response_complete:
                # bytes of the next request's headers: they must finish in time and in size
                self._header_bytes += len(data)
                if self._header_bytes > max_header_bytes:
                    self.send_400_response(
                        f"Request headers are larger than {max_header_bytes} bytes.")
                    return
                self._arm()

        # headers that arrive complete in one read never reach the count above: count what
        # the parser hands over, and stop it (uvicorn then answers 400) past the limit
        def on_message_begin(self) -> None:
            self._parsed_header_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count_parsed(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_parsed(len(name) + len(value) + 4)  # "name: value\r\n"
            super().on_header(name, value)

        def _count_parsed(self, n: int) -> None:
            self._parsed_header_bytes += n
            if self._parsed_header_bytes > max_header_bytes:
                self._headers_too_large = True
                raise _HeadersTooLarge  # httptools stops; uvicorn calls send_400_response

        def send_400_response(self, msg: str) -> None:
            if self._headers_too_large:
                msg = f"Request headers are larger than {max_header_bytes} bytes."
            super().send_400_response(msg)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._stop_write_timer()
            super().connection_lost(exc)

        # the write timeout: armed while uvicorn's writes are paused, or while the
        # connection closes with bytes unsent (the transport would wait for them forever)
        _write_timer: asyncio.TimerHandle | None = None

        def pause_writing(self) -> None:
            super().pause_writing()
            self._start_write_timer()

        def resume_writing(self) -> None:
            super().resume_writing()
            self._stop_write_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._unsent_check()

        def timeout_keep_alive_handler(self) -> None:
            super().timeout_keep_alive_handler()
            self._unsent_check()

        def _unsent_check(self) -> None:
            # closing (no further request on it) with bytes the client has not taken
            if self.transport.is_closing() and self.transport.get_write_buffer_size() > 0:
                self._start_write_timer()

        def _start_write_timer(self) -> None:
            if write_timeout_s is not None and self._write_timer is None:
                self._write_timer = self.loop.call_later(write_timeout_s, self._write_expired)

        def _stop_write_timer(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_expired(self) -> None:
            self._write_timer = None
            if self.transport.get_write_buffer_size() == 0 and not self.flow.write_paused:
                return  # the unsent bytes went out meanwhile
            log.info("dropped a client that read nothing for %g s: %s", write_timeout_s,
                     self.client)
            self.transport.abort()

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and not self.transport.is_closing():
                self.transport.close()

    return HeaderLimitsProtocol


def uvicorn_options(header_timeout_s: float = HEADER_TIMEOUT_S,
                    keep_alive_s: int = KEEP_ALIVE_S,
                    write_timeout_s: float | None = WRITE_TIMEOUT_S) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.Config`: the limits' httptools protocol (header and
    write timeouts, seconds; a write timeout of None: none) and the keep-alive timeout
    (seconds)."""
    return {"http": header_limits_protocol(header_timeout_s, write_timeout_s=write_timeout_s),
            "timeout_keep_alive": keep_alive_s}
