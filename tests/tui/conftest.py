"""Fixtures for TUI tests: an app wired to the real engine over a scripted runner
(`scripted.py`), a temp data dir, and the embedded model's store for the real-model tests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.tui.scripted import ScriptedEngine, StepClock
from tui.app import ChatApp
from tui.config import ChatConfig
from tui.engine_client import EngineClient
from tui.store import ChatStore

SIZE = (100, 30)


@pytest.fixture(autouse=True)
def _tandem_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test away from the real user data and config dirs."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def model_home(_tandem_home: Path, embedded_model: Path) -> Path:
    """The temp TANDEM_HOME, seeing the real model store (the embedded model's directory)."""
    _tandem_home.mkdir(parents=True, exist_ok=True)
    (_tandem_home / "models").symlink_to(embedded_model.parent, target_is_directory=True)
    return _tandem_home


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "chats.db"


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ScriptedEngine]:
    """Build `ScriptedEngine(replies, **kwargs)`s on one step clock; all are shut down after
    the test (released first, so a held step cannot block the shutdown)."""
    clock = StepClock()
    clock.install(monkeypatch)
    engines: list[ScriptedEngine] = []

    def make(replies: list[str] | None = None, **kwargs) -> ScriptedEngine:
        engine = ScriptedEngine(list(replies or []), clock=clock, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.release()
        engine.shutdown()


@pytest.fixture
def make_app(db_path: Path, tmp_path: Path, scripted) -> Callable[..., ChatApp]:
    """Build a ChatApp over a ScriptedEngine; the same db_path is reused across calls, so
    two apps made in one test see each other's data (an app restart)."""
    stores: list[ChatStore] = []

    def make(engine: ScriptedEngine | None = None, config: ChatConfig | None = None,
             **kwargs) -> ChatApp:
        engine = engine or scripted()
        store = ChatStore(db_path)
        stores.append(store)
        config = config or ChatConfig(export_dir=tmp_path / "exports")
        client = EngineClient(engine.model_name, factory=lambda _name: engine.engine)
        return ChatApp(client, store, config, **kwargs)

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def held_reply(make_app, scripted):
    """`async with held_reply(replies, text, after_tokens=1) as (pilot, engine)`: an app
    over a held `ScriptedEngine` that has sent `text` and shows the first `after_tokens`
    tokens of the reply, its next step frozen until `engine.release()` or a cancel."""

    @asynccontextmanager
    async def run(replies: list[str], text: str, *, after_tokens: int = 1
                  ) -> AsyncIterator[tuple[object, ScriptedEngine]]:
        engine = scripted(replies)
        engine.hold(after_tokens)
        app = make_app(engine)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await send(pilot, text)

            def frozen() -> bool:
                view = app.conversation.messages()[-1]
                return (app.busy and engine.runner.holding.is_set()
                        and view.role == "assistant" and len(view.text) == after_tokens)

            await wait_until(pilot, frozen)
            yield pilot, engine

    return run


async def wait_until(pilot, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the app run until `predicate()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.01)


async def ready(pilot) -> None:
    """Wait for the model to load and the first chat to open."""
    await wait_until(pilot, lambda: pilot.app.ready)
    await pilot.pause()


async def send(pilot, text: str) -> None:
    """Type `text` into the prompt and press Enter."""
    pilot.app.prompt.text = text
    await pilot.press("enter")


async def reply_done(pilot) -> None:
    """Wait until no reply is streaming."""
    await pilot.pause()
    await wait_until(pilot, lambda: not pilot.app.busy)
    await pilot.pause()
