"""Reading an OpenAI-style server-sent event stream (`data: {...}` lines, `data: [DONE]`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx


async def json_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON payload of each `data:` event of a streaming `response`, until `[DONE]` or
    the end of the stream. Raises json.JSONDecodeError for a payload that is not JSON."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)
