"""Models on demand: the server serves every model of the store, loading the one a request
names and unloading what it no longer needs.

Policy (after Ollama's scheduler and llama-swap; `shared/notes/ecosystem.md` §1):
- A request naming a model that is not loaded waits for its load; one load runs at a
  time (a worker task runs them in order, each in a thread, so the event loop and the
  loaded models' step threads keep serving). Concurrent requests for a model wait for the
  same load. Requests for loaded models never wait on a load.
- Room: at most `max_loaded` models, and their memory (file bytes + KV bytes allocated;
  a model not yet loaded is estimated as its file plus the first model's KV) within
  `memory_budget` bytes. To make room the least recently used model with no running
  request is unloaded first. A model with running requests is never unloaded under them:
  when every other model is busy, the least recently used one drains — its running
  requests finish, new requests for it wait — and is unloaded when the last one ends.
  A model alone over the budget is still loaded (nothing else to unload, as Ollama).
- Waiting is bounded: at most `max_waiting` requests wait for loads (more get 503
  `overloaded`), each for at most `wait_s` seconds (then 503 `model_busy` with
  `Retry-After`); a load nobody waits for any more is abandoned before it starts.
- Keep-alive (Ollama's semantics): a request may set how long its model stays loaded
  after its last running request ends: seconds, 0 (unload after the reply), None (kept
  until evicted). Without one a model keeps its own default: `keep_alive_s` for models
  loaded on demand, forever for the model the server started with.
- A failed load (missing or unreadable file, not a GGUF, out of memory) answers the
  requests waiting for it with 500 `model_load_failed` naming the model and the reason;
  the other models keep serving, and the next request for it tries again.
- Shutdown: when the server's grace period is over, `end_waiting` answers every request
  still waiting for a load with 503 `server_shutting_down` (as `ServerContext.end_streams`
  ends the streams); `close` waits for a load still running in its thread and shuts the
  engine it made down with the others.

A request holds a `Lease` on its model from `model_context` until its response has been
sent (streamed responses included): `ModelLeases`, an ASGI middleware, releases the
leases a request took once the app has answered it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.errors import SERVER_ERROR, APIError, bad_request, overloaded, shutting_down
from app.server.store_models import StoreModel, file_size

log = logging.getLogger("tandem.server")

LEASES = "tandem_model_leases"  # key of a request's leases in its ASGI scope's "state"
MAX_LOADED = 3  # Ollama's OLLAMA_MAX_LOADED_MODELS default on CPU (3 per GPU)
KEEP_ALIVE_S = 300.0  # Ollama's OLLAMA_KEEP_ALIVE default, 5m
WAIT_S = 300.0  # Ollama's OLLAMA_LOAD_TIMEOUT default, 5m
RETRY_AFTER_S = 5
OLLAMA_TAG = ":latest"


@dataclass(eq=False)
class Slot:
    """One model of the pool and its state. `engine` is set while it is loaded; `leases`
    counts its running requests; `waiters` the requests waiting for it to load; `draining`:
    chosen for unloading once idle (new requests wait); `keep_alive`: seconds it stays
    after its last request (None: forever); `expires_at`: wall-clock time of that unload
    (None while busy or kept forever)."""

    model: StoreModel
    default_keep_alive: float | None
    defaults: Any = None
    engine: Any = None
    leases: int = 0
    waiters: int = 0
    last_used: float = 0.0
    loaded_at: float | None = None
    keep_alive: float | None = None
    expires_at: float | None = None
    draining: bool = False
    memory: int = 0
    loading: asyncio.Future | None = None
    unloading: asyncio.Future | None = None
    timer: asyncio.TimerHandle | None = None
    aliases: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.model.name


class Lease:
    """A running request's hold on a loaded model; `release()` once (idempotent)."""

    def __init__(self, pool: ModelPool, slot: Slot):
        self.pool = pool
        self.slot = slot
        self.engine = slot.engine
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.pool._release(self.slot)


class ModelContext:
    """The server's context seen through one loaded model: `engine`, `model_name` and
    `defaults` are the model's; everything else (metrics, open streams, stopping) is the
    server's (`root`)."""

    def __init__(self, root: Any, slot: Slot, engine: Any):
        self._root = root
        self.engine = engine
        self.model_name = slot.name
        self.defaults = slot.defaults
        self.aliases = frozenset(slot.model.names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._root, name)

    @property
    def context_length(self) -> int:
        return int(self.engine.context_length)


class ModelPool:
    """The models a server serves and which of them are loaded (see the module docstring).

    `load(path)` loads a model file into an engine (an `AsyncEngine`; it runs in a worker
    thread and may raise); `scan()` lists the store's models (`store_models.scan_store`),
    called again whenever a name is not found and for every listing. `start` is the model
    the server started with (its `engine` loaded) and the default for requests that name
    none. `aliases`: {alias: model name}, checked by `add_alias`. `defaults_of(path)`: the
    recommended sampling settings of a model file.
    """

    def __init__(self, load: Callable[[Path], Any], scan: Callable[[], list[StoreModel]],
                 start: StoreModel, engine: Any, *, defaults_of: Callable[[Path], Any],
                 start_defaults: Any = None, max_loaded: int = MAX_LOADED,
                 memory_budget: int | None = None, keep_alive_s: float | None = KEEP_ALIVE_S,
                 max_waiting: int = 256, wait_s: float = WAIT_S):
        if max_loaded < 1:
            raise ValueError("max_loaded must be >= 1")
        self._load = load
        self._scan = scan
        self._defaults_of = defaults_of
        self.max_loaded = max_loaded
        self.memory_budget = memory_budget
        self.keep_alive_s = keep_alive_s
        self.max_waiting = max_waiting
        self.wait_s = wait_s
        self._slots: dict[str, Slot] = {}  # by lower-case name or alias
        self._order: list[Slot] = []
        self.default = self._add(start, keep_alive=None, defaults=start_defaults)
        self.default.engine = engine
        self.default.loaded_at = time.time()
        self.default.memory = footprint(engine, start.path)
        self._kv_estimate = max(self.default.memory - file_size(start.path), 0)
        self._aliases: dict[str, Slot] = {}
        self._waiting = 0
        self._changed: asyncio.Event | None = None
        self._queue: asyncio.Queue[Slot] | None = None
        self._worker: asyncio.Task | None = None
        self._stopping: asyncio.Future | None = None  # done: answer waiters 503
        self._loads = ThreadPoolExecutor(1, thread_name_prefix="tandem-model-load")
        self._load_running: Future | None = None  # the load in its thread, for `close`
        self._closed = False
        self._lock = threading.Lock()  # `_closed` and `_load_running`, across threads
        self.refresh()

    # -- names -----------------------------------------------------------------------------

    def _add(self, model: StoreModel, keep_alive: float | None, defaults: Any = None) -> Slot:
        slot = Slot(model, keep_alive, defaults if defaults is not None
                    else self._defaults_of(model.path))
        slot.keep_alive = keep_alive
        self._order.append(slot)
        for n in model.names:
            self._slots.setdefault(n, slot)
        return slot

    def refresh(self) -> None:
        """Add the store's new models (files removed from the store stay listed while they
        are loaded; the others go)."""
        found = self._scan()
        known = {s.model.path for s in self._order}
        for model in found:
            if model.path not in known:
                self._add(model, self.keep_alive_s)
        present = {m.path for m in found}
        for slot in list(self._order):
            if (slot.model.path not in present and slot is not self.default
                    and slot.engine is None and slot.loading is None and not slot.leases):
                self._order.remove(slot)
                for n in slot.model.names:
                    if self._slots.get(n) is slot:
                        del self._slots[n]

    def add_alias(self, alias: str, target: str) -> None:
        """Let requests call model `target` `alias` too. Raises ValueError for an unknown
        target."""
        slot = self._find(target)
        if slot is None:
            raise ValueError(f"--alias {alias}={target}: no model '{target}' (models: "
                             f"{', '.join(self.names())})")
        self._aliases[alias.lower()] = slot
        slot.aliases.add(alias)

    def names(self) -> list[str]:
        """The models' names, the default first."""
        return [s.name for s in self._order]

    def _find(self, requested: str) -> Slot | None:
        key = requested.lower()
        keys = [key, key[: -len(OLLAMA_TAG)]] if key.endswith(OLLAMA_TAG) else [key]
        for k in keys:
            slot = self._aliases.get(k) or self._slots.get(k)
            if slot is not None:
                return slot
        return None

    def slot(self, requested: str | None) -> Slot:
        """The model a request's `model` names (None or "": the default; with or without
        Ollama's `:latest`). Raises APIError 404 `model_not_found` listing the models."""
        if not requested:
            return self.default
        slot = self._find(requested)
        if slot is None:
            self.refresh()
            slot = self._find(requested)
        if slot is None:
            aliases = sorted(a for s in self._order for a in s.aliases)
            listed = ", ".join(f"`{n}`" for n in self.names())
            extra = f" (aliases: {', '.join(f'`{a}`' for a in aliases)})" if aliases else ""
            raise APIError(404, f"The model `{requested}` does not exist. This server serves "
                           f"{listed}{extra}.", param="model", code="model_not_found")
        return slot

    def loaded(self) -> list[tuple[str, Any]]:
        """(name, engine) of every loaded model, the default first; the store not rescanned
        (cheap enough for every `/metrics` scrape)."""
        return [(s.name, s.engine) for s in list(self._order) if s.engine is not None]

    def slots(self) -> list[Slot]:
        """Every model (the store rescanned), the default first."""
        self.refresh()
        return list(self._order)

    # -- leases ----------------------------------------------------------------------------

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def acquire(self, requested: str | None, keep_alive: float | None | str = "default"
                      ) -> Lease:
        """A lease on the model `requested` names, loading it first if needed (see the
        module docstring). `keep_alive`: seconds, None (forever) or "default".

        Raises APIError: 404 (unknown name), 500 `model_load_failed`, 503 `overloaded`
        (too many requests waiting for loads), 503 `model_busy` (waited `wait_s`)."""
        slot = self.slot(requested)
        if slot.engine is not None and not slot.draining:
            return self._lease(slot, keep_alive)
        if self._stop().done():
            raise shutting_down()
        if self._waiting >= self.max_waiting:
            raise overloaded(f"{self._waiting} requests are waiting for models to load")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        self._waiting += 1
        slot.waiters += 1
        try:
            while True:
                if slot.engine is not None and not slot.draining:
                    return self._lease(slot, keep_alive)
                if slot.engine is None:
                    if slot.loading is None:
                        self._schedule(slot)
                    assert slot.loading is not None
                    waiter: Any = asyncio.shield(slot.loading)
                else:
                    waiter = self._event().wait()
                await self._wait(waiter, max(deadline - loop.time(), 0.0), slot)
        finally:
            slot.waiters -= 1
            self._waiting -= 1
            self._notify()  # a model nobody waits for any more may be unloaded

    def _stop(self) -> asyncio.Future:
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_future()
        return self._stopping

    async def _wait(self, waiter: Any, timeout: float, slot: Slot) -> None:
        """Wait for `waiter` (a load or a pool change) at most `timeout` seconds. Raises
        what the load raised, 503 `model_busy` on the timeout, 503 `server_shutting_down`
        once `end_waiting` ran."""
        task = asyncio.ensure_future(waiter)
        stop = self._stop()
        try:
            done, _ = await asyncio.wait({task, stop}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:  # timed out, stopped or cancelled (the client left): nobody reads it
            if not task.done():
                task.cancel()
        if task not in done:
            raise shutting_down() if stop in done else busy(slot.name, self.wait_s)
        task.result()

    def end_waiting(self) -> int:
        """The server's grace period is over: answer every request waiting for a model to
        load with 503 `server_shutting_down` now (and any that comes later). Returns how
        many were waiting."""
        stop = self._stop()
        if not stop.done():
            stop.set_result(None)
        return self._waiting

    def stop(self, requested: str | None) -> None:
        """`ollama stop` (an empty request with `keep_alive: 0`): unload the model now if it
        is loaded and idle, else once its running requests end; one not loaded is not loaded.
        Raises APIError 404 for an unknown name."""
        slot = self.slot(requested)
        slot.keep_alive = 0
        if slot.engine is not None and not slot.leases and not slot.waiters:
            self._unload(slot, "stopped (keep_alive 0)")

    def _lease(self, slot: Slot, keep_alive: float | None | str) -> Lease:
        slot.leases += 1
        slot.last_used = time.monotonic()
        slot.keep_alive = slot.default_keep_alive if keep_alive == "default" else keep_alive  # type: ignore[assignment]
        slot.expires_at = None
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        return Lease(self, slot)

    def _release(self, slot: Slot) -> None:
        slot.leases -= 1
        slot.last_used = time.monotonic()
        if slot.leases == 0:
            self._arm(slot)
            self._notify()

    def _arm(self, slot: Slot) -> None:
        """An idle loaded model: unload it now (keep-alive 0), later, or never."""
        if slot.engine is None or slot.draining or slot.leases:
            return
        ka = slot.keep_alive
        if ka is None:
            return
        if ka <= 0:
            self._expire(slot)
            return
        slot.expires_at = time.time() + ka
        slot.timer = asyncio.get_running_loop().call_later(ka, self._expire, slot)

    def _expire(self, slot: Slot) -> None:
        slot.timer = None
        if slot.engine is not None and not slot.leases and not slot.waiters:
            self._unload(slot, "keep-alive expired")

    def _unload(self, slot: Slot, why: str) -> None:
        """Unload an idle model (its engine shut down in a thread)."""
        engine = slot.engine
        slot.engine = None
        slot.draining = False
        slot.expires_at = slot.loaded_at = None
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        log.info("unloading %s (%s)", slot.name, why)
        loop = asyncio.get_running_loop()
        done = slot.unloading = loop.run_in_executor(None, engine.shutdown)

        def finished(fut: asyncio.Future) -> None:
            if slot.unloading is done:
                slot.unloading = None
            slot.memory = 0
            if not fut.cancelled() and fut.exception() is not None:
                log.error("unloading %s failed: %s", slot.name, fut.exception())
            self._notify()

        done.add_done_callback(finished)
        self._notify()

    # -- loading ---------------------------------------------------------------------------

    def _schedule(self, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        slot.loading = loop.create_future()
        slot.loading.add_done_callback(lambda f: f.cancelled() or f.exception())
        if self._queue is None:
            self._queue = asyncio.Queue()
        self._queue.put_nowait(slot)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work(), name="tandem-model-loads")

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            slot = await self._queue.get()
            fut = slot.loading
            assert fut is not None
            try:
                await self._make_room(slot)
                if slot.unloading is not None:
                    await asyncio.shield(slot.unloading)
                if not slot.waiters:
                    raise busy(slot.name, self.wait_s)  # nobody wants it any more
                log.info("loading %s (%s)", slot.name, slot.model.path)
                with cores_yielded([e for _, e in self.loaded()]):
                    engine = await self._load_in_thread(slot.model.path)
            except Exception as exc:  # noqa: BLE001 - answered to the waiting requests
                slot.loading = None
                fut.set_exception(exc if isinstance(exc, APIError) else load_failed(slot.name,
                                                                                     exc))
                self._notify()
                continue
            slot.engine = engine
            slot.memory = footprint(engine, slot.model.path)
            slot.loaded_at = time.time()
            slot.last_used = time.monotonic()
            slot.keep_alive = slot.default_keep_alive
            slot.loading = None
            fut.set_result(None)
            self._arm(slot)  # waiters lease it before an expiry can fire (`_expire`)
            self._notify()

    async def _load_in_thread(self, path: Path) -> Any:
        """`self._load(path)` in the pool's load thread, kept in `_load_running` so that
        `close` finds it when the server stops mid-load (the event loop, and this coroutine,
        gone). Raises what the load raised."""
        with self._lock:
            if self._closed:
                raise shutting_down()
            running = self._load_running = self._loads.submit(self._load, path)
        # cancelled here (the server stopped) it stays in `_load_running` for `close`
        engine = await asyncio.wrap_future(running)
        with self._lock:  # taken: `_work` owns the engine now
            if self._load_running is running:
                self._load_running = None
        return engine

    def _estimate(self, slot: Slot) -> int:
        return file_size(slot.model.path) + self._kv_estimate

    async def _make_room(self, slot: Slot) -> None:
        """Unload idle models (least recently used first), or drain a busy one and wait,
        until `slot` fits; raises 503 `model_busy` when its waiters have all gone."""
        try:
            while True:
                pending = [s.unloading for s in self._order if s.unloading is not None]
                if pending:
                    await asyncio.gather(*(asyncio.shield(p) for p in pending),
                                         return_exceptions=True)
                    continue
                loaded = [s for s in self._order if s.engine is not None and s is not slot]
                used = sum(s.memory for s in loaded)
                fits = self.memory_budget is None or used + self._estimate(slot) <= \
                    self.memory_budget
                if not loaded or (len(loaded) < self.max_loaded and fits):
                    return
                if not slot.waiters:
                    raise busy(slot.name, self.wait_s)
                # idle: no running request, and none about to lease it (a model just
                # loaded for its waiters) unless those wait for it to drain
                idle = [s for s in loaded if not s.leases and (s.draining or not s.waiters)]
                if idle:
                    self._unload(min(idle, key=lambda s: s.last_used), f"room for {slot.name}")
                    continue
                busy_ = [s for s in loaded if s.leases]
                if busy_ and not any(s.draining for s in loaded):
                    victim = min(busy_, key=lambda s: s.last_used)
                    victim.draining = True
                    log.info("draining %s (room for %s)", victim.name, slot.name)
                await self._event().wait()  # a request ends, a waiter leases or gives up
        finally:  # loaded or given up: a model still draining serves new requests again
            if any(s.draining for s in self._order):
                for s in self._order:
                    s.draining = False
                self._notify()

    # -- listing and shutdown ----------------------------------------------------------------

    def context(self, root: Any, lease: Lease) -> ModelContext:
        """`root` (the server's context) seen through the leased model."""
        return ModelContext(root, lease.slot, lease.engine)

    def close(self) -> None:
        """Shut every loaded engine down (the server has stopped), the one a load still
        running makes included: that load is waited for (said on stdout), as its thread
        would hold the process anyway."""
        with self._lock:
            self._closed = True
            running, self._load_running = self._load_running, None
        engines = [s.engine for s in self._order if s.engine is not None]
        for slot in self._order:
            slot.engine = None
        if running is not None:
            if not running.done():
                print("tandem: waiting for a model load to finish before exiting", flush=True)
            try:
                made = running.result()
            except Exception:  # noqa: BLE001 - its requests were answered; nothing to free
                made = None
            if made is not None and all(made is not e for e in engines):
                engines.append(made)
        self._loads.shutdown(wait=True)
        for engine in engines:
            engine.shutdown()


@contextmanager
def cores_yielded(engines: list[Any]) -> Iterator[None]:
    """While a model loads, the loaded `engines`' llama.cpp runners compute with one thread
    fewer (`LlamaCppRunner.yield_core`): on a CPU whose cores all run their threads, the
    load would otherwise preempt one of a step's spinning workers and stall the step's
    barriers (README, "Models on demand"). Other runners are left alone."""
    runners = [r for r in (getattr(getattr(e, "engine", None), "runner", None)
                           for e in engines) if hasattr(r, "yield_core")]
    for r in runners:
        r.yield_core(True)
    try:
        yield
    finally:
        for r in runners:
            r.yield_core(False)


def footprint(engine: Any, path: Path) -> int:
    """Bytes a loaded model holds: its file (weights) plus the KV cache it allocated."""
    describe = getattr(engine, "describe", None)
    kv = (describe() or {}).get("kv_bytes") if describe is not None else None
    return file_size(path) + int(kv or 0)


def busy(name: str, wait_s: float) -> APIError:
    """503 `model_busy`: the model could not be loaded within `wait_s` because the others
    are busy; retry later."""
    return APIError(503, f"The model `{name}` is not loaded and the loaded models are busy "
                    f"(waited {wait_s:g} s for room); please retry shortly.", SERVER_ERROR,
                    "model", "model_busy", headers={"Retry-After": str(RETRY_AFTER_S)})


def load_failed(name: str, exc: BaseException) -> APIError:
    """500 `model_load_failed`, naming the model and why."""
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, MemoryError):
        reason = "out of memory"
    return APIError(500, f"The model `{name}` could not be loaded: {reason}", SERVER_ERROR,
                    "model", "model_load_failed")


class DefaultEngine:
    """The `--model` model's engine as it is now, for what reads "the" engine (the
    `tandem_*` metrics): the pool may unload it (keep-alive, LRU) and load it again as a
    new engine. While it is unloaded, the last one (its final counts) answers."""

    def __init__(self, pool: ModelPool, engine: Any):
        self._pool = pool
        self._last = engine

    def __getattr__(self, name: str) -> Any:
        current = self._pool.default.engine
        if current is not None:
            self._last = current
        return getattr(self._last, name)


async def model_context(request: Request, ctx: Any, requested: str | None,
                        keep_alive: float | None | str = "default") -> Any:
    """The context a route serves `requested` with: `ctx` itself on a one-model server;
    with a pool, the model's (loaded first if needed), leased until the response has been
    sent. Raises as `ModelPool.acquire`."""
    pool = getattr(ctx, "pool", None)
    if pool is None:
        return ctx
    leases = request.scope.get("state", {}).get(LEASES)
    if leases is None:
        raise RuntimeError("a model pool needs the ModelLeases middleware")
    lease = await pool.acquire(requested, keep_alive)
    leases.append(lease)
    return pool.context(ctx, lease)


class ModelLeases:
    """Pure ASGI middleware: gives each request a list for its model leases and releases
    them once the app has answered (after a streamed body's last byte, or its cancellation)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        leases: list[Lease] = []
        scope.setdefault("state", {})[LEASES] = leases
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in leases:
                lease.release()


GO_MAX_DURATION_S = (2**63 - 1) / 1e9


def keep_alive_seconds(value: Any) -> float | None | str:
    """Ollama's `keep_alive` as seconds: a number is seconds, a string a Go duration
    ("5m", "1h30m", "-1s"); negative means forever (None), 0 unload after the reply;
    None or "" the model's default ("default"). Raises APIError 400 for anything else
    (Ollama's words)."""
    if value is None or value == "":
        return "default"
    try:
        seconds = float(value) if not isinstance(value, str) else parse_duration(value)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds):
        raise bad_request(f'time: invalid duration "{value}"', "keep_alive")
    # past Go's longest duration (2^63 - 1 ns) Ollama keeps the model: forever
    return None if seconds < 0 or seconds > GO_MAX_DURATION_S else seconds


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A Go `time.ParseDuration` string in seconds ("1h30m" -> 5400.0, "-1s" -> -1.0,
    "0" -> 0.0). Raises ValueError for anything else."""
    import re

    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in ("+", "-") else text
    if body == "0":
        return 0.0
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise ValueError(f'time: invalid duration "{text}"')
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def iso_time(t: float | None) -> str | None:
    """A wall-clock time (seconds) as RFC 3339 UTC, None for None."""
    if t is None:
        return None
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def describe_slots(slots: Iterable[Slot], loaded_only: bool = False) -> list[dict[str, Any]]:
    """`GET /tandem/ps`'s entries: per model `name`, `path`, `size` (file bytes), `loaded`,
    `memory` (file + KV bytes while loaded), `running` (requests), `waiting` (requests
    waiting for it to load), `loading`, `draining`, `loaded_at`, `keep_alive` (seconds,
    null = forever), `expires_at` (RFC 3339; null while busy or kept forever), `aliases`."""
    out = []
    for s in slots:
        loaded = s.engine is not None
        if loaded_only and not loaded:
            continue
        out.append({
            "name": s.name, "path": str(s.model.path), "size": file_size(s.model.path),
            "loaded": loaded, "memory": s.memory if loaded else 0, "running": s.leases,
            "waiting": s.waiters, "loading": s.loading is not None, "draining": s.draining,
            "loaded_at": iso_time(s.loaded_at), "keep_alive": s.keep_alive if loaded else None,
            "expires_at": iso_time(s.expires_at), "aliases": sorted(s.aliases),
        })
    return out
