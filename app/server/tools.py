"""OpenAI's tool-calling fields to tandem's neutral tool records (`app.tool_calls`).

Request shapes (OpenAI's): `tools: [{"type": "function", "function": {"name": str,
"description": str, "parameters": JSON Schema of type object, "strict": bool}}]`;
`tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name":
str}}` (default "auto" with tools, "none" without); `parallel_tool_calls: bool` (default
true; false = at most one call). History: assistant messages with `tool_calls: [{"id",
"type": "function", "function": {"name", "arguments": JSON text of an object}}]` and
`tool` messages with `tool_call_id`.

Every malformed value is a 400 `invalid_request_error` naming its dotted path as `param`,
with OpenAI's codes (`invalid_type`, `invalid_value`, `missing_required_parameter`); a
tool's parameters that are no valid JSON Schema (or that the grammar engine cannot
enforce) have code `invalid_function_parameters`. `functions` and `function_call`
(deprecated by OpenAI) stay refused with `unsupported_parameter`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from app.engine.constrain import CompiledGrammar, GrammarError
from app.engine.constrain.grammar import check_schema
from app.server.errors import bad_request, checked_name
from app.server.errors import invalid_type as _invalid_type
from app.server.errors import invalid_value as _invalid
from app.server.errors import json_type_name as _type_name
from app.server.errors import missing_parameter as _missing
from app.tool_calls import CallFormat, Tool, ToolCallParser, ToolChoice, tool_grammar
from app.tool_calls.format import generic_messages

DEPRECATED_FIELDS = ("functions", "function_call")


@dataclass
class ToolRequest:
    """A request's tools: what the template shows, what the grammar enforces, and how the
    reply is parsed. `grammar` is None for tool_choice "none"."""

    tools: list[Tool]
    choice: ToolChoice
    parallel: bool
    fmt: CallFormat
    grammar: CompiledGrammar | None = None

    def parser(self) -> ToolCallParser | None:
        """A fresh parser for one choice (None when no call can be made)."""
        if self.choice.mode == "none":
            return None
        return ToolCallParser(self.fmt, {t.name for t in self.tools},
                              auto=self.choice.mode == "auto")


def refuse_deprecated(body: Any) -> None:
    """400 for `functions` / `function_call` (OpenAI's deprecated tool fields)."""
    for name in DEPRECATED_FIELDS:
        if getattr(body, name, None) is not None:
            raise bad_request(f"'{name}' is not supported: use 'tools' and 'tool_choice'.",
                              param=name, code="unsupported_parameter")


def parse_tools(value: Any) -> list[Tool]:
    """`tools` as neutral `Tool`s ([] for absent or null). Raises APIError 400."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _invalid_type("tools", "an array", value)
    tools: list[Tool] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(item, dict):
            raise _invalid_type(where, "an object", item)
        kind = item.get("type")
        if kind is None:
            raise _missing(f"{where}.type")
        if kind != "function":
            shown = repr(kind) if isinstance(kind, str) else _type_name(kind)
            raise _invalid(f"{where}.type", f"{shown}. Supported values are: 'function'.")
        fn = item.get("function")
        if fn is None:
            raise _missing(f"{where}.function")
        if not isinstance(fn, dict):
            raise _invalid_type(f"{where}.function", "an object", fn)
        name = checked_name(fn.get("name"), f"{where}.function.name")
        if name in seen:
            raise _invalid(f"{where}.function.name", f"the function name {name!r} is used by "
                           "more than one tool.")
        seen.add(name)
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise _invalid_type(f"{where}.function.description", "a string", description)
        tools.append(Tool(name, description, _parameters(fn, f"{where}.function.parameters")))
    return tools


def _parameters(fn: dict[str, Any], param: str) -> dict[str, Any]:
    if fn.get("parameters") is None:
        return {"type": "object", "properties": {}}
    schema = fn["parameters"]
    if not isinstance(schema, dict):
        raise _invalid_type(param, "an object", schema)
    if schema.get("type") != "object":
        raise _invalid(param, "a function's parameters must be a JSON Schema with "
                       "\"type\": \"object\".", "invalid_function_parameters")
    try:
        check_schema(schema)
    except GrammarError as exc:
        raise _invalid(param, exc.reason + ".", "invalid_function_parameters") from None
    return schema


def parse_tool_choice(value: Any, tools: list[Tool]) -> ToolChoice:
    """`tool_choice` (default "auto" with tools, "none" without). Raises APIError 400 for
    a malformed value, any value without `tools`, or a named function not in `tools`."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if not tools:
        raise bad_request("Invalid value for 'tool_choice': 'tool_choice' is only allowed "
                          "when 'tools' are specified.", param="tool_choice",
                          code="invalid_value")
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise _invalid("tool_choice", f"{value!r}. Supported values are: 'none', "
                           "'auto', 'required', or an object naming a function.")
        return ToolChoice(value)  # type: ignore[arg-type]
    if not isinstance(value, dict):
        raise _invalid_type("tool_choice", "a string or an object", value)
    if value.get("type") != "function":
        raise _invalid("tool_choice.type", f"{value.get('type')!r}. Supported values are: "
                       "'function'.")
    fn = value.get("function")
    if not isinstance(fn, dict) or fn.get("name") is None:
        raise _missing("tool_choice.function.name")
    name = fn["name"]
    if name not in {t.name for t in tools}:
        raise _invalid("tool_choice.function.name", f"no function named {name!r} is in "
                       "'tools'.")
    return ToolChoice("function", name)


def parse_parallel(value: Any) -> bool:
    """`parallel_tool_calls` (default true). Raises APIError 400 unless a boolean."""
    if value is None:
        return True
    if not isinstance(value, bool):
        raise _invalid_type("parallel_tool_calls", "a boolean", value)
    return value


def history_calls(value: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as templates take them (arguments parsed to an
    object). Raises APIError 400 naming `messages[i].tool_calls[j]...`."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(value, list):
        raise _invalid_type(where, "an array", value)
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise _invalid_type(at, "an object", call)
        for key in ("id", "function"):
            if call.get(key) is None:
                raise _missing(f"{at}.{key}")
        if call.get("type", "function") != "function":
            raise _invalid(f"{at}.type", f"{call['type']!r}. Supported values are: "
                           "'function'.")
        fn = call["function"]
        if not isinstance(fn, dict):
            raise _invalid_type(f"{at}.function", "an object", fn)
        for key in ("name", "arguments"):
            if fn.get(key) is None:
                raise _missing(f"{at}.function.{key}")
            if not isinstance(fn[key], str):
                raise _invalid_type(f"{at}.function.{key}", "a string", fn[key])
        try:
            args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise _invalid(f"{at}.function.arguments", "expected JSON text of an object.")
        calls.append({"id": call["id"], "type": "function",
                      "function": {"name": fn["name"], "arguments": args}})
    return calls


def prompt_messages(messages: list[dict[str, Any]], request: ToolRequest
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template: native formats get the tools as a template
    variable; the generic format gets them in the system turn (tool_choice "none": not
    shown there)."""
    if request.fmt.kind == "generic":
        return generic_messages(messages, request.tools, request.choice), None
    views = [t.template_view() for t in request.tools]
    return messages, views or None


async def compile_tools(engine: Any, request: ToolRequest) -> CompiledGrammar | None:
    """The grammar enforcing `request`'s calls, built off the event loop (cached per
    grammar text); None for tool_choice "none". Raises APIError 400 (param "tools") when
    the grammar engine refuses a tool's parameters."""
    text = tool_grammar(request.fmt, request.tools, request.choice, request.parallel)
    if text is None:
        return None
    try:
        return await asyncio.to_thread(engine.grammars.compile_lark, text, "tools")
    except GrammarError as exc:
        raise bad_request(f"Invalid 'tools': {exc.reason}.", param="tools",
                          code="invalid_function_parameters") from exc
