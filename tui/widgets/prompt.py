"""The multi-line prompt input: Enter sends, Ctrl+J / Shift+Enter insert a newline."""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from tui.keymap import INPUT_KEYS, bindings


class PromptInput(TextArea):
    """A TextArea whose send key submits.

    The send and newline keys are handled in this widget's own key handler, not as
    bindings: a priority binding would run on the App as soon as the key arrives, ahead of
    characters still queued for this widget, so text typed (or pasted by tmux) in one burst
    followed by Enter would be sent cut short. The bindings below exist so the keys are
    listed and carry ids; `set_keys` applies the user's keymap to them.
    """

    BINDINGS = bindings(INPUT_KEYS)

    DEFAULT_CSS = """
    PromptInput { height: auto; min-height: 3; max-height: 10; margin: 0 1; }
    """

    class Submitted(Message):
        """The user sent `text` (the box has already been cleared)."""

        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, **kwargs):
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)
        self.border_title = "Message"
        # Decides whether a send is accepted now (the app says no while a reply streams);
        # a refused text stays in the box.
        self.accept: Callable[[str], bool] = lambda text: bool(text.strip())
        self._key_actions: dict[str, str] = {}
        self.set_keys({})

    def set_keys(self, keymap: dict[str, str]) -> None:
        """Use `keymap` (binding id -> comma-separated keys) over the default keys."""
        self._key_actions = {
            key.strip(): spec.action
            for spec in INPUT_KEYS
            for key in keymap.get(spec.id, spec.keys).split(",")
        }

    async def _on_key(self, event: events.Key) -> None:
        action = self._key_actions.get(event.key)
        if action is None:
            await super()._on_key(event)
            return
        event.stop()
        event.prevent_default()
        if action == "submit":
            self.action_submit()
        else:
            self.action_newline()

    def action_submit(self) -> None:
        text = self.text
        if self.accept(text):
            self.clear()
            self.post_message(self.Submitted(text))

    def action_newline(self) -> None:
        self.insert("\n")
