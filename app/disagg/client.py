"""The decode box's two-box client: `app.engine.remote_prefill.RemotePrefill` over TCP.

It runs its own event loop in a thread ("tandem-kv-client"), so frames are read, verified
and assembled without touching the step thread, which keeps decoding the other streams.
Per remote prefill: connect (TCP keepalive on), handshake, PREFILL, then the worker's QUEUE
frame (the prompts ahead of this one: the policy may send the prompt back here at once,
`PrefillPolicy.decide_queue`, and the first-frame deadline grows by the predicted wait),
then KV frames; a chunk whose frames have all arrived verified (each frame's HMAC tag, the
layer order, positions and shape checked) is handed to the step thread at once
(`sink.remote_kv`), so imports overlap the peer's compute; DONE's counts are checked
against what arrived before `sink.remote_end(ok=True)`.

Any failure (refused connection, deadline, handshake or fingerprint mismatch, bad tag, a
forged or short frame, the peer's ERROR or death) ends the transfer with
`sink.remote_end(ok=False, reason)`: the chunks already imported stay, the rest is
prefilled locally, and the policy's circuit breaker backs off (`policy.PrefillPolicy`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from app.disagg.handshake import client_handshake
from app.disagg.keepalive import set_keepalive
from app.disagg.peer import PeerConfig, cpu_threads, is_this_host, thread_warning
from app.disagg.policy import PrefillPolicy
from app.disagg.wire import (
    MAX_PAYLOAD_BYTES,
    FrameType,
    ProtocolError,
    decode_kv,
    encode_parts,
    read_frame,
    write_frame,
)
from app.engine.remote_prefill import RemoteJob, RemoteOutcome
from backends.base import KV_TRANSFER_DTYPES, kv_row_bytes, kv_shape
from models.fingerprint import ModelFingerprint
from models.store import store_dir

log = logging.getLogger("tandem.two_box")

# ProtocolError codes -> fallback reasons counted in /metrics
_TRUNCATED = "peer_closed"


class KVSink(Protocol):
    """Where verified chunks go: the step thread's inbox (`AsyncEngine`)."""

    def remote_kv(self, request_id: str, start: int, kv: list) -> None: ...

    def remote_end(self, request_id: str, outcome: RemoteOutcome) -> None: ...


@dataclass(slots=True)
class _Connection:
    """One transfer's socket and session key, once it has them (for CANCEL and close)."""

    writer: asyncio.StreamWriter | None = None
    key: bytes | None = None


class _Deadline(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class PrefillClient:
    """Args:
        peer: address, secret, deadlines, policy settings.
        fingerprint: the local model's (the peer must match it field by field).
        n_layers, n_kv_heads, head_dim: the local KV shape every chunk must have.
        kv_cache_type: the local KV dtype ("f16" or "q8_0"); the worker's must be the same
            (refused in the handshake otherwise) and every chunk comes in it.
        exact: whether this box runs exact mode; the worker must too (refused otherwise).
        sink: receives chunks and outcomes (set later with `attach` if None).
    `policy` holds the estimates; `counters` counts outcomes ("ok", or the failure reason).
    The first handshake with a worker on this machine compares its threads with this
    process's and logs `peer.thread_warning` (once) when the two exceed the cores.
    """

    def __init__(self, peer: PeerConfig, fingerprint: ModelFingerprint, n_layers: int,
                 n_kv_heads: int, head_dim: int, sink: KVSink | None = None,
                 max_payload: int = MAX_PAYLOAD_BYTES, kv_cache_type: str = "f16",
                 exact: bool = False):
        self.peer = peer
        self.fingerprint = fingerprint
        self.shape = (n_layers, n_kv_heads, head_dim)
        self.kv_cache_type = kv_cache_type
        self.exact = exact
        self.sink = sink
        self.max_payload = max_payload
        self.policy = PrefillPolicy(
            peer.policy, 2 * n_layers * kv_row_bytes(kv_cache_type, n_kv_heads * head_dim))
        self._estimates_path = _estimates_path(peer, fingerprint, kv_cache_type)
        try:
            self.policy.load_estimates(json.loads(self._estimates_path.read_text()))
        except (OSError, ValueError, AttributeError):
            pass  # none yet: the policy probes
        self.counters: dict[str, int] = {}
        self.same_host = is_this_host(peer.host)
        self._threads_checked = False
        self._jobs: dict[str, Future] = {}
        self._next_request = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tandem-kv-client",
                                        daemon=True)
        self._thread.start()

    def attach(self, sink: KVSink) -> None:
        self.sink = sink

    # -- RemotePrefill (called on the step thread) -----------------------------------------

    def decide(self, num_tokens: int, num_cached: int) -> tuple[bool, str, dict]:
        return self.policy.decide_detail(num_tokens, num_cached)

    def observe_local(self, num_tokens: int, seconds: float) -> None:
        self.policy.observe_local(num_tokens, seconds)

    def observe_import(self, num_tokens: int, seconds: float) -> None:
        self.policy.observe_import(num_tokens, seconds)

    def begin(self, job: RemoteJob) -> None:
        self._next_request += 1
        fut = asyncio.run_coroutine_threadsafe(self._transfer(job, self._next_request),
                                               self._loop)
        self._jobs[job.request_id] = fut
        fut.add_done_callback(lambda _: self._jobs.pop(job.request_id, None))

    def cancel(self, request_id: str) -> None:
        fut = self._jobs.pop(request_id, None)
        if fut is not None:
            fut.cancel()  # cancels the task in the client's loop; it sends CANCEL

    def save_estimates(self) -> None:
        """Keep the policy's measured speeds for the next process (best effort)."""
        try:
            self._estimates_path.parent.mkdir(parents=True, exist_ok=True)
            self._estimates_path.write_text(json.dumps(self.policy.estimates(), indent=1))
        except OSError:
            pass

    def close(self) -> None:
        self.save_estimates()
        for request_id in list(self._jobs):
            self.cancel(request_id)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    # -- the transfer (client thread) ------------------------------------------------------

    def _count(self, outcome: str) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + 1

    async def _transfer(self, job: RemoteJob, request: int) -> None:
        stats: dict = {"bytes": 0, "frames": 0, "chunks": 0}
        conn = _Connection()
        try:
            await self._stream(job, request, stats, conn)
            outcome = RemoteOutcome(True, "ok", stats)
            self.policy.observe_remote(stats)
        except asyncio.CancelledError:
            if conn.key is not None:
                try:  # tell the worker to free the request; best effort
                    await asyncio.wait_for(write_frame(conn.writer, encode_parts(
                        FrameType.CANCEL, {"request": request}, key=conn.key)), 0.5)
                except (Exception, asyncio.CancelledError):  # noqa: BLE001
                    pass
            self._count("cancelled")
            raise
        except Exception as e:  # noqa: BLE001 - every failure falls back to local prefill
            reason = _reason(e)
            stats["detail"] = str(e)
            log.warning("remote prefill failed (%s): %s; prefilling locally", reason, e)
            self.policy.observe_failure(reason)
            outcome = RemoteOutcome(False, reason, stats)
        finally:
            if conn.writer is not None:
                conn.writer.close()
        if outcome.ok:
            log.info("remote prefill of %d tokens: %.1f MB in %.3f s (worker %.3f s, "
                     "first frame at %.0f%%), link %.2f GB/s, overlap %.2f",
                     len(job.token_ids) - job.start, stats["bytes"] / 1e6,
                     stats["transfer_s"], stats["worker_prefill_s"],
                     100 * (stats.get("first_frame_fraction") or 0),
                     stats.get("link_gbps") or 0, stats.get("overlap") or 0)
        self._count("ok" if outcome.ok else outcome.reason)
        self.sink.remote_end(job.request_id, outcome)

    async def _stream(self, job: RemoteJob, request: int, stats: dict,
                      conn: _Connection) -> None:
        p = self.peer
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(p.connect_timeout_s):
                reader, writer = await asyncio.open_connection(p.host, p.port)
                conn.writer = writer
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    set_keepalive(sock)
                session = await client_handshake(reader, writer, p.secret, self.fingerprint,
                                                 cpu_threads(p.threads), self.kv_cache_type,
                                                 self.exact)
        except TimeoutError:
            raise _Deadline("connect_timeout", f"no handshake with {p.host}:{p.port} within "
                        f"{p.connect_timeout_s} s") from None
        self._check_threads(session.peer_threads)
        key = conn.key = session.key
        stats["setup_s"] = time.perf_counter() - t0
        n_layers, heads, dim = self.shape
        try:  # a worker that stops reading cannot hold this transfer either
            async with asyncio.timeout(p.first_frame_timeout_s):
                await write_frame(writer, encode_parts(FrameType.PREFILL, {
                    "request": request, "start": job.start, "tokens": job.token_ids,
                    "chunk_tokens": p.policy.chunk_tokens}, key=key))
        except TimeoutError:
            raise _Deadline("first_frame_timeout", f"the peer took no prompt within "
                            f"{p.first_frame_timeout_s} s") from None
        t_sent = time.perf_counter()
        pos, chunk, layers = job.start, 0, []
        arrivals: list[tuple[float, int]] = []  # (seconds since PREFILL, bytes)
        burst_bps: list[float] = []  # per chunk: bytes after its first frame / seconds
        chunk_t0 = last_chunk_at = slowest_chunk = 0.0
        # the worker computes a chunk before the first frame: allow twice the time its
        # measured speed predicts for one, on top of the fixed deadline
        rate = self.policy.remote_rate
        first_chunk = min(len(job.token_ids), p.policy.chunk_tokens) / rate if rate else 0.0
        timeout, reason = p.first_frame_timeout_s + 2 * first_chunk, "first_frame_timeout"
        while True:
            try:
                async with asyncio.timeout(timeout):
                    frame = await read_frame(reader, key, self.max_payload)
            except TimeoutError:
                stats["deadline_s"] = timeout
                raise _Deadline(reason, f"no frame from the peer within {timeout:.1f} s") \
                    from None
            now = time.perf_counter() - t_sent
            if frame.type == FrameType.QUEUE and "queue_tokens" not in stats \
                    and not stats["frames"]:  # only as the first answer to PREFILL
                timeout, reason = self._queued(job, request, frame.header, stats), \
                    "first_frame_timeout"
                last_chunk_at = now  # the queue wait is not a chunk's compute time
                continue
            if not layers:  # a chunk starts: the worker computed it since the last one
                slowest_chunk = max(slowest_chunk, now - last_chunk_at)
                last_chunk_at = now
            # a later chunk may take a little longer (attention grows): allow twice the
            # slowest so far on top of the fixed gap
            timeout, reason = p.frame_timeout_s + 2 * slowest_chunk, "frame_timeout"
            if frame.type == FrameType.ERROR:
                raise ProtocolError("peer", f"peer: {frame.header['message']}",
                                    detail=frame.header["code"])
            if frame.type == FrameType.DONE:
                self._check_done(frame.header, request, stats, pos, len(job.token_ids),
                                 bool(layers))
                break
            if frame.type != FrameType.KV:
                raise ProtocolError("type", f"unexpected {frame.type.name} frame")
            kv = decode_kv(frame)
            want = (request, chunk, len(layers), pos, heads, dim, self.kv_cache_type)
            got = (kv.request, kv.chunk, kv.layer, kv.first_pos, kv.kv_heads, kv.head_dim,
                   kv.dtype)
            if got != want or kv.n_tokens < 1 or (layers and kv.n_tokens != len(layers[0][0])) \
                    or pos + kv.n_tokens > len(job.token_ids):
                raise ProtocolError("sequence", f"KV frame (request, chunk, layer, first_pos, "
                                    f"kv_heads, head_dim, dtype) = {got}, expected {want}")
            shape = kv_shape(kv.dtype, kv.n_tokens, heads, dim)
            dtype = KV_TRANSFER_DTYPES[kv.dtype]
            layers.append((np.frombuffer(kv.k, dtype).reshape(shape),
                           np.frombuffer(kv.v, dtype).reshape(shape)))
            size = len(frame.payload)
            stats["bytes"] += size
            stats["frames"] += 1
            arrivals.append((now, size))
            if "first_frame_s" not in stats:
                stats["first_frame_s"] = now
            if len(layers) == 1:
                chunk_t0, chunk_bytes = now, 0
            else:
                chunk_bytes += size
            if len(layers) == n_layers:
                if now > chunk_t0 and chunk_bytes:
                    burst_bps.append(chunk_bytes / (now - chunk_t0))
                self.sink.remote_kv(job.request_id, pos, layers)
                pos += kv.n_tokens
                chunk += 1
                layers = []
                stats["chunks"] = chunk
        done = time.perf_counter() - t_sent
        stats["transfer_s"] = done
        _derive(stats, arrivals, burst_bps, done)

    def _queued(self, job: RemoteJob, request: int, h: dict, stats: dict) -> float:
        """The worker's QUEUE frame: ask the policy whether to wait for the prompts ahead
        (raises _Deadline("worker_queue") if this box prefills sooner; the closed connection
        frees the place) and return the deadline for the first KV frame: the fixed one plus
        twice the predicted wait and first chunk (with no measured speed yet, the fixed one
        once more per prompt ahead)."""
        if h["request"] != request:
            raise ProtocolError("sequence", f"QUEUE for request {h['request']}, expected "
                                f"{request}")
        stats["queue_peers"], stats["queue_tokens"] = h["peers_ahead"], h["tokens_ahead"]
        n_total = len(job.token_ids)
        go, numbers = self.policy.decide_queue(n_total, n_total - job.start,
                                               h["tokens_ahead"])
        stats.update(numbers)
        if not go:
            raise _Deadline("worker_queue", f"{h['peers_ahead']} prompts ahead on the worker "
                            f"({h['tokens_ahead']} tokens): prefilling here is sooner")
        p = self.peer
        rate = self.policy.remote_rate
        if rate is None:
            return p.first_frame_timeout_s * (1 + h["peers_ahead"])
        first_chunk = min(n_total, p.policy.chunk_tokens) / rate
        return p.first_frame_timeout_s + 2 * (first_chunk + numbers["wait_s"])

    def _check_threads(self, peer_threads: int | None) -> None:
        """Warn once if the worker shares this machine and the two over-subscribe it."""
        if self._threads_checked or not self.same_host or peer_threads is None:
            return
        self._threads_checked = True
        p = self.peer
        line = thread_warning(p.host, p.port, cpu_threads(p.threads), peer_threads,
                              os.cpu_count() or 1)
        if line is not None:
            log.warning(line)

    def _check_done(self, h: dict, request: int, stats: dict, pos: int, n: int,
                    partial: bool) -> None:
        got = (h["request"], h["chunks"], h["frames"], h["bytes"])
        want = (request, stats["chunks"], stats["frames"], stats["bytes"])
        if got != want or partial or pos != n:
            raise ProtocolError("count", f"DONE says (request, chunks, frames, bytes) = {got}; "
                                f"received {want}, positions up to {pos} of {n}")
        stats["worker_prefill_s"] = h["prefill_us"] / 1e6
        stats["worker_tokens"] = h["computed"]


def _estimates_path(peer: PeerConfig, fingerprint: ModelFingerprint,
                    kv_cache_type: str = "f16") -> Path:
    """Where the policy's estimates for this peer, model and KV type are kept (a q8_0
    transfer and import run at other rates): the model store's profiles directory (next to
    the step-time curves). An f16 key is as before q8_0 existed."""
    kv = "" if kv_cache_type == "f16" else f"|{kv_cache_type}"
    key = hashlib.sha256(f"{peer.host}:{peer.port}|{fingerprint.weights_digest}{kv}".encode())
    return store_dir() / "profiles" / f"two-box-{key.hexdigest()[:16]}.json"


def _derive(stats: dict, arrivals: list[tuple[float, int]], burst_bps: list[float],
            done: float) -> None:
    """Link speed and overlap from the arrivals. link_gbps: median over chunks of the rate at
    which a chunk's frames arrived after its first (the worker sends a chunk's frames back to
    back, so this is the link, not the compute). overlap: the fraction of the serial transfer
    time (bytes / link) hidden behind the worker's compute, 1 - exposed / serial, where
    exposed is DONE's arrival minus the end of the worker's prefill (shared/notes/two-box.md
    §6 metrics). A prompt that waited behind others on the worker (`queue_tokens` > 0) gets
    neither overlap nor first_frame_fraction: the worker's prefill time excludes its wait,
    which this side does not know."""
    if burst_bps:
        stats["link_gbps"] = float(np.median(burst_bps)) / 1e9
    worker = stats.get("worker_prefill_s")
    if worker is None or not stats["bytes"] or stats.get("queue_tokens"):
        return
    stats["exposed_s"] = max(0.0, done - worker)
    stats["first_frame_fraction"] = stats["first_frame_s"] / worker if worker else None
    if stats.get("link_gbps"):
        serial = stats["bytes"] / (stats["link_gbps"] * 1e9)
        stats["overlap"] = max(0.0, 1.0 - stats["exposed_s"] / serial) if serial else None


def _reason(e: BaseException) -> str:
    """The fallback reason a failure is counted under."""
    if isinstance(e, _Deadline):
        return e.reason
    if isinstance(e, ProtocolError):
        if e.code == "peer":
            return e.detail or "peer_error"
        return _TRUNCATED if e.code == "truncated" else e.code
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    if isinstance(e, ConnectionError | OSError):
        return _TRUNCATED
    return "error"
