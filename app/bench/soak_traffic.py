"""The soak bench's request classes: one coroutine per kind of client, each raising `Failed`
when the server answers other than that client should get.

Classes that should succeed (200 and a complete reply: a streamed reply ends with `[DONE]`
or its API's last event, and no error event): `chat_stream`, `chat`, `prediction`,
`json_schema`, `tools`, `n2`, `slow_reader`, `responses`, `anthropic`, `ollama`,
`long_prompt`. Classes that leave early (`cancel`: closes the stream after a few chunks;
`vanish`: drops the connection at a random moment) succeed unless the server errs before
they leave. Classes that must be refused (`malformed`, `oversized`) succeed on a 4xx and
fail on anything else (headers over 16 KiB are not sent: the server accepts them when they
arrive in one read, see app/server/limits.py). Prompts are small and `max_tokens` is 4-16,
so the embedded model keeps up with a few clients on two cores; chats share one of three
system prompts (the prefix cache), and `long_prompt` sends ~`long_words` fresh words (what
two-box mode sends to the prefill worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from app.bench.http import WORDS, make_text


class Failed(Exception):
    """A request of a class that should succeed got another answer; the message says what
    (one line)."""


# greedy without the registry model's repetition penalty: deterministic and cheap to verify
GREEDY = {"temperature": 0, "repetition_penalty": 1.0}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"},
                                           "score": {"type": "integer"}},
          "required": ["answer", "score"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@dataclass
class Client:
    """What every request class needs: the HTTP client (base URL set), the served model
    name, its context length (tokens), a random source, and the shared system prompts."""

    http: httpx.AsyncClient
    model: str
    context_length: int
    rng: random.Random
    long_words: int = 1000
    systems: list[str] = field(default_factory=list)

    def messages(self, words: int = 20) -> list[dict[str, str]]:
        system = self.rng.choice(self.systems) if self.systems else None
        user = f"Request {self.rng.randrange(10**9)}: " + make_text(words, self.rng)
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]

    def max_tokens(self) -> int:
        return self.rng.randint(4, 16)

    def body(self, **extra) -> dict:
        return {"model": self.model, "messages": self.messages(),
                "max_tokens": self.max_tokens(), **GREEDY, **extra}


def system_prompts(seed: int, n: int = 3, words: int = 200) -> list[str]:
    """`n` system prompts of `words` words each, the same for a `seed`."""
    rng = random.Random(seed)
    return [f"You are assistant {i}. " + make_text(words, rng) for i in range(n)]


def _check_status(r: httpx.Response, body: bytes | None = None) -> None:
    if r.status_code != 200:
        text = (body or b"").decode(errors="replace")
        raise Failed(f"HTTP {r.status_code}: {' '.join(text.split())[:200]}")


async def _json(c: Client, path: str, body: dict) -> dict:
    r = await c.http.post(path, json=body)
    _check_status(r, r.content)
    return r.json()


async def _lines(r: httpx.Response) -> AsyncIterator[str]:
    """The non-empty lines of a streamed body."""
    async for line in r.aiter_lines():
        if line.strip():
            yield line


def _sse_data(line: str) -> str | None:
    return line[5:].strip() if line.startswith("data:") else None


async def _sse_stream(c: Client, path: str, body: dict) -> AsyncIterator[str]:
    """`body` streamed to `path`: the data of each SSE event. Raises Failed (via
    `_check_status`) for a non-200. Closing the iterator closes the connection."""
    async with c.http.stream("POST", path, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            _check_status(r, await r.aread())
        async for line in _lines(r):
            data = _sse_data(line)
            if data is not None:
                yield data


async def _openai_stream(c: Client, path: str, body: dict, *, stop_after: int | None = None,
                         read_every_s: float = 0.0) -> int:
    """Stream `body` to `path` (OpenAI chat/completions SSE); the number of data events.
    `stop_after`: close the stream after that many events (a cancel). `read_every_s`: sleep
    this long after each line (a slow reader). Raises Failed for a non-200, an error event,
    or a stream that ends without `[DONE]` (unless cancelled)."""
    events = 0
    async with contextlib.aclosing(_sse_stream(c, path, body)) as stream:
        async for data in stream:
            if data == "[DONE]":
                if not events:
                    raise Failed("[DONE] before any event")
                return events
            event = json.loads(data)
            if "error" in event:
                raise Failed(f"error event: {event['error']}")
            events += 1
            if stop_after is not None and events >= stop_after:
                return events  # leaving the block closes the connection mid-stream
            if read_every_s:
                await asyncio.sleep(read_every_s)
    if stop_after is not None:
        return events  # the reply ended before the cancel point
    raise Failed(f"stream ended without [DONE] after {events} events")


def _choices(reply: dict, n: int = 1) -> list[dict]:
    choices = reply.get("choices") or []
    if len(choices) != n or any(ch.get("finish_reason") is None for ch in choices):
        raise Failed(f"expected {n} finished choices, got {json.dumps(choices)[:200]}")
    return choices


async def chat_stream(c: Client) -> None:
    await _openai_stream(c, "/v1/chat/completions", c.body(
        stream_options={"include_usage": True}))


async def chat(c: Client) -> None:
    _choices(await _json(c, "/v1/chat/completions", c.body()))


async def prediction(c: Client) -> None:
    text = make_text(12, c.rng)
    msgs = [{"role": "user", "content": f"Repeat exactly: {text}"}]
    body = {**c.body(), "messages": msgs, "prediction": {"type": "content", "content": text}}
    _choices(await _json(c, "/v1/chat/completions", body))


async def json_schema(c: Client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA,
                                                  "strict": True}}
    _choices(await _json(c, "/v1/chat/completions", c.body(response_format=fmt)))


async def tools(c: Client) -> None:
    msgs = [{"role": "user", "content": f"What is the weather in {c.rng.choice(WORDS)}?"}]
    body = {**c.body(tools=TOOLS, tool_choice=c.rng.choice(["auto", "required"])),
            "messages": msgs, "max_tokens": 24}
    _choices(await _json(c, "/v1/chat/completions", body))


async def n2(c: Client) -> None:
    body = c.body(n=2, temperature=0.8, seed=c.rng.randrange(10**6))
    _choices(await _json(c, "/v1/chat/completions", body), n=2)


async def cancel(c: Client) -> None:
    await _openai_stream(c, "/v1/chat/completions", {**c.body(), "max_tokens": 64},
                         stop_after=c.rng.randint(1, 3))


async def slow_reader(c: Client) -> None:
    await _openai_stream(c, "/v1/chat/completions", {**c.body(), "max_tokens": 6},
                         read_every_s=1.0)


async def vanish(c: Client) -> None:
    """A request (streamed or not) whose client drops the connection after 0.05-1 s: the
    task is cancelled, which makes httpx close the socket. Fails only if the server answered
    with an error before that."""
    path = c.rng.choice(["/v1/chat/completions", "/v1/completions"])
    body = {**c.body(), "max_tokens": 64, "stream": c.rng.random() < 0.5}
    if path == "/v1/completions":
        body["prompt"] = body.pop("messages")[-1]["content"]

    async def send() -> None:
        async with c.http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                _check_status(r, await r.aread())
            async for _ in r.aiter_bytes():
                pass

    try:
        await asyncio.wait_for(send(), timeout=c.rng.uniform(0.05, 1.0))
    except TimeoutError:
        pass


async def long_prompt(c: Client) -> None:
    """A fresh prompt of ~`long_words` words (uncached: what goes to the prefill worker)."""
    msgs = [{"role": "user", "content": f"Summarize ({c.rng.randrange(10**9)}): "
             + make_text(c.long_words, c.rng)}]
    _choices(await _json(c, "/v1/chat/completions", {**c.body(), "messages": msgs,
                                                      "max_tokens": 4}))


async def responses(c: Client) -> None:
    body = {"model": c.model, "instructions": c.rng.choice(c.systems) if c.systems else None,
            "input": make_text(15, c.rng), "max_output_tokens": c.max_tokens(), **GREEDY}
    if c.rng.random() < 0.5:
        reply = await _json(c, "/v1/responses", body)
        if reply.get("status") not in ("completed", "incomplete"):
            raise Failed(f"response status {reply.get('status')!r}")
        return
    await _typed_stream(c, "/v1/responses", body, ("error", "response.failed"),
                        ("response.completed", "response.incomplete"))


async def anthropic(c: Client) -> None:
    body = {"model": c.model, "max_tokens": c.max_tokens(), "temperature": 0,
            "messages": [{"role": "user", "content": make_text(15, c.rng)}]}
    if c.systems:
        body["system"] = c.rng.choice(c.systems)
    if c.rng.random() < 0.5:
        reply = await _json(c, "/v1/messages", body)
        if reply.get("type") != "message" or reply.get("stop_reason") is None:
            raise Failed(f"messages reply: {json.dumps(reply)[:200]}")
        return
    await _typed_stream(c, "/v1/messages", body, ("error",), ("message_stop",))


async def _typed_stream(c: Client, path: str, body: dict, failed: tuple[str, ...],
                        done: tuple[str, ...]) -> None:
    """Stream `body` to `path` (an API whose SSE events carry a `type`): returns at an event
    of a `done` type; raises Failed at a `failed` one, or when the stream ends first."""
    async with contextlib.aclosing(_sse_stream(c, path, body)) as stream:
        async for data in stream:
            kind = json.loads(data).get("type")
            if kind in failed:
                raise Failed(f"{path} stream: {data[:200]}")
            if kind in done:
                return
    raise Failed(f"{path} stream ended without {done[0]}")


async def ollama(c: Client) -> None:
    body = {"model": c.model, "messages": c.messages(10),
            "options": {"temperature": 0, "num_predict": c.max_tokens()}}
    stream = c.rng.random() < 0.5
    async with c.http.stream("POST", "/api/chat", json={**body, "stream": stream}) as r:
        if r.status_code != 200:
            _check_status(r, await r.aread())
        async for line in _lines(r):
            part = json.loads(line)
            if "error" in part:
                raise Failed(f"ollama: {part['error']}")
            if part.get("done"):
                return
    raise Failed("ollama reply ended without done")


def _malformed_cases(c: Client) -> list[tuple[str, dict]]:
    """(path, httpx request kwargs) of requests every API must refuse with a 4xx."""
    msgs = [{"role": "user", "content": "Hi"}]
    return [
        ("/v1/chat/completions", {"content": b"{not json",
                                  "headers": {"content-type": "application/json"}}),
        ("/v1/chat/completions", {"json": {"model": c.model, "messages": []}}),
        ("/v1/chat/completions", {"json": {"model": c.model, "messages": msgs,
                                           "temperature": "hot"}}),
        ("/v1/chat/completions", {"json": {"model": c.model,
                                           "messages": [{"role": "wizard", "content": "x"}]}}),
        ("/v1/chat/completions", {"json": {"model": c.model, "messages": msgs,
                                           "prediction": {"type": "nope"}}}),
        ("/v1/chat/completions", {"json": {"model": c.model, "messages": msgs,
                                           "response_format": {"type": "json_schema"}}}),
        ("/v1/responses", {"json": {"model": c.model, "input": "Hi",
                                    "previous_response_id": "resp_1"}}),
        ("/v1/messages", {"json": {"model": c.model, "messages": msgs}}),  # no max_tokens
        ("/api/chat", {"json": {"model": c.model, "messages": "Hi"}}),
    ]


async def _refused(c: Client, path: str, kwargs: dict) -> None:
    r = await c.http.post(path, **kwargs)
    if not 400 <= r.status_code < 500:
        raise Failed(f"{path}: expected a 4xx, got HTTP {r.status_code}: {r.text[:200]}")


async def malformed(c: Client) -> None:
    await _refused(c, *c.rng.choice(_malformed_cases(c)))


async def oversized(c: Client) -> None:
    """A prompt beyond the context on one of four APIs (400 `context_length_exceeded`, or
    Anthropic's `invalid_request_error`), or `n` above the server's 64 (400)."""
    words = " ".join(["hello"] * (c.context_length + 200))
    msgs = [{"role": "user", "content": words}]
    path, body = c.rng.choice([
        ("/v1/chat/completions", {"model": c.model, "messages": msgs, "max_tokens": 4}),
        ("/v1/completions", {"model": c.model, "prompt": words, "max_tokens": 4}),
        ("/v1/responses", {"model": c.model, "input": words, "max_output_tokens": 4}),
        ("/v1/messages", {"model": c.model, "messages": msgs, "max_tokens": 4}),
        ("/v1/chat/completions", {**c.body(), "n": 65}),
    ])
    await _refused(c, path, {"json": body})


# class name -> (coroutine, weight in the mix)
Request = Callable[[Client], Awaitable[None]]
CLASSES: dict[str, tuple[Request, float]] = {
    "chat_stream": (chat_stream, 4.0),
    "chat": (chat, 3.0),
    "prediction": (prediction, 1.0),
    "json_schema": (json_schema, 1.0),
    "tools": (tools, 1.0),
    "n2": (n2, 1.0),
    "cancel": (cancel, 1.0),
    "vanish": (vanish, 1.0),
    "slow_reader": (slow_reader, 0.5),
    "malformed": (malformed, 1.0),
    "oversized": (oversized, 0.5),
    "responses": (responses, 0.5),
    "anthropic": (anthropic, 0.5),
    "ollama": (ollama, 0.5),
    "long_prompt": (long_prompt, 0.5),
}


def pick(rng: random.Random) -> str:
    """A class name drawn by the weights of `CLASSES`."""
    names = list(CLASSES)
    return rng.choices(names, weights=[CLASSES[n][1] for n in names])[0]
