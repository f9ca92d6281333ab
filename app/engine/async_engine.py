"""`AsyncEngine`: submit / stream / cancel over a step loop in its own thread.

The step thread owns the `LLMEngine`; asyncio code talks to it through a queue of commands
and receives outputs through `loop.call_soon_threadsafe`, one call per step. While the
runner computes (llama.cpp and MLX release the GIL) little else in the process is busy:
llama.cpp's worker threads spin-wait, and a competing Python thread can slow decode many
times over on a small machine. So a step's outputs are handled before the next step starts,
except a lone stream's, which is handled during it (`_deliver`); a finished request's slot
is released only after its last output is on its way (`Scheduler.release_finished`). When
there is no work the thread blocks on the queue, and requests arriving together after that
start in the same step (`_collect_arrivals`).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from app.engine.engine import LLMEngine
from app.engine.request import RequestStatus
from app.engine.types import (
    EngineOverloadedError,
    EngineStats,
    PrefillProgress,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
)
from backends.base import Runner

_STOP = object()


class RequestStream:
    """Async iterator over one request's outputs; `cancel()` aborts it."""

    def __init__(self, engine: AsyncEngine, request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def cancel(self) -> None:
        if not self.finished:
            self._engine._abort(self.request_id)

    def end(self, exc: BaseException) -> None:
        """Abort the request and raise `exc` to the consumer after the outputs already
        queued, without waiting for the step in progress (whose output is then dropped).
        Call on the stream's event loop."""
        if not self.finished:
            self._engine._abort(self.request_id)
            self._put(exc)


class AsyncEngine:
    """Asynchronous front of the engine, shared by the CLI, the server and the TUI.

    `app.loader.load_engine` builds one from `EngineArgs`. Methods other than
    `submit`/`generate` are thread-safe and need no event loop. Admission is bounded by the
    scheduler's `max_num_seqs + max_waiting` requests in flight.
    """

    def __init__(self, engine: LLMEngine, model_name: str, backend_name: str):
        self.engine = engine
        self.runner: Runner = engine.runner
        self.model_name = model_name
        self.model_path: Path | None = None  # the model file, where loaded from one (app.loader)
        self.backend_name = backend_name
        self.info = self.runner.info
        self.tokenizer = self.runner.tokenizer
        self.grammars = engine.grammars  # compiles response formats (thread-safe)
        self.context_length = engine.context_length
        self.max_waiting = engine.config.scheduler.max_waiting
        self.consumer_wait_s = 0.05  # see _deliver
        self._couriers: dict[asyncio.AbstractEventLoop, _Courier] = {}
        self._in_flight: list[_Courier] = []  # where the last step's outputs went
        self.arrival_gap_s = 0.005  # seconds; see _collect_arrivals
        self.arrival_window_s = 0.2  # seconds
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._stats = engine.stats()
        engine.scheduler.defer_releases = True  # see _loop
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="tandem-step", daemon=True)
        self._thread.start()

    def describe(self) -> dict[str, object]:
        """What serves requests: backend, model, KV layout, KV bytes allocated, KV cache type
        and whether it turned flash attention on, and the budget (llama.cpp), block size, KV
        tokens (blocks x block size), slots, context length, whether it speculates, and the
        weight buffers {llama.cpp buffer type: MiB}, the repack verdict (llama.cpp's
        `RepackVerdict`; None elsewhere) and whether large prefill chunks run on plain
        weights, and whether it runs exact mode (`backends.llamacpp.exact`)."""
        runner = self.runner
        return {
            "backend": self.backend_name,
            "model": self.model_name,
            "kv_layout": getattr(runner, "kv_layout", None),
            "kv_bytes": getattr(runner, "kv_bytes", None),
            "kv_cache_type": getattr(runner, "kv_cache_type", "f16"),
            "flash_attn_forced": getattr(runner, "flash_attn_forced", False),
            "flash_attn": getattr(runner, "flash_attn", None),
            "kv_budget_bytes": getattr(runner, "kv_budget_bytes", None),
            "block_size": runner.block_size,
            "kv_tokens": runner.num_blocks * runner.block_size,
            "max_seqs": runner.max_seqs,
            "context_length": self.context_length,
            "speculation": self.engine.speculator is not None,
            "weight_buffers": getattr(runner, "weight_buffers", None),
            "repack": getattr(runner, "repack", None),
            "plain_prefill": getattr(runner, "plain_prefill", None) is not None,
            "exact": getattr(runner, "exact", False),
        }

    def embedder(self):
        """The model's `backends.base.Embedder` for inputs up to the context length, made on
        the first call (a llama.cpp context: call it off the event loop), or None where the
        runner cannot embed (MLX). Raises ValueError if the model cannot embed."""
        make = getattr(self.runner, "embedder", None)
        return None if make is None else make(self.context_length)

    # -- requests --------------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               request_id: str | None = None) -> RequestStream:
        """Queue a request; call from a running event loop.

        Raises:
            PromptTooLongError, ValueError: bad prompt. EngineOverloadedError: queue full.
            RuntimeError: the engine stopped after a backend failure.
        """
        if self._error is not None:
            raise RuntimeError(f"engine stopped: {self._error}")
        self.engine.validate(prompt_ids)
        loop = asyncio.get_running_loop()
        request_id = request_id or f"req-{next(self._ids)}"
        with self._lock:
            if self._outstanding >= self.engine.scheduler.config.max_num_seqs + self.max_waiting:
                raise EngineOverloadedError(
                    f"server busy: {self._outstanding} requests in flight; retry later"
                )
            self._outstanding += 1
        stream = RequestStream(self, request_id, loop)
        self._streams[request_id] = stream
        self._inbox.put(("add", request_id, list(prompt_ids), params, time.perf_counter()))
        return stream

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """`submit` + iterate; the request is cancelled if the consumer stops early."""
        stream = self.submit(prompt_ids, params, request_id)
        try:
            async for out in stream:
                yield out
        finally:
            stream.cancel()

    def cancel(self, request_id: str) -> None:
        self._abort(request_id)

    def request_metrics(self, request_id: str) -> RequestMetrics | None:
        """The live `RequestMetrics` of a request in flight (the engine keeps updating the
        object: it tells afterwards whether a first token came); None if unknown."""
        r = self.engine.requests.get(request_id)
        return None if r is None else r.metrics

    def prefilling(self) -> dict[str, PrefillProgress]:
        """`prefill_progress` of every request whose prompt is still being computed.
        Thread-safe (a snapshot; `{}` if the step thread kept changing the table)."""
        for _ in range(3):
            try:
                ids = list(self.engine.requests)
            except RuntimeError:  # the step thread added or removed one meanwhile
                continue
            return {i: p for i in ids if (p := self.prefill_progress(i)) is not None}
        return {}

    def prefill_progress(self, request_id: str) -> PrefillProgress | None:
        """How far a request's prompt is computed, or None once it has no prompt left to
        compute (first token out, finished, or unknown). Thread-safe: it reads counters the
        step thread writes, so a value may be one step old."""
        r = self.engine.requests.get(request_id)
        if r is None or r.num_output_tokens or r.finished:
            return None
        total = r.num_prompt_tokens
        return PrefillProgress(min(r.num_computed_tokens, total), total,
                               r.metrics.cached_tokens,
                               r.status is RequestStatus.REMOTE_PREFILL)

    def _abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    # the two-box client's callbacks (any thread): run on the step thread between steps
    def remote_kv(self, request_id: str, start: int, kv: list) -> None:
        """Queue `LLMEngine.import_remote_kv` for the step thread."""
        self._inbox.put(("remote_kv", request_id, start, kv))

    def remote_end(self, request_id: str, outcome) -> None:
        """Queue `LLMEngine.end_remote_prefill` for the step thread."""
        self._inbox.put(("remote_end", request_id, outcome))

    def stats(self) -> EngineStats:
        """Snapshot taken at the end of the last step (no lock with the step thread)."""
        return self._stats

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._inbox.put((_STOP,))
            self._thread.join(timeout=30)
        self.engine.close()

    # -- the step thread -------------------------------------------------------------------

    def _handle(self, cmd: tuple, outputs: list[RequestOutput]) -> bool:
        kind = cmd[0]
        if kind is _STOP:
            return False
        if kind == "add":
            _, request_id, prompt_ids, params, arrival = cmd
            if request_id not in self._streams:  # cancelled before it arrived
                return True
            try:
                self.engine.add_request(request_id, prompt_ids, params, arrival)
            except Exception as exc:  # noqa: BLE001 - handed to the waiting stream
                self._deliver_error(request_id, exc)
        elif kind == "remote_kv":
            self.engine.import_remote_kv(*cmd[1:])
        elif kind == "remote_end":
            self.engine.end_remote_prefill(*cmd[1:])
        elif kind == "abort":
            out = self.engine.abort(cmd[1])
            if out is not None:
                outputs.append(out)
            elif cmd[1] in self._streams:  # not yet added: end the stream
                outputs.append(RequestOutput(cmd[1], "", [], True, "abort"))
        return True

    def _loop(self) -> None:
        running = True
        while running:
            outputs: list[RequestOutput] = []
            try:
                if not self.engine.has_work():
                    running = self._handle(self._inbox.get(), outputs)
                    if running and self.engine.has_work():
                        running = self._collect_arrivals(outputs)
                while running and not self._inbox.empty():  # this thread alone takes
                    running = self._handle(self._inbox.get_nowait(), outputs)
                if running and self.engine.has_work():
                    outputs.extend(self.engine.step())
                self._stats = self.engine.stats()
                if outputs:
                    self._deliver(outputs)
                # finished requests' slots: after their last outputs are on their way
                self.engine.scheduler.release_finished()
                self._stats = self.engine.stats()  # again: an idle engine shows them free
            except Exception as exc:  # noqa: BLE001 - a backend failure ends every stream
                self._error = exc
                for request_id in list(self._streams):
                    self._deliver_error(request_id, RuntimeError(f"engine failed: {exc}"))
                return

    def _collect_arrivals(self, outputs: list[RequestOutput]) -> bool:
        """After idling, take commands that keep arriving less than `arrival_gap_s` apart
        (for at most `arrival_window_s`) before the first step, like the queue delay of
        Triton's dynamic batcher: clients that connect together are prefilled together, and
        the first step does not compete for the cores with the event loop still parsing their
        requests (16 clients sending a 600-token system prompt: first step 1.98 -> 1.78 s,
        TTFT p50 5.2 -> 5.0 s; 16 short prompts: TTFT p50 2.3 -> 1.6 s). A lone request waits
        `arrival_gap_s` more; a cancellation ends the wait (its output is due now). Returns
        False on shutdown."""
        deadline = time.perf_counter() + self.arrival_window_s
        while True:
            wait = min(self.arrival_gap_s, deadline - time.perf_counter())
            if wait <= 0:
                return True
            try:
                cmd = self._inbox.get(timeout=wait)
            except queue.Empty:
                return True
            if not self._handle(cmd, outputs):
                return False
            if outputs or not self.engine.has_work():
                return True

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
                with self._lock:
                    self._outstanding -= 1
            by_loop.setdefault(stream._loop, []).append((stream, out))
        # A lone stream's output is handled while the next step computes: its consumer's
        # Python takes less of llama.cpp's cores than waiting for it costs (two thread
        # wake-ups a step). More streams' outputs are handled before the next step starts:
        # their Python, run beside llama.cpp, would steal a core from its spin-waiting
        # workers and slow the whole step. Either way the step before's outputs must have
        # been handled, so a slow consumer holds back the engine rather than queueing
        # without bound. Bounded, so a stuck loop cannot stall it. (README, Benchmarks,
        # "tandem serve vs llama-server")
        deadline = time.perf_counter() + self.consumer_wait_s
        self._wait_in_flight(deadline)
        for loop, pairs in by_loop.items():
            courier = self._couriers.get(loop)
            if courier is None:
                courier = self._couriers[loop] = _Courier(loop)
            try:
                loop.call_soon_threadsafe(courier.put_all, pairs, courier.sent + 1)
            except RuntimeError:
                del self._couriers[loop]  # the consumer's loop is closed
                continue
            courier.sent += 1
            self._in_flight.append(courier)
        if len(outputs) > 1:
            self._wait_in_flight(deadline)

    def _wait_in_flight(self, deadline: float) -> None:
        """Until the consumers have handled the deliveries in flight (or `deadline`)."""
        for courier in self._in_flight:
            courier.wait(deadline)
        self._in_flight = []

    def _deliver_error(self, request_id: str, exc: BaseException) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        with self._lock:
            self._outstanding -= 1
        try:
            stream._loop.call_soon_threadsafe(stream._put, exc)
        except RuntimeError:
            pass


class _Courier:
    """Deliveries to one event loop: `sent` is counted by the step thread, `handled` by the
    loop once the streams it fed have run. One per loop for the engine's life, so a step's
    delivery creates no synchronisation objects."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sent = 0
        self.handled = 0
        self._cond = threading.Condition(threading.Lock())

    def put_all(self, pairs: list[tuple[RequestStream, RequestOutput]], number: int) -> None:
        """On the loop: hand the outputs to their streams; mark delivery `number` handled
        once the consumers it woke have run (the mark is queued behind them)."""
        for stream, out in pairs:
            stream._put(out)
        self.loop.call_soon(self._mark, number)

    def _mark(self, number: int) -> None:
        with self._cond:
            self.handled = number
            self._cond.notify_all()

    def wait(self, deadline: float) -> None:
        """On the step thread: until every delivery sent is handled, or `deadline`."""
        if self.handled >= self.sent:
            return
        with self._cond:
            self._cond.wait_for(lambda: self.handled >= self.sent,
                                max(0.0, deadline - time.perf_counter()))
