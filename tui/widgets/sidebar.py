"""The chat list on the left: select a chat to open it."""

from __future__ import annotations

from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tui.store import Chat


class ChatList(OptionList):
    """Chats, most recent first; the open one is highlighted."""

    DEFAULT_CSS = """
    ChatList { width: 28; height: 1fr; border: round $primary 50%; }
    ChatList:focus { border: round $primary; }
    """

    class ChatChosen(Message):
        def __init__(self, chat_id: int):
            super().__init__()
            self.chat_id = chat_id

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.border_title = "Chats"

    def set_chats(self, chats: list[Chat], current: int | None) -> None:
        """Rebuild the list and highlight `current`."""
        self.clear_options()
        self.add_options([Option(c.title, id=str(c.id)) for c in chats])
        for index, chat in enumerate(chats):
            if chat.id == current:
                self.highlighted = index
                break

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.ChatChosen(int(event.option.id)))
