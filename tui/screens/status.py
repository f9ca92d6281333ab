"""ctrl+l (or a click on the status bar): every figure of the status bar in full words."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.screens.dialogs import Dialog


class StatusScreen(Dialog[None]):
    """Shows (label, value) rows (`tui.widgets.status.format_details`); any close key
    dismisses it."""

    BINDINGS = [Binding("escape,ctrl+l,q,enter", "dismiss", "Close")]

    DEFAULT_CSS = """
    StatusScreen > VerticalScroll {
        width: 80; max-width: 100%; height: auto;
        border: round $accent; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, rows: list[tuple[str, str]]):
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        table = Table(box=None, expand=True, pad_edge=False, show_header=False)
        table.add_column("What", style="bold", no_wrap=True)
        table.add_column("Value")
        for label, value in self.rows:
            table.add_row(label, value)
        with VerticalScroll() as scroll:
            scroll.border_title = "Status"
            yield Static(table)
