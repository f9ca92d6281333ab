"""The one-line status bar: what the engine did for the last reply, at a glance.

The line fits the terminal's width: each figure has a full and a short form, and the
narrower the bar, the more short forms (then fewer figures) it shows; a prefill route takes
whatever room is left and is cut with "…". `format_details` has every figure in full (the
status details key, ctrl+l by default, shows it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import events
from textual.message import Message
from textual.widget import Widget

SEP = " │ "
MIN_ROUTE = 10  # narrowest cut of a prefill route worth showing, characters


@dataclass(slots=True)
class StatusInfo:
    """Everything the status bar shows; None renders as "–".

    Rates are tokens/s, `ttft_s` seconds; `kv` is (tokens held in the KV cache, tokens it
    can hold), for every sequence of the engine together.
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
    # while a prompt is prefilled: (tokens computed, prompt tokens), shown in TTFT's place
    prefilling: tuple[int, int] | None = None


_STATE_MARK = {"loading": "◌", "ready": "●", "generating": "▶", "error": "✖"}

# How the line shrinks, step by step, until it fits: (figure, form), form 1 the short one,
# None dropping the figure. The prefill route is fitted last, into the room left.
_SHRINK: list[tuple[str, int | None]] = [
    ("cached", 1), ("model", 1), ("rate", 1), ("ctx", 1), ("kv", 1), ("drafts", 1), ("ttft", 1),
    ("cached", None), ("drafts", None), ("kv", None), ("route", None), ("ttft", None),
]


def tokens(n: int) -> str:
    """A token count in at most 4 characters past 9999: 812, 8192, 131k, 1.0M."""
    if n < 10_000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.0f}k"
    return f"{n / 1e6:.1f}M"


def percent(part: int, whole: int) -> str:
    """`part` of `whole` as "0%", "<1%", "10%"; "–" without a whole."""
    if not whole:
        return "–"
    p = 100 * part / whole
    return "<1%" if 0 < p < 1 else f"{p:.0f}%"


def cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, ending in "…" when cut, at a word's end where
    one is near; a parenthesised tail keeps its ")" ("prefilled remotely (measured: the
    worker…)")."""
    if len(text) <= width:
        return text
    paren = text.endswith(")") and "(" in text[: width - 2]
    head = text[: width - (2 if paren else 1)]
    space = head.rfind(" ")
    # a word end near the cut, keeping two words and the "(" of a kept ")"
    if space > len(head) - 8 and " " in head[:space] and (not paren or space > head.index("(")):
        head = head[:space]
    if paren and len(head) - head.index("(") < 6:  # under 5 characters inside: drop them
        head, paren = head[: head.index("(")], False
    head = head.rstrip(" :,;(")
    return head + ("…)" if paren else "…")


def _forms(info: StatusInfo) -> dict[str, list[str]]:
    """{figure: [full form, short form]}, in the order shown."""
    mark = _STATE_MARK.get(info.state, "?")
    ttft = "–" if info.ttft_s is None else f"{info.ttft_s * 1000:.0f} ms"
    forms = {"model": [f"{mark} {info.backend} · {info.model}", f"{mark} {info.model}"],
             "ttft": [f"TTFT {ttft}"] * 2}
    if info.prefilling is not None:
        done, total = info.prefilling
        forms["ttft"] = [f"prefill {done}/{total} tok", f"prefill {percent(done, total)}"]
    rate = info.decode_tok_s
    forms["rate"] = ["– tok/s"] * 2 if rate is None else [f"{rate:.1f} tok/s", f"{rate:.0f} tok/s"]
    used, length = info.context_tokens, info.context_length
    if used is None or not length:
        forms["ctx"] = ["ctx –"] * 2
    else:
        forms["ctx"] = [f"ctx {used}/{length} tok", f"ctx {percent(used, length)}"]
    cached = "–" if info.cached_tokens is None else str(info.cached_tokens)
    forms["cached"] = [f"cached {cached} tok", f"cached {cached}"]
    if info.kv is None:
        forms["kv"] = ["KV –"] * 2
    else:
        held, room = info.kv
        forms["kv"] = [f"KV {tokens(held)}/{tokens(room)} tok", f"KV {percent(held, room)}"]
    if info.spec is not None and info.spec[1]:
        accepted, drafted = info.spec
        forms["drafts"] = [f"drafts {accepted}/{drafted} accepted",
                           f"drafts {percent(accepted, drafted)}"]
    return forms


def format_status(info: StatusInfo, width: int | None = None) -> str:
    """The status line in at most `width` characters (None: no limit), e.g.
    `● llamacpp · smollm2 │ TTFT 42 ms │ 118.0 tok/s │ ctx 812/8192 tok │ cached 768 tok │
    KV 1664/131k tok`, with `│ drafts 45/60 accepted` after a reply that drafted and
    `│ prefilled remotely (…)` with a prefill peer; at 80 columns e.g. `● smollm2 │ TTFT 42
    ms │ 118 tok/s │ ctx 10% │ KV 1%` (the order of shortening: `_SHRINK`)."""
    forms = _forms(info)
    route = info.prefill
    if width is None:
        return SEP.join([f[0] for f in forms.values()] + ([route] if route else []))
    if route:
        # while fitting, the route holds its short form plus what the bar has beyond 80
        # columns (at 120, 40 characters of "prefilled remotely (measured: …)")
        short = route.split(" (", 1)[0]
        forms["route"] = [route[:max(len(short), min(len(route), width - 78))]]
    chosen: dict[str, int | None] = dict.fromkeys(forms, 0)

    def line() -> str:
        return SEP.join(forms[k][i] for k, i in chosen.items() if i is not None)

    for figure, form in _SHRINK:
        if len(line()) <= width:
            break
        if figure in chosen and (form is None or chosen[figure] is not None):
            chosen[figure] = form
    chosen.pop("route", None)
    rest = line()
    room = width - len(rest) - len(SEP)  # the route takes what is left, cut to fit
    if route and room >= MIN_ROUTE:
        return f"{rest}{SEP}{cut(route, room)}"
    return cut(rest, width)


def format_details(info: StatusInfo, max_tokens: int | None = None) -> list[tuple[str, str]]:
    """(label, value) rows: every figure of the bar in full words, for the details view.
    `max_tokens`: the open chat's reply limit (None: until the context is full)."""
    def ms(s: float | None) -> str:
        return "–" if s is None else f"{s * 1000:.0f} ms"

    rows = [("State", info.state), ("Backend", info.backend), ("Model", info.model),
            ("Time to first token", ms(info.ttft_s)),
            ("Decode speed", "–" if info.decode_tok_s is None
             else f"{info.decode_tok_s:.1f} tokens/s")]
    if info.context_tokens is not None and info.context_length:
        rows.append(("Context", f"{info.context_tokens} of {info.context_length} tokens "
                     f"({percent(info.context_tokens, info.context_length)})"))
    else:
        rows.append(("Context", "–"))
    rows.append(("Prompt tokens from cache", "–" if info.cached_tokens is None
                 else f"{info.cached_tokens} tokens"))
    if info.kv is not None:
        held, room = info.kv
        rows.append(("KV cache", f"{held} of {room} tokens held ({percent(held, room)}), "
                     "all chats of the engine together"))
    else:
        rows.append(("KV cache", "–"))
    if info.spec is not None and info.spec[1]:
        accepted, drafted = info.spec
        rows.append(("Draft tokens", f"{accepted} of {drafted} accepted "
                     f"({percent(accepted, drafted)})"))
    if info.prefill:
        rows.append(("Prefill", info.prefill))
    rows.append(("Max tokens per reply", "until the context is full" if max_tokens is None
                 else f"{max_tokens} (F3 changes it for this chat)"))
    return rows


class StatusBar(Widget):
    """Renders a `StatusInfo` in the bar's width; the app changes it through
    `update(**fields)`. A click posts `StatusBar.Clicked` (the app shows the details)."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text; padding: 0 1; }
    StatusBar.error { background: $error 40%; }
    """

    class Clicked(Message):
        """The bar was clicked."""

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
        # Text, not str: model names are not markup. size: the width inside the padding.
        return Text(format_status(self.info, self.size.width or None), no_wrap=True)

    def on_click(self, event: events.Click) -> None:
        self.post_message(self.Clicked())
