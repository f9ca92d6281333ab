"""`ChatSession` without a UI: which chat opens, what is sent, and what each edit removes."""

from __future__ import annotations

import pytest

from tui.chat_settings import ChatSettings
from tui.client import ReplyStream
from tui.session import ChatSession, RegeneratePlan
from tui.store import ChatStore


@pytest.fixture
def store():
    store = ChatStore(":memory:")
    yield store
    store.close()


def turns(session: ChatSession) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in session.messages()]


def chat_with(session: ChatSession, *contents: str) -> int:
    """Open a new chat holding `contents` as alternating user / assistant turns."""
    chat_id = session.new().id
    session.open(chat_id)
    for i, content in enumerate(contents):
        session.store.add_message(chat_id, "user" if i % 2 == 0 else "assistant", content)
    return chat_id


class _Reply(ReplyStream):
    def __init__(self, prompt_tokens: int, completion_tokens: int):
        super().__init__(prompt_tokens)
        self.stats.completion_tokens = completion_tokens
        self.stats.finish_reason = "stop"
        self.stats.ttft_s, self.stats.decode_tok_s, self.stats.cached_tokens = 0.05, 100.0, 16

    async def _chunks(self):  # pragma: no cover - never iterated here
        yield ""

    def cancel(self) -> None:  # pragma: no cover
        pass


def test_initial_chat_is_the_last_used_then_an_empty_one_then_a_new_one(store):
    first = ChatSession(store)
    assert first.initial_chat_id() == 1  # empty store: a new chat
    assert [c.id for c in store.list_chats()] == [1]
    assert first.initial_chat_id() == 1  # the empty chat is reused, not piled up
    first.open(1)
    first.add_user("hello")
    store.create_chat("other")  # id 2, newer but never opened
    assert ChatSession(store).initial_chat_id() == 1  # last_chat pref wins
    store.delete_chat(1)
    assert ChatSession(store).initial_chat_id() == 2  # pref is stale: newest empty chat
    assert ChatSession(store, system_prompt="Be brief.").initial_chat_id() == 3


def test_new_chat_copies_defaults_and_system_prompt(store):
    defaults = ChatSettings(temperature=0.2)
    session = ChatSession(store, defaults, system_prompt="Be brief.")
    chat = session.new()
    assert (chat.title, chat.settings.temperature, chat.settings.system_prompt) == (
        "New chat", 0.2, "Be brief."
    )
    chat.settings.temperature = 1.5
    assert session.new().settings.temperature == 0.2  # the defaults were not shared
    assert defaults.system_prompt == ""


def test_open_remembers_the_chat_and_rejects_unknown_ids(store):
    session = ChatSession(store)
    chat_id = chat_with(session, "q", "a")
    assert [(m.role, m.content) for m in session.open(chat_id)] == [("user", "q"), ("assistant", "a")]
    assert store.get_pref("last_chat") == str(chat_id)
    with pytest.raises(LookupError):
        session.open(99)
    assert session.chat.id == chat_id


def test_history_puts_the_system_prompt_first(store):
    session = ChatSession(store, system_prompt="Be brief.")
    assert session.history() == []  # no chat open
    chat_with(session, "q", "a", "q2")
    assert session.history() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
    ]


def test_first_user_turn_titles_the_chat_once(store):
    session = ChatSession(store)
    chat_with(session)
    session.add_user("What is the capital of France?\nAnd why?")
    session.add_user("second message")
    assert session.chat.title == "What is the capital of France?"
    assert store.get_chat(session.chat.id).title == "What is the capital of France?"
    assert turns(session) == [
        ("user", "What is the capital of France?\nAnd why?"), ("user", "second message"),
    ]


def test_add_reply_stores_text_and_stats(store):
    session = ChatSession(store)
    chat_with(session, "q")
    stored = session.add_reply(session.chat, "answer", _Reply(10, 3), "smol")
    assert stored.meta == {
        "finish_reason": "stop", "ttft_s": 0.05, "decode_tok_s": 100.0, "prompt_tokens": 10,
        "completion_tokens": 3, "cached_tokens": 16, "context_tokens": 13, "model": "smol",
    }
    assert session.last_reply_meta()["context_tokens"] == 13
    assert session.last_reply() == "answer"


def test_last_code_comes_from_the_latest_reply_that_has_one(store):
    session = ChatSession(store)
    chat_with(session, "q", "```py\nx = 1\n```", "q2", "no code here")
    assert session.last_code() == "x = 1\n"
    assert session.last_reply() == "no code here"
    chat_with(session, "q")
    assert (session.last_code(), session.last_reply(), session.last_reply_meta()) == (None, None, {})


def test_regenerate_plan_drops_the_last_reply_only(store):
    session = ChatSession(store)
    chat_with(session, "q", "a")
    reply_id = session.messages()[-1].id
    assert session.regenerate_plan() == RegeneratePlan(drop=reply_id, possible=True)
    assert turns(session) == [("user", "q"), ("assistant", "a")]  # the plan changes nothing
    session.delete_message(reply_id)
    assert session.regenerate_plan() == RegeneratePlan(drop=None, possible=True)
    chat_with(session)
    assert session.regenerate_plan() == RegeneratePlan(drop=None, possible=False)


def test_edit_last_removes_the_last_user_turn_and_what_followed(store):
    session = ChatSession(store)
    chat_with(session, "q1", "a1", "q2", "a2")
    assert session.edit_last() == "q2"
    assert turns(session) == [("user", "q1"), ("assistant", "a1")]
    chat_with(session)
    assert session.edit_last() is None


def test_trim_oldest_turn_keeps_the_last_user_turn(store):
    session = ChatSession(store)
    chat_with(session, "q1", "a1", "q2", "a2", "q3")
    assert session.trim_oldest_turn() is True
    assert turns(session) == [("user", "q2"), ("assistant", "a2"), ("user", "q3")]
    assert session.trim_oldest_turn() is True
    assert turns(session) == [("user", "q3")]
    assert session.trim_oldest_turn() is False
    assert turns(session) == [("user", "q3")]


def test_delete_opens_the_newest_chat_left_or_a_new_one(store):
    session = ChatSession(store)
    first = chat_with(session, "old")
    second = chat_with(session, "new")
    assert session.delete(second) == first
    assert session.delete(first) == 3  # none left: a new, empty chat
    assert [c.id for c in store.list_chats()] == [3]


def test_rename_and_settings_are_stored(store):
    session = ChatSession(store)
    chat_id = chat_with(session)
    session.failed_model = "big"
    session.rename("Shell help")
    session.save_settings(ChatSettings(top_k=5, model="big"))
    stored = store.get_chat(chat_id)
    assert (stored.title, stored.settings.top_k, stored.settings.model) == ("Shell help", 5, "big")
    assert session.failed_model is None  # an explicit choice gets a fresh try


def test_wanted_model_follows_the_chat_then_the_default(store):
    session = ChatSession(store)
    assert session.wanted_model("small") is None  # no chat open
    chat_with(session)
    assert session.wanted_model("small") is None  # no default known yet
    session.default_model = "small"
    assert session.wanted_model("small") is None  # already loaded
    assert session.wanted_model("big") == "small"  # back to the default
    session.chat.settings.model = "big"
    assert session.wanted_model("small") == "big"
    session.failed_model = "big"
    assert session.wanted_model("small") is None  # it just failed: stay


def test_theme_and_export(store):
    session = ChatSession(store, system_prompt="Be brief.")
    assert session.saved_theme() is None
    session.save_theme("nord")
    assert ChatSession(store).saved_theme() == "nord"
    chat_with(session, "q", "a")
    session.rename("T")
    lines = session.export_markdown().splitlines()
    assert lines[:2] == ["# T", ""] and lines[2].startswith("_Exported from tandem chat")
    assert lines[3:] == ["", "## System", "", "Be brief.", "", "## User", "", "q", "",
                         "## Assistant", "", "a"]


def test_turn_methods_need_an_open_chat(store):
    session = ChatSession(store)
    for call in (lambda: session.add_user("x"), session.edit_last, lambda: session.rename("t")):
        with pytest.raises(LookupError):
            call()
    assert session.messages() == [] and session.trim_oldest_turn() is False
