"""OpenAI's `response_format` to the engine's grammar, and the fields not served yet.

Shapes (OpenAI's): `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any JSON
object), `{"type": "json_schema", "json_schema": {"name": str, "schema": {...}, "strict":
bool, "description": str}}`. The schema is enforced exactly whether `strict` is true or
false (tandem never falls back to unconstrained text). Accepted on `/v1/chat/completions`
and `/v1/completions`.

Every failure is a 400 `invalid_request_error`: a malformed field names its dotted path as
`param` (codes `invalid_type`, `invalid_value`, `missing_required_parameter`); a schema the
engine cannot enforce has `param: "response_format"` and code `invalid_json_schema`, or
`grammar_too_complex` when it exceeds the grammar engine's limits or build timeout
(`app.engine.constrain.grammar`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.engine.constrain import CompiledGrammar, GrammarError, ResponseFormat
from app.server.errors import bad_request, checked_name
from app.server.errors import invalid_type as _invalid_type
from app.server.errors import json_type_name as _type_name
from app.server.errors import missing_parameter as _missing

TYPES = ("text", "json_object", "json_schema")
# request fields of tool calling, refused until tools are implemented (never ignored)
UNSUPPORTED_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions",
                           "function_call")


def parse_response_format(value: Any) -> ResponseFormat | None:
    """The request's `response_format` as the engine's `ResponseFormat`; None for absent,
    null or `{"type": "text"}`. Raises APIError 400 for a malformed value (see the module
    docstring)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid_type("response_format", "an object", value)
    kind = value.get("type")
    if kind is None:
        raise _missing("response_format.type")
    if kind not in TYPES:
        shown = repr(kind) if isinstance(kind, str) else _type_name(kind)
        raise bad_request(f"Invalid value for 'response_format.type': {shown}. Supported "
                          "values are: 'text', 'json_object', and 'json_schema'.",
                          param="response_format.type", code="invalid_value")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    spec = value.get("json_schema")
    if spec is None:
        raise _missing("response_format.json_schema")
    if not isinstance(spec, dict):
        raise _invalid_type("response_format.json_schema", "an object", spec)
    name = checked_name(spec.get("name"), "response_format.json_schema.name")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid_type("response_format.json_schema.strict", "a boolean", strict)
    if "schema" not in spec or spec["schema"] is None:
        raise _missing("response_format.json_schema.schema")
    schema = spec["schema"]
    if not isinstance(schema, dict):
        raise _invalid_type("response_format.json_schema.schema", "an object", schema)
    return ResponseFormat("json_schema", schema, name)


async def response_grammar(engine: Any, value: Any) -> CompiledGrammar | None:
    """The compiled grammar of a request's `response_format` (None: unconstrained), built
    off the event loop (cached per schema). Raises APIError 400 as `parse_response_format`,
    or for a schema the engine cannot enforce."""
    fmt = parse_response_format(value)
    if fmt is None:
        return None
    try:
        return await asyncio.to_thread(engine.grammars.compile, fmt)
    except GrammarError as exc:
        what = f"schema for response_format '{fmt.name}'" if fmt.name else "response_format"
        raise bad_request(f"Invalid {what}: {exc.reason}.", param="response_format",
                          code=exc.code) from exc


def refuse_tool_fields(body: Any) -> None:
    """Raise APIError 400 naming the first tool-calling field `body` sets (not null):
    tandem does not call tools yet, and a field accepted but ignored would mislead."""
    for name in UNSUPPORTED_TOOL_FIELDS:
        if getattr(body, name, None) is not None:
            raise bad_request(f"'{name}' is not supported yet: this server does not call "
                              "tools.", param=name, code="unsupported_parameter")
