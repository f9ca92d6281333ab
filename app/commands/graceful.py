"""How `tandem serve` starts listening and stops: the port is bound before the model loads
(a busy port is one line, not a banner and then uvicorn's `[Errno 98]`), the banner is
printed once uvicorn listens, and Ctrl+C / SIGTERM stop gracefully.

A graceful stop, built on uvicorn's own shutdown: new connections are refused at once and
idle ones closed (an idle server exits at once); running requests get `grace_s` seconds to
finish; then `on_grace_expired` ends the rest (`ServerContext.end_streams`: each open stream
gets an error event and `[DONE]` at once, whatever the engine is computing). A connection
still open `END_MARGIN_S` later is a client that does not read those last bytes: it is
dropped (its transport aborted), so every request task ends by itself and uvicorn, which
waits `DROP_MARGIN_S` more, never has to cancel one (that printed "Cancel N running
task(s)" and a CancelledError traceback, and cut the streams without a word). The process
exits 0: uvicorn re-raises a caught signal after its shutdown, which this server does not.
A second Ctrl+C quits at once.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

END_MARGIN_S = 2.0  # seconds for ended streams to send their error event and [DONE]
DROP_MARGIN_S = 1.0  # seconds for the tasks of dropped connections to end


class PortInUseError(OSError):
    """Another process listens on the port."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), as uvicorn binds one (SO_REUSEADDR), not yet
    listening. Raises PortInUseError ("port 8000 is in use") or the OSError of the bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(exc.errno, f"port {port} is in use") from None
        raise
    return sock


class GracefulServer(uvicorn.Server):
    """`uvicorn.Server` that calls `on_listening()` once it listens and `on_grace_expired()`
    `grace_s` seconds into a shutdown (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, grace_s: float,
                 on_grace_expired: Callable[[], object], on_listening: Callable[[], object]):
        config.timeout_graceful_shutdown = int(grace_s + END_MARGIN_S + DROP_MARGIN_S + 0.999)
        super().__init__(config)
        self.grace_s = grace_s
        self.on_grace_expired = on_grace_expired
        self.on_listening = on_listening

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's, without recording the signal to re-raise it after the shutdown
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_listening()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        timers = [loop.call_later(self.grace_s, self.on_grace_expired),
                  loop.call_later(self.grace_s + END_MARGIN_S, self.drop_connections)]
        try:
            await super().shutdown(sockets)
        finally:
            for timer in timers:
                timer.cancel()

    def drop_connections(self) -> int:
        """Abort every connection still open (see the module docstring); returns how many."""
        connections = list(self.server_state.connections)
        for connection in connections:
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        return len(connections)
