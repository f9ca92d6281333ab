"""`tandem prefill-worker`'s server: prefill prompts for a decode box, stream their KV.

One connection per request: handshake (`handshake.server_handshake`), one PREFILL, then KV
frames chunk by chunk as the engine computes them, then DONE, then close. The engine runs in
one executor thread; while it computes chunk c+1 the event loop sends chunk c (llama.cpp
releases the GIL), so transfer overlaps compute. One prefill at a time: a second decode box
asking meanwhile gets ERROR "busy" at once and prefills locally (shared/notes/two-box.md §6).

The engine here is an ordinary `LLMEngine` with its own prefix cache, so a system prompt the
worker has seen is not recomputed. A prompt becomes a request with `max_tokens=2` (so
computing its last position does not finish it and free its slot before the export) and is
aborted when its KV has been sent, or as soon as the peer cancels or disappears.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from app.disagg.handshake import server_handshake
from app.disagg.wire import (
    MAX_PAYLOAD_BYTES,
    FrameType,
    KVChunk,
    ProtocolError,
    encode_kv,
    encode_parts,
    read_frame,
    write_frame,
)
from app.engine.engine import LLMEngine
from app.engine.types import SamplingParams
from models.fingerprint import ModelFingerprint

log = logging.getLogger("tandem.prefill_worker")

# greedy, never stopping at the prompt's end (see the module docstring)
_PARAMS = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, speculative=False)


def _bytes(a: np.ndarray) -> memoryview:
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1).data


class PrefillWorker:
    """Args:
        engine: the worker's engine (not shared with anything else).
        fingerprint: this model's, sent in the handshake.
        secret: the shared secret (b"" on loopback without one).
        handshake_timeout_s: a peer must finish the handshake and send its PREFILL within
            this (a silent or garbage peer is dropped).
        max_payload: largest frame accepted (bytes).
        threads: this worker's CPU threads, told to the decode box in the handshake (it
            warns when both run on one machine and over-subscribe its cores).
    Each finished request is logged (info) in one line: outcome, tokens sent, tokens
    computed, KV bytes, seconds and GB/s, e.g. "prefill for 127.0.0.1:35184: done: 2047
    tokens sent (2047 computed), 47.2 MB of KV in 14.61 s, 0.003 GB/s".
    `counters` counts requests by outcome ("done", "cancelled", "busy", "peer_error",
    "bad_request", "failed") for logs and tests.
    """

    def __init__(self, engine: LLMEngine, fingerprint: ModelFingerprint, secret: bytes,
                 handshake_timeout_s: float = 10.0, max_payload: int = MAX_PAYLOAD_BYTES,
                 threads: int | None = None):
        self.engine = engine
        self.threads = threads
        self.fingerprint = fingerprint
        self.secret = secret
        self.handshake_timeout_s = handshake_timeout_s
        self.max_payload = max_payload
        self.counters: dict[str, int] = {}
        self._busy = False
        self._ids = itertools.count()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tandem-prefill")

    def _count(self, outcome: str) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + 1

    async def serve(self, host: str, port: int) -> asyncio.Server:
        """Start listening (TCP). Raises OSError if the address cannot be bound."""
        return await asyncio.start_server(self.handle, host, port)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One decode box's connection. Never raises: a bad peer only loses its connection."""
        addr = writer.get_extra_info("peername") or ("?", 0)
        peer = f"{addr[0]}:{addr[1]}"
        try:
            async with asyncio.timeout(self.handshake_timeout_s):
                session = await server_handshake(reader, writer, self.secret, self.fingerprint,
                                                 self.threads)
                frame = await read_frame(reader, session.key, self.max_payload)
            if frame.type != FrameType.PREFILL:
                raise ProtocolError("type", f"expected PREFILL, got {frame.type.name}")
            if self._busy:
                self._count("busy")
                await self._error(writer, session.key, "busy", "prefilling for another peer")
                return
            self._busy = True
            summary: dict = {}
            try:
                outcome = await self._prefill(frame.header, reader, writer, session.key,
                                              summary)
            finally:
                self._busy = False
            self._count(outcome)
            log.info("prefill for %s: %s", peer, transfer_line(outcome, summary))
        except (ProtocolError, TimeoutError, ConnectionError, OSError) as e:
            self._count("peer_error")
            log.info("peer %s dropped: %s", peer, e)
        except Exception:  # noqa: BLE001 - the worker keeps serving the next peer
            self._count("failed")
            log.exception("prefill for %s failed", peer)
        finally:
            writer.close()

    async def _error(self, writer, key: bytes, code: str, message: str) -> None:
        await write_frame(writer, encode_parts(FrameType.ERROR,
                                               {"code": code, "message": message}, key=key))

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _prefill(self, h: dict, reader, writer, key: bytes, summary: dict) -> str:
        """Prefill one PREFILL request and stream its KV; returns the outcome. `summary`
        gets tokens sent, computed, bytes and seconds (for the log line)."""
        tokens, start, chunk_tokens = h["tokens"], h["start"], h["chunk_tokens"]
        n = len(tokens)
        if not 0 <= start < n or chunk_tokens < 1:
            await self._error(writer, key, "prefill", f"start {start} must be in 0..{n - 1} "
                              "and chunk_tokens at least 1")
            return "bad_request"
        rid = f"peer-{next(self._ids)}"
        try:
            await self._run(self.engine.add_request, rid, tokens, _PARAMS)
        except ValueError as e:  # out-of-vocabulary ids, too long for this context
            await self._error(writer, key, "prefill", str(e))
            return "bad_request"
        gone = asyncio.Event()
        watcher = asyncio.create_task(self._watch(reader, key, h["request"], gone))
        sending: asyncio.Task | None = None
        t0 = time.perf_counter()
        sent, chunks, frames, nbytes, computed = start, 0, 0, 0, 0
        summary.update(tokens=0, computed=0, bytes=0)
        try:
            while sent < n and not gone.is_set():
                upto, new = await self._run(self._step, rid, n)
                computed += new
                summary.update(tokens=sent - start, computed=computed, bytes=nbytes)
                while sent < upto and not gone.is_set():
                    m = min(chunk_tokens, upto - sent)
                    kv = await self._run(self._export, rid, sent, m)
                    if sending is not None:
                        await sending  # chunks go out in order; raises if the peer is gone
                    sending = asyncio.create_task(
                        self._send_chunk(writer, key, h["request"], chunks, sent, kv))
                    chunks += 1
                    frames += len(kv)
                    nbytes += sum(k.nbytes + v.nbytes for k, v in kv)
                    sent += m
                    summary.update(tokens=sent - start, computed=computed, bytes=nbytes)
            prefill_us = int((time.perf_counter() - t0) * 1e6)
            if sending is not None:
                await sending
            if gone.is_set():
                return "cancelled"
            await write_frame(writer, encode_parts(FrameType.DONE, {
                "request": h["request"], "chunks": chunks, "frames": frames, "bytes": nbytes,
                "computed": computed, "prefill_us": prefill_us}, key=key))
            return "done"
        finally:
            summary["seconds"] = time.perf_counter() - t0
            watcher.cancel()
            if sending is not None and not sending.done():
                sending.cancel()
            await self._run(self.engine.abort, rid)  # frees the slot; full blocks stay cached

    def _step(self, rid: str, n: int) -> tuple[int, int]:
        """One engine step: (positions of `rid` with KV now, of them computed this step)."""
        result = self.engine.execute_step()
        r = self.engine.requests.get(rid)
        if r is None:
            raise RuntimeError("the worker's request ended before its prompt was computed")
        span = result.computed.get(rid, range(0))
        return min(r.num_computed_tokens, n), len(span)

    def _export(self, rid: str, start: int, m: int):
        r = self.engine.requests[rid]
        return self.engine.runner.export_kv(r.slot, r.block_table, start, m)

    async def _send_chunk(self, writer, key: bytes, request: int, chunk: int, first_pos: int,
                          kv) -> None:
        n, heads, dim = kv[0][0].shape
        for layer, (k, v) in enumerate(kv):
            parts = encode_kv(KVChunk(request, chunk, layer, first_pos, n, heads, dim,
                                      _bytes(k), _bytes(v)), key)
            await write_frame(writer, parts)

    async def _watch(self, reader, key: bytes, request: int, gone: asyncio.Event) -> None:
        """Set `gone` when the peer cancels, disappears or sends anything else."""
        try:
            while True:
                frame = await read_frame(reader, key, self.max_payload)
                if frame.type == FrameType.CANCEL and frame.header["request"] == request:
                    break
                if frame.type != FrameType.CANCEL:
                    break
        except (ProtocolError, ConnectionError, OSError):
            pass
        gone.set()


def transfer_line(outcome: str, summary: dict) -> str:
    """The log line's text after the peer: the outcome, then (once the prefill started)
    tokens sent, tokens computed here (fewer when this worker's prefix cache had the start), KV
    bytes (MB = 1e6 B), seconds from the request to its last frame, and bytes / seconds in
    GB/s (1e9 B/s: what the link carried on average, compute included)."""
    if "seconds" not in summary:  # refused before any work
        return outcome
    seconds = summary["seconds"]
    rate = summary["bytes"] / seconds / 1e9 if seconds > 0 else 0.0
    return (f"{outcome}: {summary['tokens']} tokens sent ({summary['computed']} computed), "
            f"{summary['bytes'] / 1e6:.1f} MB of KV in {seconds:.2f} s, {rate:.3f} GB/s")
