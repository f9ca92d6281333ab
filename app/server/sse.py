"""OpenAI's server-sent-event framing of a streamed response: `data: {json}\\n\\n` per event,
ending with `data: [DONE]`. Events are framed by sse-starlette's `ServerSentEvent`; nothing
else is imported, so the benchmarks' Python floor frames its chunks with the same code."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sse_starlette import ServerSentEvent

SEP = "\n"  # OpenAI's framing; sse-starlette's default is "\r\n"

# one encoder for every event: `json.dumps` with options builds a new one per call
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def sse(obj: dict[str, Any]) -> bytes:
    """One event carrying `obj` as compact JSON (one `data:` line: JSON escapes newlines)."""
    return ServerSentEvent(_JSON.encode(obj), sep=SEP).encode()


def sse_named(obj: dict[str, Any], event: str) -> bytes:
    """One event named `event` (an `event:` line, then `data:` with `obj` as compact JSON),
    as the Responses API frames its events."""
    return ServerSentEvent(_JSON.encode(obj), event=event, sep=SEP).encode()


SSE_DONE = ServerSentEvent("[DONE]", sep=SEP).encode()


class SSETemplate:
    """Events that differ only in one string: `make(text)` is the event's object. The event is
    encoded once by `sse`, with a marker as the text, and split around the marker's JSON;
    each event is then that head, the text's JSON and that tail: the bytes `sse(make(text))`
    gives (the JSON encoder writes a string the same wherever it sits, and JSON escapes every
    line break, so the framing never splits it), without encoding the rest every time.
    Raises ValueError if `make` does not put its argument in the object exactly once."""

    _MARK = "\x00tandem:text\x00"

    def __init__(self, make: Callable[[str], dict[str, Any]]):
        mark = _JSON.encode(self._MARK).encode()
        head, found, tail = sse(make(self._MARK)).partition(mark)
        if not found or mark in tail:
            raise ValueError("the template's text must appear exactly once")
        self._head, self._tail = head, tail

    def __call__(self, text: str) -> bytes:
        return self._head + _JSON.encode(text).encode() + self._tail
