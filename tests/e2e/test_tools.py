"""Tool calling through the real server and the official `openai` client: `required` and
named calls with arguments valid for the tool's parameters (`jsonschema`), a two-turn tool
loop, stream vs non-stream parity of the arguments, and every refusal's exact error body.

`server` runs the fake engine and the embedded SmolLM2-135M (its template has no tools:
the generic JSON format); `qwen` runs Qwen2.5-Coder-1.5B (native `<tool_call>` format),
skipped where the model is not in the store."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import Server

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                   "unit": {"enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather",
                                      "description": "Weather forecast for a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


def check_calls(message) -> list:
    """The message's calls, each with an id, type function, and arguments valid JSON for
    its tool's parameters."""
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.id.startswith("call_") and len(call.id) > 10
        assert call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return message.tool_calls


def streamed_calls(client: openai.OpenAI, **kw) -> tuple[dict[int, dict], str | None, str]:
    """{index: {"id", "name", "arguments"}} accumulated from a stream, its finish reason
    and its content; checks OpenAI's delta shape (id, type and name once per call)."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None
            calls[d.index]["arguments"] += d.function.arguments or ""
    return calls, finish, content


def test_required_call_has_valid_arguments(server: Server, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=120, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    check_calls(choice.message)


def test_named_call_is_that_tool_and_one_call_without_parallel(server: Server,
                                                               client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, max_tokens=120, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False)
    calls = check_calls(r.choices[0].message)
    assert [c.function.name for c in calls] == ["get_time"]
    assert r.choices[0].finish_reason == "tool_calls"


def test_streamed_arguments_equal_the_collected_ones(server: Server,
                                                     client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=ASK, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_tokens=120, temperature=0)
    whole = client.chat.completions.create(**kw)
    calls, finish, content = streamed_calls(client, **kw)
    assert finish == "tool_calls" and content == ""
    expected = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == expected


def test_two_turn_tool_loop(server: Server, client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=120, temperature=0)
    call = check_calls(first.choices[0].message)[0]
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."}]
    second = client.chat.completions.create(model=server.model, messages=history,
                                            tools=TOOLS, tool_choice="none", max_tokens=24,
                                            temperature=0)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    assert second.choices[0].finish_reason in ("stop", "length")
    # the call and its result are in the prompt: longer than the question alone, asked the
    # same way (with tool_choice "none" the generic format leaves the tool list out, so the
    # first turn's prompt, which shows it, is no measure)
    alone = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                           tool_choice="none", max_tokens=1, temperature=0)
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 10


def _post(server: Server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions",
                      json={"model": server.model, "messages": ASK, "max_tokens": 8, **body},
                      headers=server.headers(), timeout=120)


def _fn(**function) -> list[dict]:
    return [{"type": "function", "function": function}]


REFUSALS = [
    ({"tools": {"type": "function"}}, "tools", "invalid_type",
     "Invalid type for 'tools': expected an array, but got object."),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type",
     "invalid_value", "Invalid value for 'tools[0].type': 'retrieval'. Supported values are: "
     "'function'."),
    ({"tools": _fn(description="no name")}, "tools[0].function.name",
     "missing_required_parameter", "Missing required parameter: 'tools[0].function.name'."),
    ({"tools": _fn(name="get weather")}, "tools[0].function.name", "invalid_value",
     "Invalid value for 'tools[0].function.name': expected 1 to 64 letters, digits, "
     "underscores or dashes (got 'get weather')."),
    ({"tools": [*_fn(name="f"), *_fn(name="f")]}, "tools[1].function.name", "invalid_value",
     "Invalid value for 'tools[1].function.name': the function name 'f' is used by more than "
     "one tool."),
    ({"tools": _fn(name="f", parameters={"type": "string"})}, "tools[0].function.parameters",
     "invalid_function_parameters", "Invalid value for 'tools[0].function.parameters': a "
     "function's parameters must be a JSON Schema with \"type\": \"object\"."),
    ({"tools": _fn(name="f", parameters=[1])}, "tools[0].function.parameters",
     "invalid_type", "Invalid type for 'tools[0].function.parameters': expected an object, "
     "but got array."),
    ({"tools": _fn(name="f", parameters={"type": "object", "properties": {"a": {
        "type": "objekt"}}})}, "tools[0].function.parameters", "invalid_function_parameters",
     "Invalid value for 'tools[0].function.parameters': the schema is not a valid JSON Schema "
     "at schema['properties']['a']['type']: 'objekt' is not valid under any of the given "
     "schemas."),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "invalid_value",
     "Invalid value for 'tool_choice.function.name': no function named 'nope' is in 'tools'."),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value",
     "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
     "specified."),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "invalid_value",
     "Invalid value for 'tool_choice': 'always'. Supported values are: 'none', 'auto', "
     "'required', or an object naming a function."),
    ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls", "invalid_type",
     "Invalid type for 'parallel_tool_calls': expected a boolean, but got string."),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format",
     "invalid_value", "'response_format' cannot be combined with 'tools' unless "
     "'tool_choice' is 'none'."),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "invalid_value",
     "Invalid value for 'messages[1].tool_calls[0].function.arguments': expected JSON text "
     "of an object."),
    ({"messages": [*ASK, {"role": "tool", "content": "18 C"}]}, "messages[1].tool_call_id",
     "missing_required_parameter",
     "Missing required parameter: 'messages[1].tool_call_id'."),
]


@pytest.mark.parametrize("fields, param, code, message", REFUSALS,
                         ids=[r[1] + ":" + r[2] for r in REFUSALS])
def test_malformed_tool_fields_are_400_with_the_exact_error(server: Server, fields: dict,
                                                            param: str, code: str,
                                                            message: str) -> None:
    r = _post(server, fields)
    assert r.status_code == 400
    assert r.json() == {"error": {"message": message, "type": "invalid_request_error",
                                  "param": param, "code": code}}
    ok = _post(server, {"temperature": 0})  # the server keeps serving
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


@pytest.mark.model
def test_qwen_required_named_and_streamed_calls(qwen: Server) -> None:
    client = qwen.client()
    kw = dict(model=qwen.model, messages=ASK, tools=TOOLS, max_tokens=48, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              parallel_tool_calls=False)  # with parallel calls it goes on to other cities
    whole = client.chat.completions.create(**kw)
    calls = check_calls(whole.choices[0].message)
    assert [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments)["city"] == "Paris"
    streamed, finish, _ = streamed_calls(client, **kw)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(streamed.items())] == [
        (c.function.name, c.function.arguments) for c in calls]


@pytest.mark.model
def test_qwen_auto_calls_the_tool_the_prompt_needs_then_answers(qwen: Server) -> None:
    client = qwen.client()
    first = client.chat.completions.create(model=qwen.model, messages=ASK, tools=TOOLS,
                                           max_tokens=48, temperature=0)
    assert first.choices[0].finish_reason == "tool_calls"
    call = check_calls(first.choices[0].message)[0]
    assert call.function.name == "get_weather"
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id,
                "content": "Sunny, 21 C all three days."}]
    # the 1.5B model, given the result, repeats the call (as a call in "auto", as fenced
    # JSON text in "none") rather than answering in words; what is guaranteed is that the
    # loop completes: "none" gives text, no call, and stops on its own
    second = client.chat.completions.create(model=qwen.model, messages=history, tools=TOOLS,
                                            tool_choice="none", max_tokens=96, temperature=0)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    assert second.choices[0].finish_reason == "stop"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_not_text(server: Server, client: openai.OpenAI,
                                              stream: bool) -> None:
    """Cut after 3 tokens, inside the call's opening: no call to report, and the model's
    call markup is not handed on as the reply's words."""
    kw = dict(model=server.model, messages=ASK, tools=TOOLS, tool_choice="required",
              max_tokens=3, temperature=0)
    if stream:
        chunks = list(client.chat.completions.create(**kw, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
        assert (text, chunks[-1].choices[0].finish_reason) == ("", "length")
    else:
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        assert (m.content, m.tool_calls, r.choices[0].finish_reason) == ("", None, "length")
