"""OpenAI's server-sent-event framing of a streamed response: `data: {json}\\n\\n` per event,
ending with `data: [DONE]`. Events are framed by sse-starlette's `ServerSentEvent`; nothing
else is imported, so the benchmarks' Python floor frames its chunks with the same code."""

from __future__ import annotations

import json
from typing import Any

from sse_starlette import ServerSentEvent

SEP = "\n"  # OpenAI's framing; sse-starlette's default is "\r\n"

# one encoder for every event: `json.dumps` with options builds a new one per call
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def sse(obj: dict[str, Any]) -> bytes:
    """One event carrying `obj` as compact JSON (one `data:` line: JSON escapes newlines)."""
    return ServerSentEvent(_JSON.encode(obj), sep=SEP).encode()


SSE_DONE = ServerSentEvent("[DONE]", sep=SEP).encode()
