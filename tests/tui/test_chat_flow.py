"""Pilot tests of the conversation flow against the scripted fake engine."""

from __future__ import annotations

from tests.tui.conftest import SIZE, ready, reply_done, send, wait_until
from tests.tui.fake_engine import FakeEngine
from tui.widgets.conversation import ErrorView, MessageView


def texts(app) -> list[tuple[str, str]]:
    return [(v.role, v.text) for v in app.conversation.messages()]


async def test_send_streams_markdown_reply_and_updates_status(make_app):
    engine = FakeEngine(["Here is code:\n\n```python\nprint('hi')\n```\n\nDone."])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "show me code")
        await reply_done(pilot)
        assert texts(app) == [
            ("user", "show me code"),
            ("assistant", "Here is code:\n\n```python\nprint('hi')\n```\n\nDone."),
        ]
        # The final full render keeps the code fence intact.
        reply = app.conversation.messages()[-1]
        assert reply.markdown.query("MarkdownFence")
        assert app.prompt.text == ""
        info = app.status.info
        assert info.state == "ready"
        assert round(info.ttft_s, 3) == 0.05 and round(info.decode_tok_s) == 100
        assert info.context_tokens and info.context_length == 4096
        assert info.kv is not None and info.kv[0] > 0
        # The chat is titled from the first message.
        assert app.chat.title == "show me code"


async def test_second_turn_resends_history_and_reuses_prefix(make_app):
    engine = FakeEngine(["first answer " * 20, "second answer"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await reply_done(pilot)
        await send(pilot, "two")
        await reply_done(pilot)
        messages, _, _ = engine.submitted[-1]
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[1]["content"].startswith("first answer")
        assert app.status.info.cached_tokens > 0


async def test_enter_sends_and_ctrl_j_inserts_newline(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert app.prompt.text == "a\nb"
        await pilot.press("enter")
        await reply_done(pilot)
        assert texts(app)[0] == ("user", "a\nb")


async def test_escape_stops_reply_and_keeps_partial(make_app):
    engine = FakeEngine(["one two three four five six"])
    engine.hold()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "count")
        await wait_until(pilot, lambda: app.busy and app.conversation.messages()[-1].text)
        await pilot.press("escape")
        await reply_done(pilot)
        assert engine.cancelled == ["req-1"]
        reply = app.conversation.messages()[-1]
        assert reply.text == "one"
        assert "stopped" in str(reply.query_one(".note").render())
        stored = app.store.messages(app.chat.id)
        assert stored[-1].meta["finish_reason"] == "abort"
        # The app is still usable after a stop.
        engine.release()
        await send(pilot, "again")
        await reply_done(pilot)
        assert texts(app)[-1] == ("assistant", "You said: again")


async def test_regenerate_replaces_last_reply(make_app):
    engine = FakeEngine(["first try", "second try"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await reply_done(pilot)
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        assert texts(app) == [("user", "hello"), ("assistant", "second try")]
        assert [m.content for m in app.store.messages(app.chat.id)] == ["hello", "second try"]
        # The regenerated request carried the same history (without the old reply).
        assert [m["content"] for m in engine.submitted[-1][0]] == ["hello"]


async def test_edit_last_message_and_resend(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "helo")
        await reply_done(pilot)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert app.prompt.text == "helo"
        assert texts(app) == []
        await pilot.press("backspace", "l", "o")  # the cursor is at the end
        await pilot.press("enter")
        await reply_done(pilot)
        assert texts(app) == [("user", "hello"), ("assistant", "You said: hello")]


async def test_new_chat_and_switch_back_from_sidebar(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first chat")
        await reply_done(pilot)
        first_id = app.chat.id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.chat.id != first_id)
        assert texts(app) == []
        await send(pilot, "second chat")
        await reply_done(pilot)
        chats = app.store.list_chats()
        assert [c.title for c in chats] == ["second chat", "first chat"]
        sidebar = app.query_one("#sidebar")
        sidebar.focus()
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: app.chat.id == first_id)
        assert texts(app)[0] == ("user", "first chat")


async def test_context_full_is_shown_with_hint(make_app):
    app = make_app(FakeEngine(context_length=8))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "this message is far too long for a context of eight tokens")
        await reply_done(pilot)
        text = str(app.conversation.query(ErrorView).last().render())
        assert "Context full" in text and "ctrl+n" in text
        assert app.status.info.state == "ready"


async def test_model_missing_is_shown_not_crashed(make_app, db_path):
    from tui.app import ChatApp
    from tui.engine_backend import EngineBackend
    from tui.store import ChatStore

    def missing(name):
        raise FileNotFoundError(f"{name} is not in the model store")

    store = ChatStore(db_path)
    app = ChatApp(EngineBackend("nope", factory=missing), store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.status.info.state == "error")
        banner = app.query_one("#banner")
        assert banner.display and "Model not found" in str(banner.render())
        await send(pilot, "hello")  # refused politely
        assert not app.busy and isinstance(app.conversation.children[0], object)
        assert not app.query(MessageView)
    store.close()


async def test_quit_while_streaming_stores_the_partial_reply(make_app):
    engine = FakeEngine(["a b c d e f g"])
    engine.hold()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await wait_until(pilot, lambda: app.busy and app.conversation.messages()[-1].text)
        chat_id = app.chat.id
        await pilot.press("ctrl+q")
    assert app.return_code == 0
    assert engine.cancelled == ["req-1"]
    stored = app.store.messages(chat_id)
    assert [(m.role, m.content) for m in stored] == [("user", "go"), ("assistant", "a")]
    assert stored[-1].meta["finish_reason"] == "abort"


async def test_ctrl_c_stops_a_reply_then_quits(make_app):
    engine = FakeEngine(["a b c d"])
    engine.hold()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await wait_until(pilot, lambda: app.busy)
        await pilot.press("ctrl+c")
        await reply_done(pilot)
        assert app.is_running and engine.cancelled
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 0
