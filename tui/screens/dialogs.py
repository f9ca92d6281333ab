"""Modal dialogs that leave the status bar and footer in view (`Dialog`), and two small ones:
ask for one line of text, confirm a destructive action."""

from __future__ import annotations

from typing import TypeVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

BAR_ROWS = 2  # the status bar and the footer, at the bottom of the app's screen
ResultType = TypeVar("ResultType")


class Dialog(ModalScreen[ResultType]):
    """A modal screen whose box (its one child) is centred in the rows above the status bar
    and footer and never taller than they leave, however short the terminal: the box
    scrolls (or its own scrolling part does) instead of covering the bars."""

    DEFAULT_CSS = f"""
    Dialog {{ align: center middle; }}
    Dialog > * {{ margin-bottom: {BAR_ROWS}; }}
    """

    def on_mount(self) -> None:
        self._fit_box()

    def on_resize(self, _event: events.Resize) -> None:
        self._fit_box()

    def _fit_box(self) -> None:
        # CSS has no `100% - 2`: the limit is set from the screen's height in rows
        for box in self.children:
            box.styles.max_height = max(self.size.height - BAR_ROWS, 1)


_CSS = """
{name} > Vertical {{
    width: 60; max-width: 100%; height: auto;
    border: round $accent; background: $surface; padding: 1 2;
}}
{name} Horizontal {{ height: auto; align-horizontal: right; margin-top: 1; }}
{name} Button {{ margin-left: 1; }}
"""


class TextPromptScreen(Dialog[str | None]):
    """Ask for a line of text; dismisses with the text, or None on Esc."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = _CSS.format(name="TextPromptScreen")

    def __init__(self, title: str, value: str = ""):
        super().__init__()
        self._title = title
        self._value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title)
            yield Input(self._value, id="text")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(Dialog[bool]):
    """Yes/no question; Enter on the focused button answers, Esc means no."""

    BINDINGS = [Binding("escape", "answer(False)", "No"), Binding("y", "answer(True)", "Yes")]
    DEFAULT_CSS = _CSS.format(name="ConfirmScreen")

    def __init__(self, question: str):
        super().__init__()
        self._question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._question)
            with Horizontal():
                yield Button("Cancel", id="no")
                yield Button("Delete", id="yes", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
