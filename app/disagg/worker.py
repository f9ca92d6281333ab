"""`tandem prefill-worker`'s server: prefill prompts for decode boxes, stream their KV.

One connection per request: handshake (`handshake.server_handshake`), one PREFILL, a QUEUE
frame (the work ahead of it), then KV frames chunk by chunk as the engine computes them,
then DONE, then close.

Several decode boxes share the worker. Every admitted prompt becomes a request of one
batched `LLMEngine` (`max_prompts` sequence slots; the scheduler serves running prompts
oldest first and admits the next ones while its step budget lasts, so prompts are prefilled
in arrival order and a prompt's tail shares its step with the next one's head); prompts
beyond the slots wait in the engine's queue. At most `max_prompts + max_queue` prompts are
admitted at once (computing, queued, or still sending their KV); one more gets ERROR "busy"
at once and the decode box prefills locally.

One driver task steps the engine on one executor thread; right after each step it exports
the KV of every position computed for each prompt (the slot still holds it) and, once a
prompt is computed, aborts its request, so its slot is free for the next prompt whatever
its peer does (full blocks stay in the prefix cache: a system prompt the worker has seen is
not recomputed). Each connection sends its exported chunks while the engine computes the
next ones (llama.cpp releases the GIL), so transfer overlaps compute. A prompt becomes a
request with `max_tokens=2`, so computing its last position does not finish it and free
its slot before the export.

No peer can hold the worker (docs/two-box.md, "Deadlines"): the handshake and PREFILL must
arrive within `handshake_timeout_s`; every frame written must be taken by the peer within
`write_timeout_s`, or the peer is dropped (a peer that stops reading: its request aborted,
its buffered KV released, its socket aborted); at most `max_handshakes` connections are in
the handshake at once, one more gets ERROR "busy" and is closed; TCP keepalive
(`keepalive.set_keepalive`) drops a peer whose machine or link died.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from app.disagg.handshake import server_handshake
from app.disagg.keepalive import set_keepalive
from app.disagg.peer import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_MAX_HANDSHAKES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_WRITE_TIMEOUT_S,
)
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


class _Stalled(Exception):
    """The peer took no frame within the write deadline."""


@dataclass(eq=False)
class _Job:
    """One admitted prompt. The driver (executor thread) fills `chunks` and the progress
    fields; the connection's task (event loop) sends and pops them."""

    rid: str
    request: int  # the peer's number, echoed in every frame
    tokens: list[int]
    start: int
    chunk_tokens: int
    exported: int  # next position to export
    progress: int = 0  # positions with KV so far
    computed: int = 0  # positions computed here (not found in the prefix cache)
    chunks: deque = field(default_factory=deque)  # (first position, per-layer (K, V))
    started: float | None = None  # perf_counter of the first step that gave it KV
    finished: float | None = None  # ... of the step that completed it
    error: str | None = None  # the engine failed it
    added: bool = False  # its request is in the engine
    aborted: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # new chunks, or the end
    gone: bool = False  # the peer cancelled or hung up

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None or self.aborted


class PrefillWorker:
    """Args:
        engine: the worker's engine (not shared with anything else); its slots are the
            prompts prefilled together.
        fingerprint: this model's, sent in the handshake.
        secret: the shared secret (b"" on loopback without one).
        handshake_timeout_s: a peer must finish the handshake and send its PREFILL within
            this (a silent or garbage peer is dropped).
        max_payload: largest frame accepted (bytes).
        threads: this worker's CPU threads, told to the decode box in the handshake (it
            warns when both run on one machine and over-subscribe its cores).
        max_queue: prompts admitted beyond the engine's slots (they wait in its queue).
        max_handshakes: connections in the handshake at once; one more is refused at once.
        write_timeout_s: the most seconds the peer may take to accept one frame.
    Each finished request is logged (info) in one line: outcome, tokens sent, tokens
    computed, KV bytes, seconds and GB/s, e.g. "prefill for 127.0.0.1:35184: done: 2047
    tokens sent (2047 computed), 47.2 MB of KV in 14.61 s, 0.003 GB/s".
    `counters` counts requests by outcome ("done", "cancelled", "busy", "stalled",
    "handshake_limit", "peer_error", "bad_request", "failed") for logs and tests;
    `connections` is the number of open connections, `admitted` of admitted prompts and
    `peak_admitted` its highest value.
    """

    def __init__(self, engine: LLMEngine, fingerprint: ModelFingerprint, secret: bytes,
                 handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
                 max_payload: int = MAX_PAYLOAD_BYTES, threads: int | None = None,
                 max_queue: int = DEFAULT_MAX_QUEUE,
                 max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
                 write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S):
        if max_queue < 0 or max_handshakes < 1 or not write_timeout_s > 0 \
                or not handshake_timeout_s > 0:
            raise ValueError("max_queue must be >= 0, max_handshakes >= 1 and the timeouts "
                             "> 0")
        self.engine = engine
        self.threads = threads
        # the KV dtype sent (f16 or q8_0, the runner's cache); the decode box must load the same
        self.kv_cache_type = getattr(engine.runner, "kv_cache_type", "f16")
        self.exact = getattr(engine.runner, "exact", False)  # the decode box's must be equal
        self.fingerprint = fingerprint
        self.secret = secret
        self.handshake_timeout_s = handshake_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_payload = max_payload
        self.max_prompts = engine.scheduler.config.max_num_seqs  # capped to its slots
        self.max_admitted = self.max_prompts + max_queue
        self.max_handshakes = max_handshakes
        self.counters: dict[str, int] = {}
        self.connections = 0
        self.admitted = 0
        self.peak_admitted = 0
        self._handshaking = 0
        self._jobs: dict[str, _Job] = {}  # admitted, by request id (event loop's)
        self._engine_jobs: list[_Job] = []  # whose requests are in the engine (executor's)
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._ids = itertools.count()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tandem-prefill")

    def _count(self, outcome: str) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + 1

    async def serve(self, host: str, port: int) -> asyncio.Server:
        """Start listening (TCP). Raises OSError if the address cannot be bound."""
        self._start_driver()
        return await asyncio.start_server(self.handle, host, port)

    def _start_driver(self) -> None:
        if self._driver is None:
            self._wake = asyncio.Event()
            self._driver = asyncio.create_task(self._drive(), name="tandem-prefill-driver")

    def close(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
        self._executor.shutdown(wait=True)
        self.engine.close()

    # -- a connection ----------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One decode box's connection. Never raises: a bad peer only loses its connection."""
        addr = writer.get_extra_info("peername") or ("?", 0)
        peer = f"{addr[0]}:{addr[1]}"
        sock = writer.get_extra_info("socket")
        if sock is not None:
            set_keepalive(sock)
        self.connections += 1
        clean = False
        try:
            if self._handshaking >= self.max_handshakes:
                self._count("handshake_limit")
                log.info("peer %s refused: %d connections already in the handshake", peer,
                         self._handshaking)
                # untagged, like any handshake ERROR; a few bytes the kernel takes at once
                writer.writelines(encode_parts(FrameType.ERROR, {
                    "code": "busy", "message": f"{self._handshaking} connections already in "
                    "the handshake; try again"}))
                clean = True
                return
            self._handshaking += 1
            try:
                async with asyncio.timeout(self.handshake_timeout_s):
                    session = await server_handshake(reader, writer, self.secret,
                                                     self.fingerprint, self.threads,
                                                     self.kv_cache_type, self.exact)
                    frame = await read_frame(reader, session.key, self.max_payload)
            finally:
                self._handshaking -= 1
            if frame.type != FrameType.PREFILL:
                raise ProtocolError("type", f"expected PREFILL, got {frame.type.name}")
            if self.admitted >= self.max_admitted:
                self._count("busy")
                await self._error(writer, session.key, "busy",
                                  f"{self.admitted} prompts admitted already (the most: "
                                  f"{self.max_admitted})")
                clean = True
                return
            self.admitted += 1
            self.peak_admitted = max(self.peak_admitted, self.admitted)
            summary: dict = {}
            try:
                outcome = await self._prefill(frame.header, reader, writer, session.key,
                                              summary)
            finally:
                self.admitted -= 1
            clean = outcome in ("done", "bad_request")
            self._count(outcome)
            log.info("prefill for %s: %s", peer, transfer_line(outcome, summary))
        except _Stalled as e:
            self._count("stalled")
            log.info("peer %s dropped: %s", peer, e)
        except (ProtocolError, TimeoutError, ConnectionError, OSError) as e:
            self._count("peer_error")
            log.info("peer %s dropped: %s", peer, e)
        except Exception:  # noqa: BLE001 - the worker keeps serving the next peer
            self._count("failed")
            log.exception("prefill for %s failed", peer)
        finally:
            await self._close(writer, clean)
            self.connections -= 1

    async def _close(self, writer: asyncio.StreamWriter, clean: bool) -> None:
        """Close after the last frame is flushed (within the write deadline); a dropped or
        stalled peer's socket is aborted at once (a plain close would wait, with its buffer,
        for a peer that never reads)."""
        if clean:
            writer.close()
            try:
                async with asyncio.timeout(self.write_timeout_s):
                    await writer.wait_closed()
                return
            except (TimeoutError, ConnectionError, OSError):
                pass
        writer.transport.abort()

    async def _send(self, writer, parts: list) -> None:
        """Write one frame; raises _Stalled if the peer does not take it in time."""
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await write_frame(writer, parts)
        except TimeoutError:
            raise _Stalled(f"took no frame for {self.write_timeout_s:g} s") from None

    async def _error(self, writer, key: bytes, code: str, message: str) -> None:
        await self._send(writer, encode_parts(FrameType.ERROR,
                                              {"code": code, "message": message}, key=key))

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _prefill(self, h: dict, reader, writer, key: bytes, summary: dict) -> str:
        """Admit one PREFILL, stream its KV as the driver exports it; returns the outcome.
        `summary` gets tokens sent, computed, bytes and seconds (for the log line)."""
        tokens, start, chunk_tokens = h["tokens"], h["start"], h["chunk_tokens"]
        n = len(tokens)
        if not 0 <= start < n or chunk_tokens < 1:
            await self._error(writer, key, "prefill", f"start {start} must be in 0..{n - 1} "
                              "and chunk_tokens at least 1")
            return "bad_request"
        try:
            self.engine.validate(tokens)  # reads only the model's limits: safe off its thread
        except ValueError as e:  # out-of-vocabulary ids, too long for this context
            await self._error(writer, key, "prefill", str(e))
            return "bad_request"
        self._start_driver()
        job = _Job(f"peer-{next(self._ids)}", h["request"], tokens, start, chunk_tokens,
                   exported=start)
        # ahead of it: the prompts admitted before it that are not computed yet (their
        # requests are added to the engine in this order: the executor runs calls in order)
        ahead = [j for j in self._jobs.values() if not j.done]
        self._jobs[job.rid] = job
        watcher = asyncio.create_task(self._watch(reader, key, job))
        t0 = time.perf_counter()
        chunks, frames, nbytes = 0, 0, 0
        summary.update(tokens=0, computed=0, bytes=0)
        try:
            # at once, before the engine (busy with a step) takes the request
            await self._send(writer, encode_parts(FrameType.QUEUE, {
                "request": job.request, "peers_ahead": len(ahead),
                "tokens_ahead": sum(j.n - j.progress for j in ahead)}, key=key))
            await self._run(self._add, job)
            self._wake.set()
            while not job.gone:
                while job.chunks and not job.gone:
                    first_pos, kv = job.chunks.popleft()
                    await self._send_chunk(writer, key, job.request, chunks, first_pos, kv)
                    chunks += 1
                    frames += len(kv)
                    nbytes += sum(k.nbytes + v.nbytes for k, v in kv)
                    summary.update(tokens=first_pos + len(kv[0][0]) - start,
                                   computed=job.computed, bytes=nbytes)
                if job.error is not None:
                    await self._error(writer, key, "prefill", job.error)
                    return "failed"
                if job.finished is not None and not job.chunks:
                    break
                job.ready.clear()
                await job.ready.wait()
            if job.gone:
                return "cancelled"
            summary["computed"] = job.computed
            prefill_us = int((job.finished - (job.started or job.finished)) * 1e6)
            await self._send(writer, encode_parts(FrameType.DONE, {
                "request": job.request, "chunks": chunks, "frames": frames, "bytes": nbytes,
                "computed": job.computed, "prefill_us": prefill_us}, key=key))
            return "done"
        finally:
            summary["seconds"] = time.perf_counter() - t0
            watcher.cancel()
            job.chunks.clear()  # a dropped peer's KV is released here
            if not job.done:  # (never added: abort is a no-op)
                await self._run(self._abort, job)  # frees its slot; full blocks stay cached
            self._jobs.pop(job.rid, None)

    async def _send_chunk(self, writer, key: bytes, request: int, chunk: int, first_pos: int,
                          kv) -> None:
        k0 = kv[0][0]
        if k0.ndim == 3:  # f16 `[n, kv_heads, head_dim]`
            n, heads, dim = k0.shape
        else:  # q8_0 blocks `[n, blocks]`: the heads are the model's
            info = self.engine.runner.info
            n, heads, dim = len(k0), info.n_kv_heads, info.head_dim
        for layer, (k, v) in enumerate(kv):
            await self._send(writer, encode_kv(KVChunk(
                request, chunk, layer, first_pos, n, heads, dim, _bytes(k), _bytes(v),
                self.kv_cache_type), key))

    async def _watch(self, reader, key: bytes, job: _Job) -> None:
        """Mark the job gone when the peer cancels, disappears or sends anything else."""
        try:
            while True:
                frame = await read_frame(reader, key, self.max_payload)
                if frame.type != FrameType.CANCEL or frame.header["request"] == job.request:
                    break
        except (ProtocolError, ConnectionError, OSError):
            pass
        job.gone = True
        job.ready.set()

    # -- the driver ------------------------------------------------------------------------

    async def _drive(self) -> None:
        """Step the engine while admitted prompts are in it; wake their connections after
        each step. An engine failure fails the prompts of that step, not the worker."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while any(j.added and not j.done for j in self._jobs.values()):
                try:
                    await self._run(self._advance)
                except Exception as e:  # noqa: BLE001 - the runner's errors end these prompts
                    log.exception("prefill step failed")
                    try:
                        await self._run(self._fail, f"the worker's engine failed: {e}")
                    except Exception:  # noqa: BLE001 - the driver must outlive the engine
                        log.exception("aborting the failed prompts failed")
                for job in list(self._jobs.values()):
                    job.ready.set()

    def _advance(self) -> None:
        """(executor) One engine step, then each prompt's new KV exported and every
        completed prompt's request aborted (its slot freed). Every prompt in the engine is
        seen after every step that may have computed it: a prompt left for the next step
        would decode past its end and finish, its KV gone."""
        t = time.perf_counter()
        result = self.engine.execute_step()
        now = time.perf_counter()
        for job in list(self._engine_jobs):
            r = self.engine.requests.get(job.rid)
            if r is None:
                job.error = "the worker's request ended before its prompt was computed"
                self._engine_jobs.remove(job)
                continue
            job.computed += len(result.computed.get(job.rid, range(0)))
            upto = min(r.num_computed_tokens, job.n)
            if upto > job.progress:
                job.progress = upto
                if job.started is None:
                    job.started = t
            while job.exported < upto:
                m = min(job.chunk_tokens, upto - job.exported)
                kv = self.engine.runner.export_kv(r.slot, r.block_table, job.exported, m)
                job.chunks.append((job.exported, kv))
                job.exported += m
            if job.exported >= job.n:
                self.engine.abort(job.rid)
                self._engine_jobs.remove(job)
                job.finished = now

    def _add(self, job: _Job) -> None:
        """(executor) Its request into the engine. Raises ValueError as `add_request`."""
        self.engine.add_request(job.rid, job.tokens, _PARAMS)
        self._engine_jobs.append(job)
        job.added = True

    def _abort(self, job: _Job) -> None:
        """(executor) The peer is gone: end its request wherever it is."""
        job.aborted = True
        self.engine.abort(job.rid)
        if job in self._engine_jobs:
            self._engine_jobs.remove(job)

    def _fail(self, message: str) -> None:
        """(executor) End every request after a failed step (its state is undefined)."""
        jobs, self._engine_jobs = self._engine_jobs, []
        for job in jobs:
            job.error = job.error or message
        for job in jobs:
            self.engine.abort(job.rid)


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
