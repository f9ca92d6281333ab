"""Anthropic's Messages API through the official `anthropic` client (and raw HTTP for the
wire: event names, exact error bodies)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import pytest

from tests.e2e.conftest import API_KEY, CTX_SIZE, Server, _start_inprocess

GREEDY = {"temperature": 0}  # not in the SDK's signature any more: sent as extra_body
SYSTEM = "You answer in one short sentence."
ASK = [{"role": "user", "content": "Name three colors."}]
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather forecast for a city",
          "input_schema": WEATHER},
         {"name": "get_time", "description": "Current time",
          "input_schema": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                           "required": ["zone"]}}]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


@pytest.fixture
def claude(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=server.api_key, max_retries=0,
                               timeout=120)


def _create(claude: anthropic.Anthropic, server: Server, **kw) -> anthropic.types.Message:
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 24)
    return claude.messages.create(model=server.model, extra_body=GREEDY, **kw)


def _post(server: Server, body: dict, path: str = "/v1/messages",
          headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120,
                      headers={"x-api-key": server.api_key or "", **(headers or {})})


def _events(server: Server, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of a streamed request, read off the wire."""
    with httpx.stream("POST", f"{server.url}/v1/messages", json={**body, "stream": True},
                      headers={"x-api-key": server.api_key or ""}, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    out = []
    for block in raw.split("\n\n"):
        if block:
            name, data = block.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


def _text(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_says_what_chat_completions_says(server: Server,
                                                claude: anthropic.Anthropic) -> None:
    openai_client = server.client()
    messages = [{"role": "system", "content": SYSTEM}, *ASK]
    openai_client.chat.completions.create(model=server.model, messages=messages, max_tokens=1)
    chat = openai_client.chat.completions.create(model=server.model, messages=messages,
                                                 max_tokens=24, temperature=0)
    m = _create(claude, server, system=SYSTEM)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == server.model
    assert [b.type for b in m.content] == ["text"]
    assert _text(m) == chat.choices[0].message.content
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[
        chat.choices[0].finish_reason]
    assert m.stop_sequence is None
    u = m.usage
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens
    assert u.cache_read_input_tokens > 0  # the chat requests put the prompt in the cache
    assert u.cache_creation_input_tokens == 0
    assert u.output_tokens == chat.usage.completion_tokens
    # the same system prompt as text blocks, or as a system message inside `messages` (as
    # Claude Code sends it), is the same prompt
    blocks = _create(claude, server, system=[{"type": "text", "text": SYSTEM,
                                               "cache_control": {"type": "ephemeral"}}])
    inside = _create(claude, server, messages=[{"role": "system", "content": SYSTEM}, *ASK])
    for other in (blocks, inside):
        assert _text(other) == _text(m)
        assert (other.usage.input_tokens + other.usage.cache_read_input_tokens
                == chat.usage.prompt_tokens)


def test_stream_events_and_text_equal_the_collected_reply(server: Server,
                                                          claude: anthropic.Anthropic) -> None:
    whole = _create(claude, server)
    body = {"model": server.model, "messages": ASK, "max_tokens": 24, **GREEDY}
    events = _events(server, body)
    names = [n for n, _ in events]
    n_deltas = names.count("content_block_delta")
    assert n_deltas >= 1
    assert names == ["message_start", "ping", "content_block_start",
                     *["content_block_delta"] * n_deltas, "content_block_stop",
                     "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens + \
        whole.usage.cache_read_input_tokens
    assert events[2][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == _text(whole)
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole.usage.output_tokens
    with claude.messages.stream(model=server.model, messages=ASK, max_tokens=24,
                                extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == _text(whole) == _text(final)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert (final.usage.input_tokens + final.usage.cache_read_input_tokens
            == whole.usage.input_tokens + whole.usage.cache_read_input_tokens)


def test_tool_loop_with_tool_result(server: Server, claude: anthropic.Anthropic) -> None:
    kw = dict(messages=WEATHER_ASK, tools=TOOLS, max_tokens=120,
              tool_choice={"type": "tool", "name": "get_weather",
                           "disable_parallel_tool_use": True})
    first = _create(claude, server, **kw)
    assert first.stop_reason == "tool_use" and first.stop_sequence is None
    calls = [b for b in first.content if b.type == "tool_use"]
    assert [c.name for c in calls] == ["get_weather"]
    assert calls[0].id.startswith("toolu_") and len(calls[0].id) > 12
    jsonschema.validate(calls[0].input, WEATHER)
    # streamed: the same call, its input in input_json_delta fragments
    events = _events(server, {"model": server.model, **kw, **GREEDY})
    starts = [d for n, d in events if n == "content_block_start"
              and d["content_block"]["type"] == "tool_use"]
    assert len(starts) == 1 and starts[0]["content_block"]["name"] == "get_weather"
    assert starts[0]["content_block"]["input"] == {}
    index = starts[0]["index"]
    partial = "".join(d["delta"]["partial_json"] for n, d in events
                      if n == "content_block_delta" and d["index"] == index)
    assert json.loads(partial) == calls[0].input
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    with claude.messages.stream(model=server.model, extra_body=GREEDY, **kw) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (c.name, c.input) for c in calls]
    # the result goes back; the model answers in text
    history = [*WEATHER_ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                             "content": "Sunny, 21 C."}]}]
    second = _create(claude, server, messages=history, tools=TOOLS, max_tokens=24,
                     tool_choice={"type": "none"})
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in second.content] == ["text"] and _text(second)
    count = claude.messages.count_tokens(model=server.model, messages=history, tools=TOOLS,
                                         tool_choice={"type": "none"})
    assert count.input_tokens == second.usage.input_tokens + second.usage.cache_read_input_tokens
    alone = claude.messages.count_tokens(model=server.model, messages=WEATHER_ASK, tools=TOOLS,
                                         tool_choice={"type": "none"})
    assert count.input_tokens > alone.input_tokens + 10  # the call and its result are in it
    # `any` makes a call too
    anyone = _create(claude, server, **{**kw, "tool_choice": {
        "type": "any", "disable_parallel_tool_use": True}})
    assert anyone.stop_reason == "tool_use"
    assert {b.name for b in anyone.content if b.type == "tool_use"} <= {"get_weather",
                                                                         "get_time"}


def test_count_tokens_is_the_prompt_of_a_create(server: Server,
                                                claude: anthropic.Anthropic) -> None:
    kw = dict(system=SYSTEM, messages=WEATHER_ASK, tools=TOOLS)
    count = claude.messages.count_tokens(model=server.model, **kw)
    m = _create(claude, server, max_tokens=2, **kw)
    assert count.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
    bare = claude.messages.count_tokens(model=server.model, messages=WEATHER_ASK)
    assert bare.input_tokens < count.input_tokens  # the tools are counted
    r = _post(server, {"model": server.model, "messages": WEATHER_ASK},
              "/v1/messages/count_tokens?beta=true")
    assert r.json() == {"input_tokens": bare.input_tokens}


def test_stop_sequence_and_max_tokens(server: Server, claude: anthropic.Anthropic) -> None:
    whole = _create(claude, server, max_tokens=32)
    text = _text(whole)
    words = text.split()
    stop = next(w for w in words[1:] if len(w) > 2 and text.index(w) > 0)
    cut = _create(claude, server, max_tokens=32, stop_sequences=["@@never@@", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert _text(cut) == text[:text.index(stop)]
    events = _events(server, {"model": server.model, "messages": ASK, "max_tokens": 32,
                              "stop_sequences": [stop], **GREEDY})
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    short = _create(claude, server, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_client_fields_are_accepted(server: Server, claude: anthropic.Anthropic) -> None:
    """What Claude Code sends besides the prompt: accepted, and the reply is the same."""
    plain = _create(claude, server)
    loaded = claude.messages.create(
        model=server.model, messages=[{"role": "user", "content": [
            {"type": "text", "text": ASK[0]["content"], "cache_control": {"type": "ephemeral"}}]}],
        max_tokens=24, metadata={"user_id": "u1"}, service_tier="auto",
        thinking={"type": "adaptive"}, output_config={"effort": "high"},
        extra_body={**GREEDY, "context_management": {"edits": []}},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14",
                       "anthropic-version": "2023-06-01"},
        extra_query={"beta": "true"})
    assert _text(loaded) == _text(plain)
    # thinking blocks in the history are dropped; server tools are not offered
    history = [*ASK, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "x"},
        {"type": "text", "text": "Red."}]}, {"role": "user", "content": "More."}]
    without = [*ASK, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "More."}]
    web = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]
    assert (claude.messages.count_tokens(model=server.model, messages=history, tools=web)
            == claude.messages.count_tokens(model=server.model, messages=without))


def test_deferred_tools_are_offered_once_referenced(server: Server,
                                                    claude: anthropic.Anthropic) -> None:
    """Claude Code's tool search: a tool with `defer_loading` joins the prompt once a
    `tool_reference` in a tool result names it."""
    def count(messages: list, tools: list) -> int:
        return claude.messages.count_tokens(model=server.model, messages=messages,
                                            tools=tools).input_tokens

    deferred = [TOOLS[0], {**TOOLS[1], "defer_loading": True}]
    assert count(ASK, deferred) == count(ASK, TOOLS[:1])
    found = [*ASK, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
         "input": {"city": "Paris", "days": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "tool_reference",
                                                   "tool_name": "get_time"}]}]}]
    assert count(found, deferred) == count(found, TOOLS) > count(found, TOOLS[:1])


def test_output_config_format_is_applied(server: Server, claude: anthropic.Anthropic) -> None:
    m = _create(claude, server, messages=WEATHER_ASK, max_tokens=80,
                output_config={"format": {"type": "json_schema", "schema": WEATHER}})
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(_text(m)), WEATHER)


def _error(message: str, kind: str = "invalid_request_error") -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


DROP = object()  # a field left out of the body
BAD = [
    ({"max_tokens": DROP}, "max_tokens: Field required"),
    ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "messages.0.content.0: 'image' content blocks are not supported: this model takes text "
     "only."),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages.0.content.0: Input tag 'video' found using 'type' does not match any of the "
     "expected tags: 'text', 'image', 'document', 'thinking', 'redacted_thinking', "
     "'tool_use', 'tool_result'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                 "content": [{"type": "document"}]}]}]},
     "messages.0.content.0.content.0: 'document' content blocks are not supported: this "
     "model takes text only."),
    ({"messages": [*ASK, {"role": "assistant", "content": "Red,"}]},
     "messages.1: the conversation must end with a user message (this server does not "
     "continue a prefilled assistant message)."),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema: Field required"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]},
     "tools.0.input_schema.type: Input should be 'object'"),
    ({"tools": [{"name": "get weather", "input_schema": {"type": "object"}}]},
     "tools.0.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice.name: no tool named 'nope' is in 'tools'."),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}],
      "tool_choice": {"type": "tool", "name": "web_search"}},
     "tool_choice.name: 'web_search' is a server tool, which this server does not run."),
    ({"tool_choice": {"type": "any"}},
     "tool_choice: 'any' needs at least one tool with an input_schema in 'tools'."),
    ({"temperature": 1.5}, "temperature: Input should be less than or equal to 1"),
    ({"container": "c1"}, "container: this server does not support 'container'."),
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]},
     "mcp_servers: this server does not support 'mcp_servers'."),
]


@pytest.mark.parametrize("fields, message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_input_gets_anthropic_errors(server: Server, fields: dict, message: str) -> None:
    body = {"model": server.model, "messages": ASK, "max_tokens": 8, **fields}
    r = _post(server, {k: v for k, v in body.items() if v is not DROP})
    assert r.status_code == 400
    assert r.json() == _error(message)


def test_key_model_and_context_errors(server: Server, claude: anthropic.Anthropic) -> None:
    body = {"model": server.model, "messages": ASK, "max_tokens": 8}
    r = _post(server, body, headers={"x-api-key": "wrong"})
    assert r.status_code == 401
    assert r.json() == _error("Incorrect API key provided.", "authentication_error")
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=server.model, messages=ASK, max_tokens=8)
    r = _post(server, {**body, "model": "claude-sonnet-4-5"})
    assert r.status_code == 404
    assert r.json() == _error(f"The model `claude-sonnet-4-5` does not exist. This server "
                              f"serves `{server.model}`.", "not_found_error")
    long = [{"role": "user", "content": "colors and shapes " * 1200}]
    n = claude.messages.count_tokens(model=server.model, messages=long).input_tokens
    assert n > CTX_SIZE
    r = _post(server, {**body, "messages": long})
    assert r.status_code == 400
    assert r.json() == _error(f"prompt is too long: {n} tokens > {CTX_SIZE - 1} maximum")


# -- the fake engine only: an engine that fails, a small context ----------------------------

@pytest.fixture(scope="module")
def failing() -> Iterator[Server]:
    yield from _start_inprocess(API_KEY, fail_after=3)


@pytest.fixture(scope="module")
def small() -> Iterator[Server]:
    yield from _start_inprocess(API_KEY, context_length=128)


def test_error_after_the_stream_began_is_an_error_event(failing: Server) -> None:
    events = _events(failing, {"model": failing.model, "messages": ASK, "max_tokens": 30})
    assert [n for n, _ in events[:2]] == ["message_start", "ping"]
    name, data = events[-1]
    assert name == "error"
    assert data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "simulated backend error" in data["error"]["message"]


def test_max_tokens_beyond_the_context_is_a_cap(small: Server) -> None:
    claude = anthropic.Anthropic(base_url=small.url, api_key=API_KEY, max_retries=0)
    m = claude.messages.create(model=small.model, max_tokens=32000, extra_body=GREEDY, timeout=60,
                               messages=[{"role": "user", "content": "x" * 60}])
    # the scripted reply (40 characters, then EOS) does not fit in what is left
    room = 128 - m.usage.input_tokens
    assert m.usage.output_tokens == room
    assert m.stop_reason == "model_context_window_exceeded"
