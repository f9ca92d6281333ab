"""A misbehaving prefill worker for the decode box's fault tests: it speaks the real
handshake (`app.disagg.handshake`) and then breaks the protocol in one chosen way. Runs its
own event loop in a thread on a free loopback port."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from app.disagg import wire
from app.disagg.handshake import server_handshake
from app.disagg.wire import FrameType, KVChunk

BEHAVIOURS = ("garbage", "version", "fingerprint", "secret", "forged_length", "checksum",
              "busy", "stall")


class FakeWorker:
    """behaviour: one of BEHAVIOURS. fingerprint: the model's real fingerprint (the
    "fingerprint" behaviour changes its weights_digest). shape: (n_layers, kv_heads,
    head_dim)."""

    def __init__(self, behaviour: str, fingerprint, shape, secret: bytes = b""):
        assert behaviour in BEHAVIOURS
        self.behaviour = behaviour
        self.fingerprint = fingerprint
        if behaviour == "fingerprint":
            self.fingerprint = dataclasses.replace(fingerprint, weights_digest="0" * 64)
        self.secret = b"not-the-shared-secret" if behaviour == "secret" else secret
        self.shape = shape
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def _handle(self, reader, writer):
        self.connections += 1
        try:
            await self._misbehave(reader, writer)
        except (wire.ProtocolError, ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _misbehave(self, reader, writer):
        b = self.behaviour
        if b == "garbage":
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + bytes(range(256)))
            await writer.drain()
            return
        if b == "version":
            await wire.read_frame(reader)  # HELLO
            frame = wire.encode(FrameType.READY, {})
            writer.write(frame[:4] + bytes([wire.PROTOCOL_VERSION + 1]) + frame[5:])
            await writer.drain()
            await reader.read()  # until the decode box hangs up
            return
        session = await server_handshake(reader, writer, self.secret, self.fingerprint)
        key = session.key
        prefill = await wire.read_frame(reader, key)
        h = prefill.header
        n_layers, heads, dim = self.shape
        n = min(8, len(h["tokens"]) - h["start"])
        zeros = bytes(n * heads * dim * 2)
        chunk = KVChunk(h["request"], 0, 0, h["start"], n, heads, dim, zeros, zeros)
        parts = wire.encode_kv(chunk, key)
        if b == "busy":
            parts = wire.encode_parts(FrameType.ERROR, {"code": "busy", "message": "busy"},
                                      key=key)
        elif b == "forged_length":  # declares 8 GiB: refused before anything is allocated
            prefix = wire.PREFIX.unpack(parts[0])
            parts[0] = wire.PREFIX.pack(*prefix[:5], 8 << 30)
        elif b == "checksum":  # one bit of V flipped in transit
            parts[3] = bytes([parts[3][0] ^ 1]) + bytes(parts[3][1:])
        elif b == "stall":
            await asyncio.sleep(3600)
        writer.writelines(parts)
        await writer.drain()
        await reader.read()

    def close(self):
        async def shutdown():
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            await asyncio.sleep(0.05)  # let the cancelled handlers close their writers

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


__all__ = ["BEHAVIOURS", "FakeWorker"]
