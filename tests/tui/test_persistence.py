"""Chats survive a restart; settings are per chat; the schema migrates."""

from __future__ import annotations

import sqlite3

import pytest

from tests.tui.conftest import SIZE, ready, reply_done, send, wait_until
from tui.chat_settings import ChatSettings
from tui.store import MIGRATIONS, ChatStore, SchemaTooNewError


async def test_conversation_survives_restart(make_app, scripted):
    app = make_app(scripted(["Paris."]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "Capital of France?")
        await reply_done(pilot)
        chat_id = app.session.chat.id
    engine = scripted()
    app2 = make_app(engine)
    async with app2.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app2.session.chat.id == chat_id
        assert [(v.role, v.text) for v in app2.conversation.messages()] == [
            ("user", "Capital of France?"),
            ("assistant", "Paris."),
        ]
        # The last reply's numbers come back with the chat.
        assert round(app2.status.info.ttft_s, 3) == 0.05
        # A follow-up after the restart sends the restored history.
        await send(pilot, "And Italy?")
        await reply_done(pilot)
        assert [m["content"] for m in engine.submitted[-1].messages] == [
            "Capital of France?", "Paris.", "And Italy?",
        ]


async def test_settings_are_saved_per_chat(make_app, scripted):
    engine = scripted()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        first_id = app.session.chat.id
        await pilot.press("f3")
        await wait_until(pilot, lambda: app.screen.id != "_default")
        screen = app.screen
        screen.query_one("#system").text = "Answer in French."
        screen.query_one("#temperature").value = "0.2"
        screen.query_one("#seed").value = "7"
        screen.query_one("#max_tokens").value = ""
        await pilot.click("#save")
        await wait_until(pilot, lambda: app.screen is not screen)
        await send(pilot, "hi")
        await reply_done(pilot)
        messages, params = engine.submitted[-1].messages, engine.submitted[-1].params
        assert messages[0] == {"role": "system", "content": "Answer in French."}
        assert (params.temperature, params.seed, params.max_tokens) == (0.2, 7, None)
        # A new chat starts from the defaults.
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.session.chat.id != first_id)
        assert app.session.chat.settings == ChatSettings()
    stored = app.session.store.get_chat(first_id).settings
    assert stored.system_prompt == "Answer in French." and stored.temperature == 0.2


async def test_settings_screen_rejects_bad_values(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f3")
        await wait_until(pilot, lambda: app.screen.id != "_default")
        screen = app.screen
        screen.query_one("#top_p").value = "2"
        await pilot.click("#save")
        await pilot.pause()
        assert app.screen is screen
        assert "top-p" in str(screen.query_one("#error").render())
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is not screen)
        assert app.session.chat.settings.top_p == 0.95


async def test_rename_export_and_delete(make_app, scripted, tmp_path):
    app = make_app(scripted(["```sh\nls -la\n```"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "list files")
        await reply_done(pilot)
        await pilot.press("f2")
        await wait_until(pilot, lambda: app.screen.id != "_default")
        app.screen.query_one("#text").value = "Shell help"
        await pilot.press("enter")
        await pilot.pause()
        assert app.session.store.get_chat(app.session.chat.id).title == "Shell help"
        await pilot.press("f5")
        exported = (tmp_path / "exports" / f"Shell-help-{app.session.chat.id}.md").read_text()
        assert exported.startswith("# Shell help") and "## Assistant" in exported
        await pilot.press("ctrl+t")
        assert app.clipboard == "ls -la\n"
        await pilot.press("ctrl+o")
        assert app.clipboard == "```sh\nls -la\n```"
        deleted = app.session.chat.id
        await pilot.press("f8")
        await wait_until(pilot, lambda: app.screen.id != "_default")
        await pilot.press("y")
        await wait_until(pilot, lambda: app.session.chat.id != deleted)
        assert app.session.store.get_chat(deleted) is None
        assert app.session.store.messages(deleted) == []


def test_store_migrates_and_refuses_newer_schema(tmp_path):
    path = tmp_path / "chats.db"
    store = ChatStore(path)
    assert store.schema_version == len(MIGRATIONS)
    chat = store.create_chat("t", ChatSettings(top_k=5))
    store.add_message(chat.id, "user", "hi")
    store.close()
    reopened = ChatStore(path)
    assert reopened.get_chat(chat.id).settings.top_k == 5
    reopened.close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(SchemaTooNewError):
        ChatStore(path)


async def test_model_switch_per_chat(db_path, scripted):
    from tui.app import ChatApp
    from tui.config import ChatConfig
    from tui.engine_client import EngineClient
    from tui.store import ChatStore

    engines = {
        "small": scripted(["from small"], model_name="small"),
        "big": scripted(["from big"], model_name="big", context_length=8192),
    }

    def factory(name):
        if name not in engines:
            raise FileNotFoundError(name)
        return engines[name].engine

    store = ChatStore(db_path)
    client = EngineClient("small", factory=factory, models=["small", "big", "gone"])
    app = ChatApp(client, store, ChatConfig())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        small_chat = app.session.chat.id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.session.chat.id != small_chat)
        await pilot.press("f3")
        await wait_until(pilot, lambda: app.screen.id != "_default")
        app.screen.query_one("#model").value = "big"
        await pilot.click("#save")
        await wait_until(pilot, lambda: app.ready and client.model_name == "big")
        assert engines["small"].closed and app.status.info.context_length == 8192
        await send(pilot, "hi")
        await reply_done(pilot)
        assert app.conversation.messages()[-1].text == "from big"
        # Going back to the first chat loads its (default) model again.
        engines["small"] = scripted(["small again"], model_name="small")
        app.query_one("#sidebar").focus()
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: app.session.chat.id == small_chat)
        await wait_until(pilot, lambda: app.ready and client.model_name == "small")
        # A model that fails to load leaves the current one working.
        app.session.chat.settings.model = "gone"
        app.sync_model()
        await wait_until(pilot, lambda: app.ready)
        assert client.model_name == "small" and app.status.info.state == "ready"
    store.close()
