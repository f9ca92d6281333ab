"""Tool calls out of the engine's output text, as neutral events, once per choice.

`ToolCallParser.feed(text)` takes each new piece of a choice's text and returns events:
`TextDelta` (reply text outside any call), `CallStart` (a call's index, id and name, once),
`CallArgs` (a fragment of its arguments' JSON text). `finish()` flushes what was held back.
The fragments of a call concatenate to exactly `ToolCall.arguments`, however the text was
split, so a streamed reply and a collected one carry the same arguments.

Per format (`app.tool_calls.format.CallFormat`):
- tagged (Qwen2.5 `<tool_call>`): text streams until the trigger (a partial trigger at the
  end is held back); a call's name is sent once it is complete and its arguments as they
  arrive, up to the end of their JSON object. In "auto", a reply that starts with `{`, `[`
  or a code fence is held to the end and read as calls if it is a JSON object (or list) naming
  known tools with an object of arguments (small coder models write calls that way);
- json (Llama-3 bare `{"name", "parameters"}`) and generic (`{"tool_calls": [...]}` /
  `{"response": ...}`): the reply is held and parsed when it ends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from app.tool_calls.format import CallFormat
from app.tool_calls.spec import ToolCall


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Reply text outside any call."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """Call number `index` (0-based) begins: its id and function name."""

    index: int
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class CallArgs:
    """A fragment of call `index`'s arguments (JSON text)."""

    index: int
    fragment: str


Event = TextDelta | CallStart | CallArgs
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"'
                   r"\s*:\s*")
_OBJECT_END = re.compile(r"\s*\}")
_FENCE = re.compile(r"^```[a-zA-Z]*\s*(.*?)\s*```$", re.S)


# how a held (JSON-format) call begins, whitespace removed: `{"tool_calls": [...]}` (generic),
# `{"name": ..}` (Llama 3), `[{"name": ..}]` (parallel calls)
_CALL_OPENINGS = ('{"tool_calls":', '{"name":', '[{"name":')


def _opens_a_call(text: str) -> bool:
    """Whether `text` (a held reply that is no complete call) is the start of one."""
    body = re.sub(r"\s+", "", text)
    body = re.sub(r"^```[a-zA-Z]*", "", body)
    return bool(body) and any(o.startswith(body) or body.startswith(o) for o in _CALL_OPENINGS)


class ToolCallParser:
    """Parses one choice's text. `names`: the offered tools (loose JSON calls must name
    one); `auto`: tool_choice "auto" (free text may come first)."""

    def __init__(self, fmt: CallFormat, names: set[str], auto: bool = True):
        self.fmt = fmt
        self.names = names
        self.auto = auto
        self.calls: list[ToolCall] = []
        self._buf = ""  # text not yet turned into events
        self._hold = fmt.kind != "tagged"  # keep everything for `finish`
        self._spoke = False  # some text was emitted
        self._in_call = False
        self._name: str | None = None  # the current call's name, once read
        self._args: list[str] = []
        self._scan = _JsonEnd()
        self._uid = ""
        self._cut = False  # set by `finish`

    def feed(self, text: str) -> list[Event]:
        """Events for `text`, the choice's next piece of output."""
        self._buf += text
        if self._hold:
            return []
        if self.auto and not self._spoke and not self.calls and not self._in_call:
            lead = self._buf.lstrip()
            if not lead:
                return []
            if lead[0] in "{[`":
                self._hold = True
                return []
        return self._run(final=False)

    def finish(self, cut: bool = False) -> list[Event]:
        """Events for what was held back; call once, when the choice has ended. `cut`: the
        reply was cut short (max tokens, the context's end). A call cut before its name
        was complete is dropped, never handed on as text: it is the model's call markup,
        not its words (with tool_choice "required" or a named function every reply is a
        call, so there any unreadable rest is dropped)."""
        self._cut = cut or not self.auto
        if self._hold:
            text, self._buf = self._buf, ""
            loose = self._loose(text)
            if loose is not None:
                return loose
            if not self.auto or (cut and _opens_a_call(text)):
                return []
            if self.fmt.kind != "tagged":
                return [TextDelta(text)] if text else []
            self._hold = False
            self._buf = text
        return self._run(final=True)

    # tagged format

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        trigger = self.fmt.trigger
        while True:
            if not self._in_call:
                at = self._buf.find(trigger)
                if at < 0:
                    if final:  # whitespace after the calls is not content
                        self._text(events, self._buf.rstrip() if self.calls else self._buf)
                        self._buf = ""
                        return events
                    # hold a partial trigger, and whitespace that may precede one
                    keep = _partial_suffix(self._buf, trigger)
                    rest = self._buf[: len(self._buf) - keep]
                    keep += len(rest) - len(rest.rstrip())
                    self._text(events, self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return events
                self._text(events, self._buf[:at].rstrip())
                self._buf = self._buf[at + len(trigger):]
                self._in_call, self._name, self._args = True, None, []
                self._scan = _JsonEnd()
            if not self._call(events, final):
                return events

    def _text(self, events: list[Event], text: str) -> None:
        if text:
            self._spoke = True
            events.append(TextDelta(text))

    def _call(self, events: list[Event], final: bool) -> bool:
        """Advance the current call; True once it is complete (its close marker read)."""
        index = len(self.calls)
        if self._name is None:
            m = _HEAD.match(self._buf)
            if m is None:
                if final and self._buf.strip():  # not a call we can read: keep it as text,
                    if not self._cut:  # unless the reply was cut inside the call
                        self._text(events, self.fmt.trigger + self._buf)
                    self._buf, self._in_call = "", False
                return False
            self._name = json.loads(f'"{m.group(1)}"')
            self._uid = ToolCall(self._name, "").uid
            events.append(CallStart(index, self._uid, self._name))
            self._buf = self._buf[m.end():]
        if not self._scan.started:  # whitespace before the arguments is not theirs
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
        if not self._scan.done:
            used = self._scan.feed(self._buf)
            piece, self._buf = self._buf[:used], self._buf[used:]
            if piece:
                self._args.append(piece)
                events.append(CallArgs(index, piece))
            if not self._scan.done:
                if final:
                    self._close_call()
                return False
        # then the call object's own "}" and the close marker
        m = _OBJECT_END.match(self._buf)
        if m is None:
            if not final and not self._buf.strip():
                return False
            self._close_call()  # written otherwise: the call stands, the rest is text
            return True
        after = self._buf[m.end():].lstrip()
        close = self.fmt.close.strip()
        if after.startswith(close):
            self._buf = after[len(close):]
        elif not final and close.startswith(after):
            return False
        else:
            self._buf = after
        self._close_call()
        return True

    def _close_call(self) -> None:
        self.calls.append(ToolCall(self._name or "", "".join(self._args), self._uid))
        self._in_call, self._name, self._args = False, None, []

    # held replies

    def _loose(self, text: str) -> list[Event] | None:
        """Events for a held reply that is wholly calls (or a generic `response`)."""
        body = text.strip()
        m = _FENCE.match(body)
        if m:
            body = m.group(1)
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if self.fmt.kind == "generic" and isinstance(value, dict):
            if set(value) == {"response"} and isinstance(value["response"], str):
                return [TextDelta(value["response"])] if value["response"] else []
            value = value.get("tool_calls", value)
        items = value if isinstance(value, list) else [value]
        calls = []
        for item in items:
            if not isinstance(item, dict) or item.get("name") not in self.names:
                return None
            args = item.get("arguments", item.get("parameters"))
            if not isinstance(args, dict):
                return None
            calls.append(ToolCall(item["name"], json.dumps(args, ensure_ascii=False)))
        if not calls:
            return None
        events: list[Event] = []
        for call in calls:
            index = len(self.calls)
            self.calls.append(call)
            events += [CallStart(index, call.uid, call.name), CallArgs(index, call.arguments)]
        return events


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class _JsonEnd:
    """Finds where one JSON value that starts with `{` or `[` ends, in text that arrives
    in pieces (string- and escape-aware bracket counting)."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escape = False
        self.done = False

    def feed(self, text: str) -> int:
        """How many leading characters of `text` belong to the object (all of them until
        it is complete; then `done` is true)."""
        for i, ch in enumerate(text):
            self.started = True
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.done = True
                    return i + 1
        return len(text)
