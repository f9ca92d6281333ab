"""F1: every key binding, with the user's overrides applied."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.keymap import effective_keys
from tui.screens.dialogs import Dialog


class HelpScreen(Dialog[None]):
    """Lists keys, descriptions and binding ids (the ids are what config.toml rebinds)."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    DEFAULT_CSS = """
    HelpScreen > VerticalScroll {
        width: 80; max-width: 100%; height: auto;
        border: round $accent; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, keymap: dict[str, str], config_path: str):
        super().__init__()
        self._config_path = config_path
        self.rows = effective_keys(keymap)  # (keys, description, id)

    def compose(self) -> ComposeResult:
        table = Table(box=None, expand=True, pad_edge=False)
        table.add_column("Key", style="bold")
        table.add_column("Action")
        table.add_column("Id (config)", style="dim")
        for keys, description, binding_id in self.rows:
            table.add_row(keys.replace(",", " / "), description, binding_id)
        with VerticalScroll() as scroll:
            scroll.border_title = "Keys"
            yield Static(table)
            yield Static(
                f"\nRebind keys in [b]{self._config_path}[/b] under [b]\\[keymap][/b], "
                'e.g. "chat.new" = "f11". Esc closes.',
            )
