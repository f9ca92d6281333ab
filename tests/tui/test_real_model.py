"""The chat against the embedded model in-process (skips without it: `embedded_model`)."""

from __future__ import annotations

import pytest

from models.registry import DEFAULT_MODEL
from tests.tui.conftest import SIZE, send, wait_until
from tui.app import ChatApp
from tui.chat_settings import ChatSettings
from tui.config import ChatConfig
from tui.engine_client import EngineClient
from tui.store import ChatStore
from tui.widgets.conversation import ErrorView

pytestmark = pytest.mark.model


async def turn(pilot, text: str, n_messages: int) -> None:
    """Send `text` and wait until the chat holds `n_messages` or shows an error."""
    app = pilot.app
    await send(pilot, text)

    def settled() -> bool:
        stored = len(app.session.store.messages(app.session.chat.id)) >= n_messages
        return (stored and not app.busy) or bool(app.conversation.query(ErrorView))

    await wait_until(pilot, settled, timeout=180)
    errors = [str(e.render()) for e in app.conversation.query(ErrorView)]
    assert not errors, errors


async def test_real_reply_streams_with_stats(model_home, db_path):
    client = EngineClient(DEFAULT_MODEL)
    store = ChatStore(db_path)
    config = ChatConfig(defaults=ChatSettings(temperature=0.0, max_tokens=24))
    app = ChatApp(client, store, config)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.status.info.state != "loading", timeout=120)
            assert app.ready, app.query_one("#banner").render()
            await turn(pilot, "What is the capital of France?", 2)
            reply = app.conversation.messages()[-1]
            assert reply.role == "assistant" and reply.text.strip()
            info = app.status.info
            assert info.backend == "llamacpp" and info.model == DEFAULT_MODEL
            assert info.decode_tok_s and info.decode_tok_s > 0
            assert info.ttft_s and info.ttft_s > 0
            # The follow-up resends the history; the engine serves its prefix from cache.
            await turn(pilot, "And of Germany?", 4)
            assert app.status.info.cached_tokens and app.status.info.cached_tokens > 0
    finally:
        client.close()
        store.close()


async def test_long_prompt_shows_prefill_progress_until_the_first_token(model_home, db_path):
    client = EngineClient(DEFAULT_MODEL)
    store = ChatStore(db_path)
    config = ChatConfig(defaults=ChatSettings(temperature=0.0, max_tokens=2))
    app = ChatApp(client, store, config)
    seen: list[tuple[int, int]] = []
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.status.info.state != "loading", timeout=120)
            await send(pilot, "The history of computing. " * 200)

            def done() -> bool:
                if app.status.info.prefilling is not None:
                    seen.append(app.status.info.prefilling)
                return len(app.session.store.messages(app.session.chat.id)) >= 2 and not app.busy

            await wait_until(pilot, done, timeout=300)
            prompt_tokens = app.session.store.messages(app.session.chat.id)[-1]
            assert seen, "no prefill progress was shown"
            totals = {total for _, total in seen}
            assert len(totals) == 1 and all(done < total for done, total in seen)
            assert [d for d, _ in seen] == sorted(d for d, _ in seen)
            assert app.status.info.prefilling is None  # gone once the reply started
            assert app.status.info.context_tokens == totals.pop() + 2, prompt_tokens
    finally:
        client.close()
        store.close()
