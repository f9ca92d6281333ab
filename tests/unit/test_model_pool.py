"""The model pool's policy (`app.server.model_pool`) on fake engines: names, loads on
demand, LRU eviction, draining, keep-alive, failed loads, bounded waiting. No model, no
server; the e2e test (`tests/e2e/test_model_pool.py`) runs the real thing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from app.server.errors import APIError
from app.server.model_pool import ModelPool, keep_alive_seconds, parse_duration
from app.server.store_models import scan_store, store_model


class FakeEngine:
    context_length = 512

    def __init__(self, path: Path):
        self.path = path
        self.closed = threading.Event()

    def describe(self) -> dict:
        return {"kv_bytes": 1000}

    def shutdown(self) -> None:
        self.closed.set()


class Loader:
    """Loads `FakeEngine`s; `broken.gguf` fails; `gate` (when set) holds every load;
    `during` (when set) is called at the start of each."""

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.made: list[FakeEngine] = []
        self.gate: threading.Event | None = None
        self.during: Callable[[], None] | None = None

    def __call__(self, path: Path) -> FakeEngine:
        if self.during is not None:
            self.during()
        if self.gate is not None:
            assert self.gate.wait(10)
        self.loaded.append(path.stem)
        if path.name == "broken.gguf":
            raise ValueError(f"llama.cpp could not load {path}")
        self.made.append(FakeEngine(path))
        return self.made[-1]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "b.gguf", "c.gguf", "broken.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + b"\0" * 96)
    (tmp_path / ".b.gguf.part").write_bytes(b"GGUF")  # a download in progress: not listed
    (tmp_path / "gguf").mkdir()  # `tandem models convert --to q8_0` output
    (tmp_path / "gguf" / "SmolLM2-135M-Instruct.Q4_1-q8_0.gguf").write_bytes(b"GGUF")
    return tmp_path


def make_pool(store: Path, loader: Loader, **kw) -> tuple[ModelPool, FakeEngine]:
    start = store_model(store / "SmolLM2-135M-Instruct.Q4_1.gguf")
    engine = FakeEngine(start.path)
    pool = ModelPool(loader, lambda: scan_store(store), start, engine,
                     defaults_of=lambda p: None, **kw)
    return pool, engine


def loaded(pool: ModelPool) -> list[str]:
    return [s.name for s in pool.slots() if s.engine is not None]


def test_names_aliases_and_the_404_that_lists_them(store: Path) -> None:
    pool, _ = make_pool(store, Loader())
    pool.add_alias("gpt-4o-mini", "b")
    assert pool.names() == ["smollm2-135m-instruct", "b", "broken", "c",
                            "SmolLM2-135M-Instruct.Q4_1-q8_0"]
    for name in ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "smollm2-135m-instruct:latest", None, ""):
        assert pool.slot(name) is pool.default
    assert pool.slot("GPT-4o-mini").name == pool.slot("b.gguf").name == "b"
    with pytest.raises(APIError) as err:
        pool.slot("nope")
    assert (err.value.status, err.value.code, err.value.message) == (
        404, "model_not_found", "The model `nope` does not exist. This server serves "
        "`smollm2-135m-instruct`, `b`, `broken`, `c`, `SmolLM2-135M-Instruct.Q4_1-q8_0` "
        "(aliases: `gpt-4o-mini`).")
    with pytest.raises(ValueError, match="--alias x=nope: no model 'nope'"):
        pool.add_alias("x", "nope")
    (store / "d.gguf").write_bytes(b"GGUF")  # a model pulled while serving
    assert pool.slot("d").name == "d"


async def test_loads_on_demand_and_unloads_the_least_recently_used(store: Path) -> None:
    loader = Loader()
    pool, first = make_pool(store, loader, max_loaded=2)
    b = await pool.acquire("b")
    assert (loader.loaded, loaded(pool)) == (["b"], ["smollm2-135m-instruct", "b"])
    b.release()
    c = await pool.acquire("c")  # the default was used least recently: it goes
    assert loaded(pool) == ["b", "c"]
    assert await asyncio.to_thread(first.closed.wait, 10)
    c.release()
    again = await pool.acquire(None)  # the default loads again; b is now the LRU
    assert loaded(pool) == ["smollm2-135m-instruct", "c"]
    again.release()
    assert loader.loaded == ["b", "c", "SmolLM2-135M-Instruct.Q4_1"]


async def test_a_busy_model_drains_before_it_is_unloaded(store: Path) -> None:
    loader = Loader()
    pool, first = make_pool(store, loader, max_loaded=1)
    running = await pool.acquire(None)  # a long stream on the default model
    waiting = asyncio.create_task(pool.acquire("b"))
    await asyncio.sleep(0.05)
    assert not waiting.done() and pool.default.draining and pool.default.engine is first
    late = asyncio.create_task(pool.acquire(None))  # a new request for the draining model
    await asyncio.sleep(0.05)
    assert not late.done() and not first.closed.is_set()
    running.release()  # the stream ends: the default unloads, b loads
    b = await asyncio.wait_for(waiting, 10)
    assert b.slot.name == "b" and first.closed.is_set()
    assert not late.done()  # waits its turn: b is busy now
    b.release()
    back = await asyncio.wait_for(late, 10)
    assert back.slot is pool.default and loaded(pool) == ["smollm2-135m-instruct"]
    back.release()


async def test_waiting_is_bounded_by_time_and_by_the_queue(store: Path) -> None:
    pool, first = make_pool(store, Loader(), max_loaded=1, wait_s=0.2, max_waiting=1)
    running = await pool.acquire(None)
    waiter = asyncio.create_task(pool.acquire("b"))
    await asyncio.sleep(0.05)
    with pytest.raises(APIError) as full:
        await pool.acquire("c")
    assert (full.value.status, full.value.code) == (503, "overloaded")
    with pytest.raises(APIError) as err:
        await waiter
    assert (err.value.status, err.value.code, err.value.headers) == (
        503, "model_busy", {"Retry-After": "5"})
    assert err.value.message == ("The model `b` is not loaded and the loaded models are busy "
                                 "(waited 0.2 s for room); please retry shortly.")
    await asyncio.sleep(0.05)
    assert not pool.default.draining  # given up: the default serves new requests again
    (await asyncio.wait_for(pool.acquire(None), 1)).release()
    running.release()
    await asyncio.sleep(0.05)
    assert loaded(pool) == ["smollm2-135m-instruct"] and not first.closed.is_set()


async def test_keep_alive(store: Path) -> None:
    pool, _ = make_pool(store, Loader(), keep_alive_s=0.1)
    b = await pool.acquire("b")  # the default keep-alive of a model loaded on demand
    b.release()
    assert pool.slot("b").expires_at is not None
    await asyncio.sleep(0.3)
    assert loaded(pool) == ["smollm2-135m-instruct"]  # the --model one stays
    c = await pool.acquire("c", keep_alive_seconds(0))
    assert "c" in loaded(pool)
    c.release()  # keep_alive 0: unloaded after the reply
    assert "c" not in loaded(pool)
    forever = await pool.acquire("b", keep_alive_seconds("-1s"))
    forever.release()
    await asyncio.sleep(0.3)
    assert "b" in loaded(pool) and pool.slot("b").expires_at is None


async def test_a_failed_load_answers_its_waiters_and_is_tried_again(store: Path) -> None:
    loader = Loader()
    loader.gate = threading.Event()
    pool, _ = make_pool(store, loader)
    tries = [asyncio.create_task(pool.acquire("broken")) for _ in range(3)]
    await asyncio.sleep(0.05)
    loader.gate.set()
    errors = await asyncio.gather(*tries, return_exceptions=True)
    assert loader.loaded == ["broken"]  # one load for the three requests
    for e in errors:
        assert isinstance(e, APIError)
        assert (e.status, e.code, e.message) == (
            500, "model_load_failed", "The model `broken` could not be loaded: llama.cpp "
            f"could not load {store / 'broken.gguf'}")
    (await pool.acquire(None)).release()  # the others keep serving
    with pytest.raises(APIError):
        await pool.acquire("broken")
    assert loader.loaded == ["broken", "broken"]


async def test_the_memory_budget_unloads_before_the_count_does(store: Path) -> None:
    # each model: 100 bytes of file + 1000 of KV; room for two
    pool, _ = make_pool(store, Loader(), max_loaded=3, memory_budget=2500)
    (await pool.acquire("b")).release()
    assert loaded(pool) == ["smollm2-135m-instruct", "b"]
    (await pool.acquire("c")).release()
    assert loaded(pool) == ["b", "c"]


async def test_a_shutdown_answers_the_waiting_and_frees_the_model_loading(store: Path
                                                                        ) -> None:
    loader = Loader()
    loader.gate = threading.Event()
    pool, first = make_pool(store, loader)
    waiters = [asyncio.create_task(pool.acquire("b")) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert pool.end_waiting() == 2  # the grace period is over
    for w in waiters:
        with pytest.raises(APIError) as err:
            await asyncio.wait_for(w, 1)
        assert (err.value.status, err.value.code, err.value.message) == (
            503, "server_shutting_down", "The server is shutting down; the reply was cut "
            "short.")
    with pytest.raises(APIError) as late:
        await pool.acquire("c")
    assert late.value.code == "server_shutting_down"
    (await pool.acquire(None)).release()  # a loaded model's requests are the streams' end
    # the server stops: its event loop cancels the load worker mid-load, and then `close`
    # waits for the load still running in its thread and frees the engine it made
    worker = pool._worker
    assert worker is not None
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    closing = asyncio.create_task(asyncio.to_thread(pool.close))
    await asyncio.sleep(0.1)
    assert not closing.done()
    loader.gate.set()
    await asyncio.wait_for(closing, 5)
    assert [e.path.stem for e in loader.made] == ["b"]
    assert loader.made[0].closed.is_set() and first.closed.is_set()


async def test_a_load_that_ends_as_the_server_stops_is_freed_too(store: Path) -> None:
    import time

    loader = Loader()
    loader.gate = threading.Event()
    pool, _ = make_pool(store, loader)
    waiter = asyncio.create_task(pool.acquire("b"))
    await asyncio.sleep(0.05)
    pool.end_waiting()
    with pytest.raises(APIError):
        await waiter
    # the load ends in its thread, and the loop is stopped before the worker takes the engine
    loader.gate.set()
    deadline = time.monotonic() + 5
    while not loader.made and time.monotonic() < deadline:
        time.sleep(0.01)  # blocking: the worker cannot run in between
    time.sleep(0.05)
    assert pool._worker is not None
    pool._worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pool._worker
    assert pool.slot("b").engine is None
    await asyncio.to_thread(pool.close)
    assert [e.path.stem for e in loader.made] == ["b"] and loader.made[0].closed.is_set()


class YieldingRunner:
    """Records `yield_core` calls, as `LlamaCppRunner` takes them."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def yield_core(self, on: bool) -> None:
        self.calls.append(on)


async def test_loaded_models_yield_a_core_while_another_loads(store: Path) -> None:
    loader = Loader()
    pool, first = make_pool(store, loader, max_loaded=3)
    first.engine = type("Core", (), {"runner": YieldingRunner()})()  # AsyncEngine.engine
    seen: list[list[bool]] = []
    loader.during = lambda: seen.append(list(first.engine.runner.calls))
    (await pool.acquire("b")).release()
    assert seen == [[True]]  # during the load: one thread fewer
    assert first.engine.runner.calls == [True, False]  # after it: all of them again
    with pytest.raises(APIError):
        await pool.acquire("broken")
    assert first.engine.runner.calls == [True, False, True, False]  # a failed load too


def test_durations() -> None:
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration("-1s") == -1.0
    assert parse_duration("0") == 0.0
    assert parse_duration("1.5m") == 90.0
    with pytest.raises(ValueError):
        parse_duration("--5m")  # one sign at most, as Go's ParseDuration
    with pytest.raises(ValueError):
        parse_duration("5 minutes")
    assert keep_alive_seconds(None) == keep_alive_seconds("") == "default"
    assert keep_alive_seconds(-1) is None and keep_alive_seconds("-5m") is None
    assert keep_alive_seconds(0) == 0.0 and keep_alive_seconds("10m") == 600.0
    with pytest.raises(APIError, match='time: invalid duration "soon"'):
        keep_alive_seconds("soon")
