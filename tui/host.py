"""`ChatHost`: the app as `ChatActions` sees it (a Protocol, so `actions.py` never imports
`tui.app` and the app's private reply state stays in `app.py`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from tui.client import ChatClient
from tui.config import ChatConfig
from tui.session import ChatSession
from tui.widgets.conversation import Conversation
from tui.widgets.prompt import PromptInput
from tui.widgets.sidebar import ChatList
from tui.widgets.status import StatusBar


class ChatHost(Protocol):
    """What the actions use of the app: its session, client and widgets, the reply
    controls of `app.py`, and Textual's screen, clipboard and notification calls."""

    session: ChatSession
    client: ChatClient
    config: ChatConfig
    config_path: Path | None
    ready: bool
    theme: str

    @property
    def busy(self) -> bool: ...

    @property
    def status(self) -> StatusBar: ...

    @property
    def conversation(self) -> Conversation: ...

    @property
    def prompt(self) -> PromptInput: ...

    @property
    def sidebar(self) -> ChatList: ...

    @property
    def focused(self) -> Any: ...

    def key_for(self, binding_id: str) -> str: ...

    def start_reply(self) -> None:
        """Stream a reply to the open chat's history."""

    def cancel_reply(self) -> bool:
        """Cancel the streaming reply; False if none was streaming."""

    async def stop_reply(self, timeout: float | None = None) -> None:
        """Cancel the streaming reply and wait until it is stored."""

    def after_reply_stops(self, then: Callable[[], Awaitable[Any]]) -> None:
        """Stop a streaming reply, then run `then`."""

    def sync_model(self) -> None:
        """Load the open chat's model if another one is loaded."""

    def notify(self, message: str, *, title: str = ..., severity: Any = ...,
               timeout: float | None = ..., markup: bool = ...) -> None: ...

    def push_screen(self, screen: Any, callback: Any = ..., *args: Any, **kwargs: Any) -> Any: ...

    def copy_to_clipboard(self, text: str) -> None: ...

    def save_screenshot(self, filename: str | None = ..., path: str | None = ...,
                        time_format: str | None = ...) -> str: ...

    def exit(self, result: Any = ..., *args: Any, **kwargs: Any) -> None: ...
