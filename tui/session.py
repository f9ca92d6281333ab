"""`ChatSession`: the open chat and its stored history, without any Textual.

The app keeps widgets and workers; what a key press does to the chats (which one is open,
what is sent, what a regenerate, edit, trim or delete removes, which model a chat wants)
is decided here, so it can be tested without a running UI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tui.chat_settings import ChatSettings
from tui.client import Message, ReplyStream
from tui.export import chat_to_markdown, last_code_block, title_from
from tui.store import DEFAULT_TITLE, Chat, ChatStore, StoredMessage


@dataclass(frozen=True, slots=True)
class RegeneratePlan:
    """What a regenerate does: delete `drop` (the last reply's id) if set, then answer the
    last user turn again if `possible`."""

    drop: int | None
    possible: bool


class ChatSession:
    """The chats of one app run: the open one, and the models chats fall back to.

    Args:
        store: chat database (the caller opens and closes it).
        defaults: settings a new chat starts with (copied, never shared).
        system_prompt: if given, new chats use it and the session starts on a new chat.
    """

    def __init__(
        self, store: ChatStore, defaults: ChatSettings | None = None,
        system_prompt: str | None = None,
    ):
        self.store = store
        self.defaults = defaults or ChatSettings()
        self.system_prompt = system_prompt
        self.chat: Chat | None = None
        self.default_model: str | None = None  # what a chat's `model=None` means
        self.failed_model: str | None = None  # don't retry a model that just failed

    # -- which chat is open -----------------------------------------------------------------

    def initial_chat_id(self) -> int:
        """The chat to open at start: the last one used, else an empty one, else a new one
        (always a new one with a `system_prompt`)."""
        if self.system_prompt is None:
            last = self.store.get_pref("last_chat")
            if last is not None and self.store.get_chat(int(last)):
                return int(last)
            chats = self.store.list_chats()
            if chats and not self.store.messages(chats[0].id):
                return chats[0].id  # reuse an empty chat instead of piling up new ones
        return self.new().id

    def new(self) -> Chat:
        """Create (but do not open) a chat with the default settings."""
        settings = ChatSettings.from_dict(self.defaults.to_dict())
        if self.system_prompt is not None:
            settings.system_prompt = self.system_prompt
        return self.store.create_chat(DEFAULT_TITLE, settings)

    def open(self, chat_id: int) -> list[StoredMessage]:
        """Make `chat_id` the open chat (remembered for the next start); returns its messages.
        Raises LookupError if no such chat exists."""
        chat = self.store.get_chat(chat_id)
        if chat is None:
            raise LookupError(f"no chat {chat_id}")
        self.chat = chat
        self.store.set_pref("last_chat", str(chat_id))
        return self.store.messages(chat_id)

    def chats(self) -> list[Chat]:
        """All chats, most recently active first."""
        return self.store.list_chats()

    def messages(self) -> list[StoredMessage]:
        """The open chat's messages (none when no chat is open)."""
        return self.store.messages(self.chat.id) if self.chat else []

    def history(self, chat: Chat | None = None) -> list[Message]:
        """`chat` (default: the open one) as chat-template messages, system prompt first.
        The whole history goes every turn; the engine's prefix cache makes the seen part
        nearly free."""
        chat = chat or self.chat
        if chat is None:
            return []
        messages: list[Message] = []
        if chat.settings.system_prompt:
            messages.append({"role": "system", "content": chat.settings.system_prompt})
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(chat.id)]
        return messages

    # -- turns ------------------------------------------------------------------------------

    def add_user(self, text: str) -> StoredMessage:
        """Store a user turn in the open chat; its first one also titles an untitled chat."""
        chat = self._open_chat()
        if chat.title == DEFAULT_TITLE and not self.store.messages(chat.id):
            self.rename(title_from(text))
        return self.store.add_message(chat.id, "user", text)

    def add_reply(
        self, chat: Chat, text: str, reply: ReplyStream, model: str | None
    ) -> StoredMessage:
        """Store `reply` (its text and stats) as the assistant turn of `chat`."""
        stats = reply.stats
        meta: dict[str, Any] = {
            "finish_reason": stats.finish_reason,
            "ttft_s": stats.ttft_s,
            "decode_tok_s": stats.decode_tok_s or reply.live_decode_tok_s(),
            "prompt_tokens": stats.prompt_tokens,
            "completion_tokens": stats.completion_tokens,
            "cached_tokens": stats.cached_tokens,
            "context_tokens": stats.context_tokens,
            "model": model,
        }
        return self.store.add_message(chat.id, "assistant", text, meta)

    def last_reply_meta(self, messages: list[StoredMessage] | None = None) -> dict[str, Any]:
        """The stats stored with the last reply of `messages` (default: the open chat)."""
        messages = self.messages() if messages is None else messages
        last = next((m for m in reversed(messages) if m.role == "assistant"), None)
        return last.meta if last else {}

    def last_reply(self) -> str | None:
        """The text of the open chat's last reply, if any."""
        return next((m.content for m in reversed(self.messages()) if m.role == "assistant"), None)

    def last_code(self) -> str | None:
        """The last code block of the most recent reply that has one."""
        for message in reversed(self.messages()):
            if message.role == "assistant" and (code := last_code_block(message.content)):
                return code
        return None

    def regenerate_plan(self) -> RegeneratePlan:
        """What regenerating the open chat's last reply means (nothing is changed yet)."""
        messages = self.messages()
        drop = None
        if messages and messages[-1].role == "assistant":
            drop = messages.pop().id
        return RegeneratePlan(drop, bool(messages) and messages[-1].role == "user")

    def delete_message(self, message_id: int) -> None:
        """Delete one stored message."""
        self.store.delete_message(message_id)

    def edit_last(self) -> str | None:
        """Delete the open chat's last user turn and what followed; returns its text, or
        None (deleting nothing) when the chat has no user turn."""
        chat = self._open_chat()
        last_user = next((m for m in reversed(self.messages()) if m.role == "user"), None)
        if last_user is None:
            return None
        self.store.delete_messages_from(chat.id, last_user.id)
        return last_user.content

    def trim_oldest_turn(self) -> bool:
        """Delete the oldest user turn and the replies to it, keeping the last user turn;
        returns False (deleting nothing) when fewer than two user turns exist."""
        messages = self.messages()
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if len(users) < 2:
            return False
        for message in messages[users[0] : users[1]]:
            self.store.delete_message(message.id)
        return True

    # -- chat-level changes -----------------------------------------------------------------

    def rename(self, title: str) -> None:
        """Retitle the open chat."""
        chat = self._open_chat()
        chat.title = title
        self.store.rename_chat(chat.id, title)

    def save_settings(self, settings: ChatSettings) -> None:
        """Store new settings for the open chat; a model that failed gets another try."""
        chat = self._open_chat()
        chat.settings = settings
        self.store.update_settings(chat.id, settings)
        self.failed_model = None  # an explicit choice deserves a fresh try

    def delete(self, chat_id: int) -> int:
        """Delete `chat_id`; returns the chat to open next (the most recent one left, or a
        new one when none is)."""
        self.store.delete_chat(chat_id)
        remaining = self.store.list_chats()
        return remaining[0].id if remaining else self.new().id

    def export_markdown(self) -> str:
        """The open chat as a Markdown document."""
        return chat_to_markdown(self._open_chat(), self.messages())

    def wanted_model(self, loaded: str) -> str | None:
        """The model to switch to for the open chat, or None to stay on `loaded` (no chat,
        no preference, already loaded, or it just failed to load)."""
        if self.chat is None:
            return None
        wanted = self.chat.settings.model or self.default_model
        if not wanted or wanted in (loaded, self.failed_model):
            return None
        return wanted

    # -- preferences ------------------------------------------------------------------------

    def saved_theme(self) -> str | None:
        """The theme chosen in an earlier run, if any."""
        return self.store.get_pref("theme")

    def save_theme(self, theme: str) -> None:
        """Remember `theme` for the next run."""
        self.store.set_pref("theme", theme)

    def _open_chat(self) -> Chat:
        if self.chat is None:
            raise LookupError("no chat is open")
        return self.chat
