"""Fixtures for TUI tests: an app wired to the fake engine and a temp data dir."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tui.fake_engine import FakeEngine
from tui.app import ChatApp
from tui.config import ChatConfig
from tui.engine_backend import EngineBackend
from tui.store import ChatStore

SIZE = (100, 30)


@pytest.fixture(autouse=True)
def _tandem_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test away from the real user data and config dirs."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "chats.db"


@pytest.fixture
def make_app(db_path: Path, tmp_path: Path) -> Callable[..., ChatApp]:
    """Build a ChatApp over a FakeEngine; the same db_path is reused across calls, so two
    apps made in one test see each other's data (an app restart)."""
    stores: list[ChatStore] = []

    def make(engine: FakeEngine | None = None, config: ChatConfig | None = None, **kwargs) -> ChatApp:
        engine = engine or FakeEngine()
        store = ChatStore(db_path)
        stores.append(store)
        config = config or ChatConfig(export_dir=tmp_path / "exports")
        backend = EngineBackend(engine.model_name, factory=lambda _name: engine)
        return ChatApp(backend, store, config, **kwargs)

    yield make
    for store in stores:
        store.close()


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
