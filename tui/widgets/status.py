"""The one-line status bar: what the engine did for the last reply, at a glance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widget import Widget


@dataclass(slots=True)
class StatusInfo:
    """Everything the status bar shows; None renders as "–".

    Rates are tokens/s, `ttft_s` seconds; `kv` is (blocks used, blocks total).
    """

    backend: str = "?"
    model: str = "?"
    state: str = "loading"  # loading | ready | generating | error
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    context_tokens: int | None = None
    context_length: int | None = None
    cached_tokens: int | None = None
    kv: tuple[int, int] | None = None
    spec: tuple[int, int] | None = None  # speculative decoding: (accepted, drafted) tokens
    prefill: str | None = None  # two-box mode: where the last prompt was prefilled


_STATE_MARK = {"loading": "◌", "ready": "●", "generating": "▶", "error": "✖"}


def _n(value: int | None) -> str:
    return "–" if value is None else str(value)


def format_status(info: StatusInfo) -> str:
    """The status line, e.g. `● llamacpp · smollm2 │ TTFT 42 ms │ 118.0 tok/s │ ctx 812/8192 │
    cached 768 │ KV 52/512`, and `│ drafts 45/60 accepted` after a reply that drafted, `│
    prefilled remotely (2047 tokens, 47.2 MB of KV)` with a prefill peer."""
    ttft = "–" if info.ttft_s is None else f"{info.ttft_s * 1000:.0f} ms"
    rate = "–" if info.decode_tok_s is None else f"{info.decode_tok_s:.1f}"
    kv = "–" if info.kv is None else f"{info.kv[0]}/{info.kv[1]}"
    parts = [
        f"{_STATE_MARK.get(info.state, '?')} {info.backend} · {info.model}",
        f"TTFT {ttft}",
        f"{rate} tok/s",
        f"ctx {_n(info.context_tokens)}/{_n(info.context_length)}",
        f"cached {_n(info.cached_tokens)}",
        f"KV {kv}",
    ]
    if info.spec is not None and info.spec[1]:
        parts.append(f"drafts {info.spec[0]}/{info.spec[1]} accepted")
    if info.prefill is not None:
        parts.append(info.prefill)
    return " │ ".join(parts)


class StatusBar(Widget):
    """Renders a `StatusInfo`; the app changes it through `update(**fields)`."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text; padding: 0 1; }
    StatusBar.error { background: $error 40%; }
    """

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.info = StatusInfo()

    def update(self, **fields: Any) -> None:
        """Set the given `StatusInfo` fields (e.g. `state="ready"`) and redraw.
        Raises AttributeError for a name that is not a `StatusInfo` field."""
        for name, value in fields.items():
            setattr(self.info, name, value)  # slots: a misspelt field raises
        self.set_class(self.info.state == "error", "error")
        self.refresh()

    def render(self) -> Text:
        return Text(format_status(self.info))  # Text, not str: model names are not markup
