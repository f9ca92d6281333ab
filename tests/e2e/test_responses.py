"""`POST /v1/responses` through the official `openai` client (`responses.create`,
`responses.stream`) against the real server, fake and embedded model: the text equals chat
completions' greedy text for the same messages, streamed equals collected with the exact
event sequence, a tool loop with `function_call_output`, namespace and hosted tools,
`text.format` json_schema, `max_output_tokens` -> incomplete, and every refusal's exact
error body (raw httpx)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import CTX_SIZE, Server, _start_inprocess
from tests.e2e.test_tools import SCHEMAS, TIME, WEATHER

GREEDY = {"temperature": 0, "extra_body": {"repetition_penalty": 1}}
SYSTEM = "You are a helpful assistant. Answer in one sentence."
QUESTION = "What is the capital of France?"
FUNCTIONS = [
    {"type": "function", "name": "get_weather", "description": "Weather forecast for a city",
     "parameters": WEATHER, "strict": True},
    {"type": "function", "name": "get_time", "description": "Current time",
     "parameters": TIME},
]
ASK = "What is the weather in Paris for the next 3 days?"
YES_NO = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
TEXT_EVENTS = ["response.output_item.added", "response.content_part.added"]
TEXT_DONE = ["response.output_text.done", "response.content_part.done",
             "response.output_item.done"]
CALL_DONE = ["response.function_call_arguments.done", "response.output_item.done"]


@pytest.fixture(autouse=True)
def _no_warnings():
    """The client's typed models parse every body and event without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # a socket another test's client left to the garbage collector is not this test's
        warnings.simplefilter("default", ResourceWarning)
        yield


def _types(events: list) -> list[str]:
    """Event types with each run of deltas collapsed to one entry."""
    out: list[str] = []
    for e in events:
        if not (e.type.endswith(".delta") and out and out[-1] == e.type):
            out.append(e.type)
    return out


def _streamed(client: openai.OpenAI, **kw) -> tuple[list, object]:
    """Every event of a raw stream, and the response of its last event; checks the
    sequence numbers count from 0 and that every delta's item was added first."""
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events, events[-1].response


def test_create_text_equals_chat_completions_greedy_text(server: Server,
                                                         client: openai.OpenAI) -> None:
    r = client.responses.create(model=server.model, instructions=SYSTEM, input=QUESTION,
                                max_output_tokens=24, **GREEDY)
    chat = client.chat.completions.create(
        model=server.model, max_tokens=24, **GREEDY,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    assert r.id.startswith("resp_") and r.object == "response" and r.model == server.model
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert [o.type for o in r.output] == ["message"]
    message = r.output[0]
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    finish = chat.choices[0].finish_reason
    assert r.status == {"stop": "completed", "length": "incomplete"}[finish]
    assert message.status == r.status
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == SYSTEM and r.max_output_tokens == 24 and r.temperature == 0
    assert r.tools == [] and r.tool_choice == "auto" and r.store is False
    # the same messages as items: developer role, typed parts, an assistant turn
    items = [{"role": "developer", "content": SYSTEM},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": QUESTION}]}]
    again = client.responses.create(model=server.model, input=items, max_output_tokens=24,
                                    **GREEDY)
    assert again.output_text == r.output_text


def test_stream_equals_create_with_the_exact_event_sequence(server: Server,
                                                            client: openai.OpenAI) -> None:
    kw = dict(model=server.model, instructions=SYSTEM, input=QUESTION, max_output_tokens=24,
              **GREEDY)
    whole = client.responses.create(**kw)
    events, last = _streamed(client, **kw)
    end = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert _types(events) == ["response.created", "response.in_progress", *TEXT_EVENTS,
                              "response.output_text.delta", *TEXT_DONE, end]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        whole.output_text
    assert last.output_text == whole.output_text and last.status == whole.status
    assert last.usage.output_tokens == whole.usage.output_tokens
    assert events[0].response.status == "in_progress" and events[0].response.id == last.id
    # the `responses.stream` helper accumulates the same response (it needs
    # `response.completed`: a reply that ends on its own, here a constrained one)
    fmt = {"format": {"type": "json_schema", "name": "yes_no", "schema": YES_NO}}
    collected = client.responses.create(model=server.model, input="Is Paris in France?",
                                        text=fmt, max_output_tokens=64, **GREEDY)
    with client.responses.stream(model=server.model, input="Is Paris in France?", text=fmt,
                                 max_output_tokens=64, **GREEDY) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == collected.output_text
    jsonschema.validate(json.loads(final.output_text), YES_NO)


def test_json_schema_text_format_gives_valid_json(server: Server,
                                                  client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=server.model, input=ASK, max_output_tokens=96, **GREEDY,
        text={"format": {"type": "json_schema", "name": "forecast", "schema": WEATHER,
                         "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), WEATHER)
    assert r.text.format.type == "json_schema" and r.text.format.name == "forecast"


def test_max_output_tokens_ends_incomplete(server: Server, client: openai.OpenAI) -> None:
    r = client.responses.create(model=server.model, input=QUESTION, max_output_tokens=3,
                                **GREEDY)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.usage.output_tokens == 3
    events, last = _streamed(client, model=server.model, input=QUESTION,
                             max_output_tokens=3, **GREEDY)
    assert events[-1].type == "response.incomplete"
    assert last.incomplete_details.reason == "max_output_tokens"
    assert last.output_text == r.output_text


def _check_call(item) -> dict:
    assert item.type == "function_call" and item.status == "completed"
    assert item.id.startswith("fc_") and item.call_id.startswith("call_")
    args = json.loads(item.arguments)
    jsonschema.validate(args, SCHEMAS[item.name])
    return args


def test_tool_loop_with_function_call_output(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, input=ASK, tools=FUNCTIONS, parallel_tool_calls=False,
              tool_choice={"type": "function", "name": "get_weather"},
              max_output_tokens=120, **GREEDY)
    first = client.responses.create(**kw)
    assert first.status == "completed" and [o.type for o in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and call.namespace is None
    _check_call(call)
    events, last = _streamed(client, **kw)
    assert _types(events) == ["response.created", "response.in_progress",
                              "response.output_item.added",
                              "response.function_call_arguments.delta", *CALL_DONE,
                              "response.completed"]
    assert events[2].item.arguments == "" and events[2].item.status == "in_progress"
    assert "".join(e.delta for e in events if e.type.endswith("arguments.delta")) == \
        call.arguments
    assert [(o.name, o.arguments) for o in last.output] == [(call.name, call.arguments)]
    # the loop: the call and its output go back in `input`, as Codex sends them
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "Sunny, 21 C."}]
    second = client.responses.create(model=server.model, input=history, tools=FUNCTIONS,
                                     tool_choice="none", max_output_tokens=24, **GREEDY)
    assert [o.type for o in second.output] == ["message"] and second.output_text
    alone = client.responses.create(model=server.model, input=ASK, tools=FUNCTIONS,
                                    tool_choice="none", max_output_tokens=1, **GREEDY)
    assert second.usage.input_tokens > alone.usage.input_tokens + 10
    # "required" with parallel calls off: one call, of an offered function
    required = client.responses.create(**{**kw, "tool_choice": "required"})
    assert len(required.output) == 1
    _check_call(required.output[0])


NAMESPACED = [
    {"type": "namespace", "name": "mcp__clock__", "description": "A clock server",
     "tools": [{"type": "function", "name": "now", "description": "Current time",
                "parameters": TIME, "strict": False}]},
    {"type": "web_search", "external_web_access": False},
]


def test_namespace_tools_come_back_under_their_namespace(server: Server,
                                                         client: openai.OpenAI) -> None:
    r = client.responses.create(model=server.model, input="What time is it in UTC?",
                                tools=NAMESPACED, tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=120, **GREEDY)
    call = r.output[0]
    assert (call.type, call.namespace, call.name) == ("function_call", "mcp__clock__", "now")
    jsonschema.validate(json.loads(call.arguments), TIME)
    assert [t.type for t in r.tools] == ["namespace", "web_search"]  # echoed
    history = [{"role": "user", "content": "What time is it in UTC?"},
               call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}]
    then = client.responses.create(model=server.model, input=history, tools=NAMESPACED,
                                   tool_choice="none", max_output_tokens=8, **GREEDY)
    assert then.output[0].type == "message"


def test_prompt_beyond_the_context_is_context_length_exceeded(server: Server) -> None:
    r = _post(server, {"input": "word " * (CTX_SIZE * 2)})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "input", "context_length_exceeded")
    assert error["message"].startswith(f"This model's maximum context length is {CTX_SIZE} "
                                       "tokens. However, your input resulted in ")


def _post(server: Server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses",
                      json={"model": server.model, "input": QUESTION,
                            "max_output_tokens": 8, **body},
                      headers=server.headers(), timeout=120)


REFUSALS = [
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "invalid_value",
     "Invalid value for 'input[0].type': 'reasoning'. Supported values are: 'message', "
     "'function_call', and 'function_call_output'."),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "invalid_value",
     "Invalid value for 'input[0].content[0].type': 'input_image': this model takes text "
     "only. Supported values are: 'input_text', 'output_text'."),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value",
     "Invalid value for 'input[0].role': 'tool'. Supported values are: 'user', "
     "'assistant', 'system', and 'developer'."),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id",
     "missing_required_parameter", "Missing required parameter: 'input[0].call_id'."),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
     "input[0].arguments", "invalid_value",
     "Invalid value for 'input[0].arguments': expected JSON text of an object."),
    ({"tools": [{"type": "function", "parameters": TIME}]}, "tools[0].name",
     "missing_required_parameter", "Missing required parameter: 'tools[0].name'."),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
     "tools[0].parameters", "invalid_function_parameters",
     "Invalid value for 'tools[0].parameters': a function's parameters must be a JSON "
     "Schema with \"type\": \"object\"."),
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type", "invalid_value",
     "Invalid value for 'tools[0].type': 'custom'. Supported values are: 'function', "
     "'namespace', and hosted tools (not offered to the model: code_interpreter, computer, "
     "computer_use_preview, file_search, image_generation, mcp, tool_search, web_search, "
     "web_search_2025_08_26, web_search_preview, web_search_preview_2025_03_11)."),
    ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
     "tool_choice.type", "invalid_value",
     "Invalid value for 'tool_choice.type': 'web_search' is a hosted tool that this server "
     "cannot run; it is not offered to the model."),
    ({"tools": FUNCTIONS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name", "invalid_value",
     "Invalid value for 'tool_choice.name': no function named 'nope' is in 'tools'."),
    ({"previous_response_id": "resp_123"}, "previous_response_id", "unsupported_parameter",
     "'previous_response_id' is not supported: this server is stateless and stores no "
     "responses. Send the whole conversation in 'input' (with 'store': false)."),
    ({"truncation": "auto"}, "truncation", "invalid_value",
     "Invalid value for 'truncation': 'auto'. Supported values are: 'disabled' (a prompt "
     "beyond the context is a 400 'context_length_exceeded')."),
    ({"text": {"format": {"type": "json_schema", "schema": YES_NO}}}, "text.format.name",
     "missing_required_parameter", "Missing required parameter: 'text.format.name'."),
    ({"tools": FUNCTIONS, "tool_choice": "required",
      "text": {"format": {"type": "json_object"}}}, "text.format", "invalid_value",
     "'text.format' cannot be combined with 'tools' unless 'tool_choice' is 'none'."),
]


@pytest.mark.parametrize("fields, param, code, message", REFUSALS,
                         ids=[r[1] + ":" + r[2] for r in REFUSALS])
def test_bad_input_is_400_with_the_exact_error(server: Server, fields: dict, param: str,
                                               code: str, message: str) -> None:
    r = _post(server, fields)
    assert r.status_code == 400
    assert r.json() == {"error": {"message": message, "type": "invalid_request_error",
                                  "param": param, "code": code}}


def test_hosted_service_fields_are_accepted(server: Server, client: openai.OpenAI) -> None:
    """What Codex sends besides the conversation: accepted, and the reply is the same."""
    plain = client.responses.create(model=server.model, input=QUESTION,
                                    max_output_tokens=8, **GREEDY)
    codex = client.responses.create(
        model=server.model, input=QUESTION, max_output_tokens=8, temperature=0, store=False,
        include=["reasoning.encrypted_content"], reasoning={"effort": "medium"},
        prompt_cache_key="k", metadata={"a": "b"}, user="u", service_tier="auto",
        truncation="disabled", text={"verbosity": "low"},
        extra_body={**GREEDY["extra_body"], "client_metadata": {"x": "y"}})
    assert codex.output_text == plain.output_text and codex.metadata == {"a": "b"}


@pytest.fixture
def failing() -> Iterator[Server]:
    """The fake engine failing on its third step (no model; it stays failed: one per test)."""
    yield from _start_inprocess(None, fail_after=3)


def test_error_after_the_stream_began_is_error_then_response_failed(failing: Server) -> None:
    body = {"input": "hi", "max_output_tokens": 30, "stream": True}
    with httpx.stream("POST", f"{failing.url}/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200
        frames = [f.split("\n") for f in r.read().decode().split("\n\n") if f]
    assert all(f[0] == "event: " + json.loads(f[1][len("data: "):])["type"] for f in frames)
    events = [json.loads(f[1][len("data: "):]) for f in frames]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    error, failed = events[-2:]
    assert error["code"] == "server_error" and "simulated backend error" in error["message"]
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": error["message"]}


def test_the_client_reads_a_failed_stream(failing: Server) -> None:
    client = openai.OpenAI(base_url=f"{failing.url}/v1", api_key="none", max_retries=0)
    typed = list(client.responses.create(model="fake-model", input="hi", stream=True,
                                         max_output_tokens=30))
    assert [e.type for e in typed[-2:]] == ["error", "response.failed"]
    assert "simulated backend error" in typed[-1].response.error.message
