"""Structured outputs (`response_format`) through the real server and the official client:
outputs valid for their schema (checked with `jsonschema`), the client's pydantic `parse()`
helper, stream vs non-stream byte parity, concurrent requests with different schemas, and
every refusal's exact error body."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.conftest import Server

ASK = [{"role": "user", "content": "Describe a fictional person as JSON."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                 "minItems": 1, "maxItems": 2},
        "address": {"$ref": "#/$defs/address"},
        "kind": {"const": "person"},
        "score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1},
                            {"type": "null"}]},
    },
    "required": ["name", "age", "role", "tags", "address", "kind", "score"],
    "additionalProperties": False,
    "$defs": {"address": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10},
                       "zip": {"type": "string", "minLength": 5, "maxLength": 5}},
        "required": ["city", "zip"],
        "additionalProperties": False,
    }},
}


def json_schema_format(schema: dict, name: str = "person", strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": strict}}


def _post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": server.model, **body},
                      headers=server.headers(), timeout=120)


def test_chat_json_schema_output_is_valid_for_the_schema(server: Server,
                                                          client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=server.model, messages=ASK, max_tokens=200, temperature=0,
        response_format=json_schema_format(PERSON))  # type: ignore[arg-type]
    (choice,) = r.choices
    assert choice.finish_reason == "stop"
    value = json.loads(choice.message.content or "")
    jsonschema.validate(value, PERSON)
    assert value["kind"] == "person"
    # whitespace is bounded: exactly json.dumps' separators, no newlines or indentation
    assert choice.message.content == json.dumps(value, ensure_ascii=False)


def test_metrics_count_constrained_requests_and_mask_time(server: Server,
                                                         client: openai.OpenAI) -> None:
    before = server.metric("tandem_constrained_requests_total", 0.0)
    masked = server.metric("tandem_grammar_mask_seconds_count", 0.0)
    r = client.chat.completions.create(
        model=server.model, messages=ASK, max_tokens=200, temperature=0, n=2,
        response_format=json_schema_format(PERSON))  # type: ignore[arg-type]
    tokens = r.usage.completion_tokens if r.usage else 0
    assert server.metric("tandem_constrained_requests_total") == before + 2  # one per choice
    # every sampled row of a constrained sequence is masked: at least one per step
    assert server.metric("tandem_grammar_mask_seconds_count") > masked
    assert server.metric('tandem_grammar_mask_seconds_bucket{le="+Inf"}') == server.metric(
        "tandem_grammar_mask_seconds_count")
    assert server.metric("tandem_grammar_mask_fill_seconds_total") > 0
    assert tokens > 0


def test_json_object_mode_gives_a_json_object(server: Server, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=server.model, max_tokens=120, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with {"ok": true} as JSON.'}])
    (choice,) = r.choices
    if choice.finish_reason == "stop":  # an unbounded object may run to max_tokens
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:
        assert (choice.message.content or "").startswith("{")


def test_text_format_is_unconstrained(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=ASK, max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    text = client.chat.completions.create(response_format={"type": "text"}, **kw)  # type: ignore[call-overload]
    assert text.choices[0].message.content == plain.choices[0].message.content


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=10)
    zip: str = pydantic.Field(min_length=5, max_length=5)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(min_length=1, max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    role: Literal["admin", "user", "guest"]
    address: Address


def test_the_clients_pydantic_parse_helper(server: Server, client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model=server.model, messages=ASK, max_tokens=200,
                                      temperature=0, response_format=Person)
    (choice,) = r.choices
    assert choice.finish_reason == "stop"
    person = choice.message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert person.model_dump() == json.loads(choice.message.content or "")


def test_stream_and_non_stream_are_byte_identical(server: Server,
                                                  client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=ASK, max_tokens=200, temperature=0,
              response_format=json_schema_format(PERSON))
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(streamed), PERSON)


def test_legacy_completions_take_response_format_stream_and_not(server: Server,
                                                                client: openai.OpenAI) -> None:
    kw = dict(model=server.model, prompt="A person as JSON: ", max_tokens=200, temperature=0,
              extra_body={"response_format": json_schema_format(PERSON)})
    whole = client.completions.create(**kw)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].text for c in
                       client.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    assert streamed == whole.choices[0].text
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].text), PERSON)


def test_n_choices_each_match_the_schema(server: Server, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=server.model, messages=ASK, max_tokens=200, temperature=0.9, seed=5, n=3,
        response_format=json_schema_format(PERSON))  # type: ignore[arg-type]
    assert len(r.choices) == 3
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def _schemas() -> list[dict]:
    """Eight different schemas, each with bounded output."""
    word = {"type": "string", "minLength": 1, "maxLength": 8}
    return [
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
         "additionalProperties": False},
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                "maximum": 9}},
         "required": ["n"], "additionalProperties": False},
        {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
         "required": ["color"], "additionalProperties": False},
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
         "minItems": 2, "maxItems": 3},
        {"type": "object", "properties": {"city": word, "country": word},
         "required": ["city", "country"], "additionalProperties": False},
        {"type": "object", "properties": {"v": {"anyOf": [{"type": "null"},
                                                          {"const": "yes"}]}},
         "required": ["v"], "additionalProperties": False},
        {"type": "object", "properties": {"pair": {"type": "array", "items": word,
                                                   "minItems": 2, "maxItems": 2}},
         "required": ["pair"], "additionalProperties": False},
        {"enum": ["alpha", "beta", 3, None]},
    ]


def test_eight_concurrent_requests_with_different_schemas(server: Server) -> None:
    async def main() -> list[str]:
        client = server.async_client()
        try:
            replies = await asyncio.gather(*(
                client.chat.completions.create(
                    model=server.model, messages=ASK, max_tokens=100, temperature=0.7,
                    seed=i, response_format=json_schema_format(s, f"s{i}"))  # type: ignore[arg-type]
                for i, s in enumerate(_schemas())))
        finally:
            await client.close()
        for r in replies:
            assert r.choices[0].finish_reason == "stop"
        return [r.choices[0].message.content or "" for r in replies]

    texts = asyncio.run(main())
    for text, schema in zip(texts, _schemas(), strict=True):
        jsonschema.validate(json.loads(text), schema)


REFUSALS = [
    ({"response_format": {"type": "xml"}}, {
        "message": "Invalid value for 'response_format.type': 'xml'. Supported values are: "
                   "'text', 'json_object', and 'json_schema'.",
        "param": "response_format.type", "code": "invalid_value"}),
    ({"response_format": "json"}, {
        "message": "Invalid type for 'response_format': expected an object, but got string.",
        "param": "response_format", "code": "invalid_type"}),
    ({"response_format": {}}, {
        "message": "Missing required parameter: 'response_format.type'.",
        "param": "response_format.type", "code": "missing_required_parameter"}),
    ({"response_format": {"type": "json_schema"}}, {
        "message": "Missing required parameter: 'response_format.json_schema'.",
        "param": "response_format.json_schema", "code": "missing_required_parameter"}),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}, {
        "message": "Missing required parameter: 'response_format.json_schema.name'.",
        "param": "response_format.json_schema.name", "code": "missing_required_parameter"}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b",
                                                                 "schema": PERSON}}}, {
        "message": "Invalid value for 'response_format.json_schema.name': expected 1 to 64 "
                   "letters, digits, underscores or dashes (got 'a b').",
        "param": "response_format.json_schema.name", "code": "invalid_value"}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}, {
        "message": "Missing required parameter: 'response_format.json_schema.schema'.",
        "param": "response_format.json_schema.schema", "code": "missing_required_parameter"}),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": PERSON, "strict": "yes"}}}, {
        "message": "Invalid type for 'response_format.json_schema.strict': expected a boolean, "
                   "but got string.",
        "param": "response_format.json_schema.strict", "code": "invalid_type"}),
    ({"response_format": json_schema_format({"type": "objekt"}, "bad")}, {
        "message": "Invalid schema for response_format 'bad': the schema is not a valid JSON "
                   "Schema at schema['type']: 'objekt' is not valid under any of the given "
                   "schemas.",
        "param": "response_format", "code": "invalid_json_schema"}),
    ({"response_format": json_schema_format({"not": {"type": "string"}}, "neg")}, {
        "message": "Invalid schema for response_format 'neg': the schema is not supported: "
                   'Unimplemented keys: ["not"].',
        "param": "response_format", "code": "invalid_json_schema"}),
    ({"response_format": json_schema_format({"$ref": "https://example.com/s.json"}, "far")}, {
        "message": "Invalid schema for response_format 'far': the schema is not supported: "
                   "Resource 'https://example.com/s.json' is not present in a registry and "
                   "retrieving it failed: Default retriever does not fetch resources.",
        "param": "response_format", "code": "invalid_json_schema"}),
    ({"functions": [{"name": "f"}]}, {
        "message": "'functions' is not supported: use 'tools' and 'tool_choice'.",
        "param": "functions", "code": "unsupported_parameter"}),
    ({"function_call": "auto"}, {
        "message": "'function_call' is not supported: use 'tools' and 'tool_choice'.",
        "param": "function_call", "code": "unsupported_parameter"}),
]


@pytest.mark.parametrize("fields, error", REFUSALS)
def test_refusals_are_400_with_the_exact_error(server: Server, fields: dict,
                                               error: dict) -> None:
    r = _post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 8, **fields})
    assert r.status_code == 400
    assert r.json() == {"error": {**error, "type": "invalid_request_error"}}


def test_completions_refuse_a_bad_schema_and_the_server_keeps_serving(server: Server) -> None:
    r = _post(server, "/v1/completions", {
        "prompt": "x", "max_tokens": 4,
        "response_format": json_schema_format({"type": "objekt"}, "bad")})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "message": "Invalid schema for response_format 'bad': the schema is not a valid JSON "
                   "Schema at schema['type']: 'objekt' is not valid under any of the given "
                   "schemas.",
        "type": "invalid_request_error", "param": "response_format",
        "code": "invalid_json_schema"}}
    ok = _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"]


def test_the_client_raises_bad_request_for_an_invalid_schema(server: Server,
                                                             client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=server.model, messages=ASK, max_tokens=8,
            response_format=json_schema_format({"type": "objekt"}, "bad"))  # type: ignore[arg-type]
    assert info.value.status_code == 400
    assert info.value.code == "invalid_json_schema"
    assert info.value.param == "response_format"
