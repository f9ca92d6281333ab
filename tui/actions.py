"""What the chat's keys do: send, stop, quit, new, switch, regenerate, edit, copy, rename,
settings, export, trim, delete, theme, screenshot, status details.

`ChatActions` is a mixin of `ChatApp`, typed against the `ChatHost` protocol (`host.py`)
rather than the app itself, so this module never imports `tui.app`. The decisions are
`ChatSession`'s; these methods add the screens, widgets and notifications.
"""

from __future__ import annotations

from pathlib import Path

from tui.chat_settings import ChatSettings
from tui.export import safe_filename
from tui.host import ChatHost
from tui.screens.dialogs import ConfirmScreen, TextPromptScreen
from tui.screens.help import HelpScreen
from tui.screens.settings import SettingsScreen
from tui.screens.status import StatusScreen
from tui.widgets.conversation import FINISH_NOTES
from tui.widgets.prompt import PromptInput
from tui.widgets.sidebar import ChatList
from tui.widgets.status import StatusBar, format_details

THEMES = ["textual-dark", "nord", "gruvbox", "tokyo-night", "catppuccin-latte"]
QUIT_WAIT_S = 5.0  # longest Ctrl+Q waits for a stopped reply to be stored


class ChatActions:
    """`action_*` methods and message handlers; `self` is the app, seen as `ChatHost`."""

    # -- sending, stopping, quitting --------------------------------------------------------

    async def on_prompt_input_submitted(self: ChatHost, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not can_send(self, text):  # state may have changed since the key press
            self.prompt.text = event.text
            return
        message = self.session.add_user(text)
        refresh_sidebar(self)
        await self.conversation.clear_errors()
        await self.conversation.add("user", text, message.id)
        self.start_reply()

    def action_stop_reply(self: ChatHost) -> None:
        """Esc: cancel the engine request; the partial reply is kept and marked stopped."""
        self.cancel_reply()

    def action_interrupt(self: ChatHost) -> None:
        """Ctrl+C: stop a streaming reply; otherwise copy a selection or quit."""
        if self.cancel_reply():
            return
        if self.focused is self.prompt and self.prompt.selected_text:
            self.prompt.action_copy()
        else:
            self.exit(0)

    async def action_quit(self: ChatHost) -> None:
        """Ctrl+Q: a streaming reply is stopped and stored (partial, marked stopped) first."""
        await self.stop_reply(QUIT_WAIT_S)
        self.exit(0)

    # -- moving between chats ---------------------------------------------------------------

    def action_new_chat(self: ChatHost) -> None:
        async def new() -> None:
            await open_chat(self, self.session.new().id)
            self.prompt.focus()

        self.after_reply_stops(new)

    async def on_chat_list_chat_chosen(self: ChatHost, event: ChatList.ChatChosen) -> None:
        chat = self.session.chat
        if chat is not None and event.chat_id == chat.id:
            return

        async def switch() -> None:
            await open_chat(self, event.chat_id)

        self.after_reply_stops(switch)

    def action_delete_chat(self: ChatHost) -> None:
        chat = self.session.chat
        if chat is None:
            return

        def done(yes: bool | None) -> None:
            if not yes:
                return

            async def delete() -> None:
                await open_chat(self, self.session.delete(chat.id))

            self.after_reply_stops(delete)

        self.push_screen(ConfirmScreen(f"Delete “{chat.title}”?"), done)

    # -- changing the conversation ----------------------------------------------------------

    async def action_regenerate(self: ChatHost) -> None:
        """Drop the last reply (if any) and generate a new one for the same history."""
        if refuse_while_busy(self) or self.session.chat is None:
            return
        if not self.ready:
            self.notify("The model is not ready yet.", severity="warning")
            return
        plan = self.session.regenerate_plan()
        if plan.drop is not None:
            self.session.delete_message(plan.drop)
            views = self.conversation.messages()
            if views and views[-1].role == "assistant":
                await views[-1].remove()
        if not plan.possible:
            self.notify("Nothing to regenerate.")
            return
        await self.conversation.clear_errors()
        self.start_reply()

    async def action_edit_last(self: ChatHost) -> None:
        """Move the last user message (and what followed it) back into the input."""
        if refuse_while_busy(self) or self.session.chat is None:
            return
        text = self.session.edit_last()
        if text is None:
            self.notify("No message to edit.")
            return
        await open_chat(self, self.session.chat.id)
        self.prompt.text = text
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()

    async def action_trim_chat(self: ChatHost) -> None:
        """Delete the oldest user turn and the replies to it, to make room in the context."""
        if refuse_while_busy(self) or self.session.chat is None:
            return
        if not self.session.trim_oldest_turn():
            self.notify("Nothing to trim: keep at least the last message.")
            return
        await open_chat(self, self.session.chat.id)
        self.notify("Dropped the oldest turn.")

    # -- copying and exporting --------------------------------------------------------------

    def action_copy_reply(self: ChatHost) -> None:
        text = self.session.last_reply()
        if not text:
            self.notify("No reply to copy.")
            return
        _copy(self, text, "reply")

    def action_copy_code(self: ChatHost) -> None:
        if self.session.chat is None:
            return
        code = self.session.last_code()
        if code is None:
            self.notify("No code block in this chat.")
            return
        _copy(self, code, "code block")

    def action_export_chat(self: ChatHost) -> None:
        chat = self.session.chat
        if chat is None:
            return
        directory = self.config.export_dir or Path.cwd()
        path = directory / f"{safe_filename(chat.title)}-{chat.id}.md"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(self.session.export_markdown())
        except OSError as exc:
            self.notify(f"Export failed: {exc}", severity="error")
            return
        self.notify(f"Exported to {path}")

    def action_screenshot(self: ChatHost) -> None:
        directory = self.config.export_dir or Path.cwd()
        path = self.save_screenshot(path=str(directory))
        self.notify(f"Screenshot saved to {path}")

    # -- dialogs and view -------------------------------------------------------------------

    def action_help(self: ChatHost) -> None:
        self.push_screen(HelpScreen(self.config.keymap, str(self.config_path or "config.toml")))

    def action_status_details(self: ChatHost) -> None:
        chat = self.session.chat
        rows = format_details(self.status.info, chat.settings.max_tokens if chat else None)
        self.push_screen(StatusScreen(rows))

    def on_status_bar_clicked(self: ChatHost, _event: StatusBar.Clicked) -> None:
        self.action_status_details()

    def action_rename_chat(self: ChatHost) -> None:
        chat = self.session.chat
        if chat is None:
            return

        def done(title: str | None) -> None:
            if title and self.session.chat is not None:
                self.session.rename(title)
                refresh_sidebar(self)

        self.push_screen(TextPromptScreen("Rename chat", chat.title), done)

    def action_settings(self: ChatHost) -> None:
        chat = self.session.chat
        if chat is None:
            return

        def done(settings: ChatSettings | None) -> None:
            if settings is not None and self.session.chat is not None:
                self.session.save_settings(settings)
                self.notify("Settings saved for this chat.")
                self.sync_model()

        models = self.client.available_models() if self.ready else [self.client.model_name]
        default = self.session.default_model or self.client.model_name
        self.push_screen(SettingsScreen(chat.settings, chat.title, models, default), done)

    def action_toggle_sidebar(self: ChatHost) -> None:
        self.sidebar.display = not self.sidebar.display

    def action_next_theme(self: ChatHost) -> None:
        current = THEMES.index(self.theme) if self.theme in THEMES else -1
        self.theme = THEMES[(current + 1) % len(THEMES)]
        self.session.save_theme(self.theme)
        self.notify(f"Theme: {self.theme}")


async def open_chat(host: ChatHost, chat_id: int) -> None:
    """Show `chat_id` with the numbers of its last reply, and load its model."""
    messages = host.session.open(chat_id)
    await host.conversation.show(
        [(m.role, m.content, FINISH_NOTES.get(m.meta.get("finish_reason"), ""), m.id)
         for m in messages]
    )
    refresh_sidebar(host)
    meta = host.session.last_reply_meta(messages)
    context = (
        host.client.count_tokens(host.session.history()) if host.ready
        else meta.get("context_tokens")  # the stored count until the model can count
    )
    host.status.update(
        ttft_s=meta.get("ttft_s"), decode_tok_s=meta.get("decode_tok_s"),
        cached_tokens=meta.get("cached_tokens"), context_tokens=context,
    )
    host.sync_model()


def refresh_sidebar(host: ChatHost) -> None:
    """List the chats again, the open one highlighted."""
    chat = host.session.chat
    host.sidebar.set_chats(host.session.chats(), chat.id if chat else None)


def can_send(host: ChatHost, text: str) -> bool:
    """Whether the prompt may send `text` now; says why not."""
    if not text.strip() or refuse_while_busy(host):
        return False
    if not host.ready:
        host.notify("The model is not ready yet.", severity="warning")
        return False
    return True


def refuse_while_busy(host: ChatHost) -> bool:
    """True, with a note on how to stop it, while a reply streams."""
    if host.busy:
        host.notify(f"A reply is streaming; {host.key_for('reply.stop')} stops it.")
        return True
    return False


def _copy(host: ChatHost, text: str, what: str) -> None:
    # OSC 52 reaches the system clipboard in most terminals (and over SSH); Textual also
    # keeps the text as its own clipboard, so ctrl+v in the input works where OSC 52 doesn't.
    host.copy_to_clipboard(text)
    host.notify(f"Copied the {what} ({len(text)} chars).")
