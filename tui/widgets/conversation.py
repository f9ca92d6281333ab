"""The scrolling conversation: one `MessageView` per turn, replies streamed as Markdown."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import LoadingIndicator, Markdown, Static
from textual.widgets.markdown import MarkdownStream

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "system": "System"}
# The note under a reply, by the finish reason stored with it ("stop": no note).
FINISH_NOTES = {"abort": "stopped", "length": "cut off: max tokens or context reached"}


class MessageView(Vertical):
    """One turn: a role label, the Markdown body and an optional note ("stopped", ...).

    A reply streams through `Markdown.get_stream`, which appends parsed blocks instead of
    re-rendering the whole message per chunk (O(n) over a long reply, not O(n^2)); `finish`
    then re-renders once from the full text, because blocks parsed from fragments can leave
    a code fence incomplete.
    """

    DEFAULT_CSS = """
    MessageView { height: auto; margin: 0 1 1 1; padding: 0 1; }
    MessageView.user { background: $boost; border-left: thick $accent; }
    MessageView.assistant { border-left: thick $success; }
    MessageView .role { text-style: bold; color: $text-muted; }
    MessageView Markdown { margin: 0; padding: 0; }
    MessageView .note { color: $warning; text-style: italic; }
    """

    def __init__(self, role: str, content: str = "", note: str = "", message_id: int | None = None):
        super().__init__(classes=role)
        self.role = role
        self.text = content
        self.message_id = message_id
        self._note = note
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Static(ROLE_LABELS.get(self.role, self.role), classes="role")
        yield Markdown(self.text)
        yield Static(self._note, classes="note")

    def on_mount(self) -> None:
        self.query_one(".note", Static).display = bool(self._note)

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    def start_stream(self) -> None:
        """Begin streaming; call `append` per chunk, then `finish`."""
        self._stream = Markdown.get_stream(self.markdown)

    async def append(self, chunk: str) -> None:
        self.text += chunk
        if self._stream is None:
            self.start_stream()
        await self._stream.write(chunk)

    async def finish(self, note: str = "") -> None:
        """End streaming and render the complete text once (fixes partial code fences)."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        await self.markdown.update(self.text)
        self.set_note(note)

    def set_note(self, note: str) -> None:
        label = self.query_one(".note", Static)
        label.update(note)
        label.display = bool(note)


class ErrorView(Static):
    """A problem shown in the conversation (not a crash): message plus what to do."""

    DEFAULT_CSS = """
    ErrorView { margin: 0 1 1 1; padding: 0 1; border: round $error; color: $text; height: auto; }
    """


class LoadingView(Horizontal):
    """Shown while the model loads in a worker thread."""

    DEFAULT_CSS = """
    LoadingView { height: 3; margin: 1 1; }
    LoadingView LoadingIndicator { width: 8; height: 1; }
    LoadingView Static { width: 1fr; }
    """

    def __init__(self, text: str):
        super().__init__()
        self._text = text

    def compose(self) -> ComposeResult:
        yield LoadingIndicator()
        yield Static(self._text)

    def set_text(self, text: str) -> None:
        self.query_one(Static).update(text)


class Conversation(VerticalScroll):
    """All turns of the open chat; stays scrolled to the end while a reply streams."""

    DEFAULT_CSS = """
    Conversation { height: 1fr; scrollbar-size-vertical: 1; }
    Conversation .empty { color: $text-muted; margin: 1 2; }
    """

    def on_mount(self) -> None:
        # Anchoring keeps the newest text in view until the user scrolls up themselves.
        self.anchor()

    async def show(self, messages: list[tuple[str, str, str, int | None]]) -> None:
        """Replace the view with (role, content, note, message id) turns."""
        await self.remove_children()
        views = [MessageView(r, c, n, i) for r, c, n, i in messages]
        if views:
            await self.mount_all(views)
        else:
            await self.mount(Static("Type a message below and press Enter.", classes="empty"))
        self.scroll_end(animate=False)

    async def add(self, role: str, content: str = "", message_id: int | None = None) -> MessageView:
        """Append a turn at the end and return its view."""
        for hint in self.query(".empty"):
            await hint.remove()
        view = MessageView(role, content, message_id=message_id)
        await self.mount(view)
        self.scroll_end(animate=False)
        return view

    async def show_error(self, text: str) -> ErrorView:
        view = ErrorView(text)
        await self.mount(view)
        self.scroll_end(animate=False)
        return view

    async def clear_errors(self) -> None:
        await self.query(ErrorView).remove()

    def messages(self) -> list[MessageView]:
        return list(self.query(MessageView))
