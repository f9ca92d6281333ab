"""The chat-management actions of `ChatApp` (copy, rename, settings, export, trim, delete,
theme, screenshot), kept apart from the conversation core in `app.py`.

A mixin: the methods use `ChatApp`'s store, chat, prompt and helpers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tui.export import chat_to_markdown, last_code_block, safe_filename
from tui.screens.dialogs import ConfirmScreen, TextPromptScreen
from tui.screens.help import HelpScreen
from tui.screens.settings import SettingsScreen
from tui.settings import ChatSettings
from tui.widgets.sidebar import ChatList

if TYPE_CHECKING:
    from tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object

THEMES = ["textual-dark", "nord", "gruvbox", "tokyo-night", "catppuccin-latte"]


class ChatActions(_Base):
    """Key actions that manage chats rather than the conversation itself."""

    def _last_reply(self) -> str | None:
        if self.chat is None:
            return None
        messages = self.store.messages(self.chat.id)
        return next((m.content for m in reversed(messages) if m.role == "assistant"), None)

    def action_copy_reply(self) -> None:
        text = self._last_reply()
        if not text:
            self.notify("No reply to copy.")
            return
        self._copy(text, "reply")

    def action_copy_code(self) -> None:
        if self.chat is None:
            return
        for message in reversed(self.store.messages(self.chat.id)):
            if message.role == "assistant" and (code := last_code_block(message.content)):
                self._copy(code, "code block")
                return
        self.notify("No code block in this chat.")

    def _copy(self, text: str, what: str) -> None:
        # OSC 52 reaches the system clipboard in most terminals (and over SSH); Textual also
        # keeps the text as its own clipboard, so ctrl+v in the input works where OSC 52 doesn't.
        self.copy_to_clipboard(text)
        self.notify(f"Copied the {what} ({len(text)} chars).")

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.config.keymap, str(self.config_path or "config.toml")))

    def action_rename_chat(self) -> None:
        if self.chat is None:
            return

        def done(title: str | None) -> None:
            if title and self.chat is not None:
                self.chat.title = title
                self.store.rename_chat(self.chat.id, title)
                self._refresh_sidebar()

        self.push_screen(TextPromptScreen("Rename chat", self.chat.title), done)

    def action_settings(self) -> None:
        if self.chat is None:
            return

        def done(settings: ChatSettings | None) -> None:
            if settings is not None and self.chat is not None:
                self.chat.settings = settings
                self.store.update_settings(self.chat.id, settings)
                self.notify("Settings saved for this chat.")
                self._failed_model = None  # an explicit choice deserves a fresh try
                self._sync_model()

        models = self.backend.available_models() if self.ready else [self.backend.model_name]
        default = self._default_model or self.backend.model_name
        self.push_screen(SettingsScreen(self.chat.settings, self.chat.title, models, default), done)

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(ChatList)
        sidebar.display = not sidebar.display

    def action_export_chat(self) -> None:
        if self.chat is None:
            return
        directory = self.config.export_dir or Path.cwd()
        path = directory / f"{safe_filename(self.chat.title)}-{self.chat.id}.md"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(chat_to_markdown(self.chat, self.store.messages(self.chat.id)))
        except OSError as exc:
            self.notify(f"Export failed: {exc}", severity="error")
            return
        self.notify(f"Exported to {path}")

    async def action_trim_chat(self) -> None:
        """Delete the oldest user turn and the replies to it, to make room in the context."""
        if self._refuse_while_busy() or self.chat is None:
            return
        messages = self.store.messages(self.chat.id)
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if len(users) < 2:
            self.notify("Nothing to trim: keep at least the last message.")
            return
        for message in messages[users[0] : users[1]]:
            self.store.delete_message(message.id)
        await self._open_chat(self.chat.id)
        self.notify("Dropped the oldest turn.")

    def action_delete_chat(self) -> None:
        if self.chat is None:
            return
        chat = self.chat

        def done(yes: bool | None) -> None:
            if not yes:
                return

            async def delete() -> None:
                self.store.delete_chat(chat.id)
                remaining = self.store.list_chats()
                await self._open_chat(remaining[0].id if remaining else self._create_chat().id)

            self._after_reply_stops(delete)

        self.push_screen(ConfirmScreen(f"Delete “{chat.title}”?"), done)

    def action_next_theme(self) -> None:
        current = THEMES.index(self.theme) if self.theme in THEMES else -1
        self.theme = THEMES[(current + 1) % len(THEMES)]
        self.store.set_pref("theme", self.theme)
        self.notify(f"Theme: {self.theme}")

    def action_screenshot(self) -> None:
        directory = self.config.export_dir or Path.cwd()
        path = self.save_screenshot(path=str(directory))
        self.notify(f"Screenshot saved to {path}")
