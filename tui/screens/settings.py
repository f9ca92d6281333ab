"""F3: the open chat's settings (system prompt and sampling)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from models.registry import generation_defaults
from tui.chat_settings import ChatSettings
from tui.screens.dialogs import Dialog

# (field, label, kind): kind is how the Input text is parsed; "opt" fields may be empty.
FIELDS = [
    ("temperature", "Temperature", float),
    ("top_k", "Top-k (0 = off)", int),
    ("top_p", "Top-p", float),
    ("min_p", "Min-p (0 = off)", float),
    ("repetition_penalty", "Repeat pen. (1=off)", float),
    ("max_tokens", "Max tokens", "opt_int"),
    ("seed", "Seed (empty=random)", "opt_int"),
]


class SettingsScreen(Dialog[ChatSettings | None]):
    """Edit a chat's settings; Save validates and dismisses with the new settings."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    DEFAULT_CSS = """
    SettingsScreen > VerticalScroll {
        width: 76; max-width: 100%; height: auto;
        border: round $accent; background: $surface; padding: 0 1;
    }
    SettingsScreen #system { height: 6; margin-bottom: 1; }
    SettingsScreen #model { margin-bottom: 1; width: 50; }
    SettingsScreen Grid {
        grid-size: 4; grid-columns: 16 1fr 22 1fr; grid-rows: 1; grid-gutter: 1 1; height: auto;
    }
    SettingsScreen Grid Label { width: 100%; text-align: right; }
    SettingsScreen #error { color: $error; height: auto; }
    SettingsScreen #hint { color: $text-muted; margin-top: 1; }
    SettingsScreen Horizontal { height: auto; align-horizontal: right; }
    SettingsScreen Button { margin-left: 1; }
    """

    def __init__(self, settings: ChatSettings, title: str, models: list[str], default_model: str):
        """`models`: names the client can switch to; `default_model`: what None means."""
        super().__init__()
        self._settings = settings
        self._title = title
        self._models = list(models)
        if settings.model and settings.model not in self._models:
            self._models.append(settings.model)
        self._default_model = default_model

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = f"Settings: {self._title}"
            yield Label("Model")
            options = [(f"{self._default_model} (default)", "")]
            options += [(m, m) for m in self._models if m != self._default_model]
            yield Select(
                options, value=self._settings.model or "", allow_blank=False, id="model",
                compact=True,
            )
            yield Label("System prompt")
            yield TextArea(
                self._settings.system_prompt, id="system", soft_wrap=True, compact=True
            )
            with Grid():
                for name, label, _ in FIELDS:
                    value = getattr(self._settings, name)
                    yield Label(label)
                    yield Input("" if value is None else str(value), id=name, compact=True)
            model = self._settings.model or self._default_model
            recommended = generation_defaults(model)
            yield Static(f"Recommended for {model}: {recommended.describe()} "
                         f"({recommended.source}).\nMax tokens: empty = until the context "
                         "is full.", id="hint")
            yield Static("", id="error")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Save", id="save", variant="primary")

    def parse(self) -> ChatSettings:
        """Settings from the form; raises ValueError naming the bad field."""
        values: dict[str, object] = {
            "system_prompt": self.query_one("#system", TextArea).text,
            "model": self.query_one("#model", Select).value or None,
        }
        for name, label, kind in FIELDS:
            text = self.query_one(f"#{name}", Input).value.strip()
            try:
                if kind == "opt_int":
                    values[name] = int(text) if text else None
                else:
                    values[name] = kind(text)
            except ValueError:
                raise ValueError(f"{label}: {text!r} is not a number") from None
        settings = ChatSettings(**values)
        settings.validate()
        return settings

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        try:
            settings = self.parse()
        except ValueError as exc:
            self.query_one("#error", Static).update(str(exc))
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)
