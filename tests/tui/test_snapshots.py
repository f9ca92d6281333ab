"""Layout snapshots (pytest-textual-snapshot). Regenerate with `--snapshot-update` after an
intended UI change and review the SVG diff. Deterministic: fixed size, the scripted
engine's step clock, no clock in the UI."""

from __future__ import annotations

import pytest

from tests.tui.conftest import SIZE, ready, reply_done, send, wait_until
from tui.app import ChatApp
from tui.engine_client import EngineClient
from tui.store import ChatStore

REPLY = """Sure. A list comprehension builds a list in one expression:

```python
squares = [n * n for n in range(5)]
print(squares)  # [0, 1, 4, 9, 16]
```

It reads as *"n squared, for each n"*."""


async def steady(pilot) -> None:
    """Drop focus, so no blinking cursor makes the snapshot depend on when it is taken
    (turning blink off is not enough: TextArea caches lines drawn with the cursor)."""
    pilot.app.screen.set_focus(None)
    await pilot.pause()


def _done(*texts: str):
    async def run_before(pilot) -> None:
        await ready(pilot)
        for text in texts:
            await send(pilot, text)
            await reply_done(pilot)
        await steady(pilot)

    return run_before


def test_conversation(snap_compare, make_app, scripted):
    app = make_app(scripted(["Hello! How can I help?", REPLY]))
    assert snap_compare(app, terminal_size=SIZE, run_before=_done("hi", "Show me a list comprehension"))


def test_help_screen(snap_compare, make_app):
    async def run_before(pilot) -> None:
        await ready(pilot)
        await pilot.press("f1")
        await wait_until(pilot, lambda: pilot.app.screen.id != "_default")
        await steady(pilot)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare, make_app):
    async def run_before(pilot) -> None:
        await ready(pilot)
        await pilot.press("f3")
        await wait_until(pilot, lambda: pilot.app.screen.id != "_default")
        await steady(pilot)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_context_full(snap_compare, make_app, scripted):
    app = make_app(scripted(context_length=40))
    assert snap_compare(
        app, terminal_size=SIZE, run_before=_done("a question far too long for this tiny context")
    )


@pytest.fixture
def missing_model_app(db_path):
    def missing(name):
        raise FileNotFoundError(f"{name} is not in the model store")

    store = ChatStore(db_path)
    yield ChatApp(EngineClient("smollm2-135m-instruct", factory=missing), store)
    store.close()


def test_model_missing(snap_compare, missing_model_app):
    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.status.info.state == "error")
        await steady(pilot)

    assert snap_compare(missing_model_app, terminal_size=SIZE, run_before=run_before)
