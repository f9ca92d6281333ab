"""The llguidance (Lark) grammar that enforces tool calls in a model's native format.

Each tool's call is a `%json` object `{"name": <const>, <args_key>: <its parameters>}`
with the whitespace of `json.dumps` (", " and ": ", no newlines), as chat templates render
past calls (`tojson`), so the model writes what it has seen. Per `ToolChoice`:

- "required" / "function": active from the first token: one call (several, joined by the
  format's separator, when `parallel`), nothing before or after;
- "auto": free text until the call's trigger (Qwen2.5's `<tool_call>`; for bare-JSON
  formats, a reply that starts with `{`), constrained from there (a lazy lexeme, so the
  trigger ends the free text); after the call(s) the grammar ends the reply;
- "none": no grammar (None).

The generic format is one JSON object, `{"tool_calls": [calls]}` (or, for "auto", also
`{"response": string}`), from the first token.
"""

from __future__ import annotations

import json
from typing import Any

from app.tool_calls.format import CallFormat
from app.tool_calls.spec import Tool, ToolChoice

_WHITESPACE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def call_schema(tool: Tool, args_key: str) -> dict[str, Any]:
    """JSON Schema of one call object of `tool`."""
    return {"type": "object",
            "properties": {"name": {"const": tool.name}, args_key: tool.parameters},
            "required": ["name", args_key], "additionalProperties": False}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": _WHITESPACE}, ensure_ascii=False)


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a Lark string literal


def tool_grammar(fmt: CallFormat, tools: list[Tool], choice: ToolChoice,
                 parallel: bool = True) -> str | None:
    """Lark grammar text for `choice` over `tools` in `fmt`; None for "none" (or no tools).
    `parallel` false allows at most one call. Raises ValueError for a "function" choice
    naming no tool of `tools`."""
    if choice.mode == "none" or not tools:
        return None
    offered = tools
    if choice.mode == "function":
        offered = [t for t in tools if t.name == choice.name]
        if not offered:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not in tools")
    forced = choice.mode != "auto"
    many = parallel and fmt.parallel
    if fmt.kind == "generic":
        calls = {"type": "array", "items": {"anyOf": [call_schema(t, "arguments")
                                                      for t in offered]},
                 "minItems": 1}
        if not many:
            calls["maxItems"] = 1
        reply: dict[str, Any] = {"type": "object", "properties": {"tool_calls": calls},
                                 "required": ["tool_calls"], "additionalProperties": False}
        if not forced:
            answer = {"type": "object", "properties": {"response": {"type": "string"}},
                      "required": ["response"], "additionalProperties": False}
            reply = {"anyOf": [reply, answer]}
        return "start: " + _json(reply) + "\n"
    lines = [f"fn{i}: {_json(call_schema(t, fmt.args_key))}" for i, t in enumerate(offered)]
    fns = " | ".join(f"fn{i}" for i in range(len(offered)))
    if fmt.kind == "json":  # bare JSON, one call (Llama-3 renders no parallel calls)
        head = [f"start: {fns}"] if forced else [f"start: TEXT | {fns}",
                                                 "TEXT: /[^{ \\t\\n](?s:.*)/"]
        return "\n".join(head + lines) + "\n"
    trigger = fmt.trigger
    rest = fmt.open[fmt.open.index(trigger) + len(trigger):]
    body = f"body: {_lit(rest)} ({fns}) {_lit(fmt.close)}"
    more = f" ({_lit(fmt.separator)} {_lit(trigger)} body)*" if many else ""
    if forced:
        head = [f"start: {_lit(trigger)} body{more}"]
    else:
        head = [f"start: TEXT | hd body{more}",
                f"hd[lazy]: TEXT {_lit(trigger)}",
                "TEXT: /(?s:.*)/"]
    return "\n".join(head + [body] + lines) + "\n"
