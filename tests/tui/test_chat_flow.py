"""Pilot tests of the conversation flow against the real engine over a scripted runner."""

from __future__ import annotations

from tests.tui.conftest import SIZE, ready, reply_done, send, wait_until
from tui.widgets.conversation import ErrorView, MessageView


def texts(app) -> list[tuple[str, str]]:
    return [(v.role, v.text) for v in app.conversation.messages()]


async def test_send_streams_markdown_reply_and_updates_status(make_app, scripted):
    engine = scripted(["Here is code:\n\n```python\nprint('hi')\n```\n\nDone."])
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
        # ctx: the 36-token prompt, the 47-token reply and its EOS.
        assert (info.context_tokens, info.context_length) == (84, 4096)
        # KV, in tokens (256 blocks of 16): the finished reply's blocks are free again (and
        # stay in the prefix cache).
        assert info.kv == (0, 4096)
        # The chat is titled from the first message.
        assert app.session.chat.title == "show me code"


async def test_second_turn_resends_history_and_reuses_prefix(make_app, scripted):
    engine = scripted(["first answer " * 20, "second answer"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await reply_done(pilot)
        await send(pilot, "two")
        await reply_done(pilot)
        messages = engine.submitted[-1].messages
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


async def test_escape_stops_reply_and_keeps_partial(held_reply):
    # Esc lands while the step for the third token runs; that step completes.
    async with held_reply(["one two three four five six"], "count", after_tokens=2) as (
        pilot, engine
    ):
        app = pilot.app
        await pilot.press("escape")
        await reply_done(pilot)
        assert engine.cancelled == ["req-0"]
        reply = app.conversation.messages()[-1]
        assert reply.text == "one"
        assert "stopped" in str(reply.query_one(".note").render())
        stored = app.session.store.messages(app.session.chat.id)
        assert stored[-1].meta["finish_reason"] == "abort"
        # The app is still usable after a stop.
        engine.release()
        await send(pilot, "again")
        await reply_done(pilot)
        assert texts(app)[-1] == ("assistant", "You said: again")


async def test_regenerate_replaces_last_reply(make_app, scripted):
    engine = scripted(["first try", "second try"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await reply_done(pilot)
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        assert texts(app) == [("user", "hello"), ("assistant", "second try")]
        assert [m.content for m in app.session.store.messages(app.session.chat.id)] == ["hello", "second try"]
        # The regenerated request carried the same history (without the old reply).
        assert [m["content"] for m in engine.submitted[-1].messages] == ["hello"]


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
        first_id = app.session.chat.id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.session.chat.id != first_id)
        assert texts(app) == []
        await send(pilot, "second chat")
        await reply_done(pilot)
        chats = app.session.store.list_chats()
        assert [c.title for c in chats] == ["second chat", "first chat"]
        sidebar = app.query_one("#sidebar")
        sidebar.focus()
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: app.session.chat.id == first_id)
        assert texts(app)[0] == ("user", "first chat")


async def test_context_full_is_shown_with_hint(make_app, scripted):
    app = make_app(scripted(context_length=8))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "this message is far too long for a context of eight tokens")
        await reply_done(pilot)
        text = str(app.conversation.query(ErrorView).last().render())
        assert "Context full" in text and "ctrl+n" in text
        assert app.status.info.state == "ready"


async def test_model_missing_is_shown_not_crashed(make_app, db_path):
    from tui.app import ChatApp
    from tui.engine_client import EngineClient
    from tui.store import ChatStore

    def missing(name):
        raise FileNotFoundError(f"{name} is not in the model store")

    store = ChatStore(db_path)
    app = ChatApp(EngineClient("nope", factory=missing), store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.status.info.state == "error")
        banner = app.query_one("#banner")
        assert banner.display and "Model not found" in str(banner.render())
        await send(pilot, "hello")  # refused politely: kept in the prompt, nothing sent
        await pilot.pause()
        assert app.prompt.text == "hello"
        assert not app.busy and not app.query(MessageView)
        assert app.session.store.messages(app.session.chat.id) == []
        assert app.session.chat.title == "New chat"  # not titled from an unsent message
    store.close()


async def test_quit_while_streaming_stores_the_partial_reply(held_reply):
    # "a" is on screen at ctrl+q; the step in flight adds "b" before the abort.
    async with held_reply(["ab c d e f g"], "go") as (pilot, engine):
        app = pilot.app
        chat_id = app.session.chat.id
        await pilot.press("ctrl+q")
    assert app.return_code == 0
    assert engine.cancelled == ["req-0"]
    stored = app.session.store.messages(chat_id)
    assert [(m.role, m.content) for m in stored] == [("user", "go"), ("assistant", "ab")]
    assert stored[-1].meta["finish_reason"] == "abort"


async def test_ctrl_c_stops_a_reply_then_quits(held_reply):
    async with held_reply(["a b c d"], "go") as (pilot, engine):
        app = pilot.app
        await pilot.press("ctrl+c")
        await reply_done(pilot)
        assert app.is_running and engine.cancelled == ["req-0"]
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 0
