"""A model family's native tool-call format, derived from its chat template.

`derive_format(template)` renders a probe conversation three ways with the same `tools`
(the generation prompt; an assistant turn holding one probe call; one holding plain text)
and compares them, as llama.cpp's auto-parser does: what the call turn adds around the
call's JSON object are the call markers, and the key that holds the probe arguments is the
arguments key. Qwen2.5 gives `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`
("tagged"), Llama-3.x bare `{"name": ..., "parameters": ...}` ("json"). A template that
ignores `tools` or cannot render a call (plain ChatML, e.g. SmolLM2) gets the "generic"
format: the tool list and a JSON reply format go into the system turn (llama-server's
Generic handler), and the reply is `{"tool_calls": [...]}` or `{"response": "..."}`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Literal

from app.tool_calls.spec import Tool, ToolChoice
from models.chat_template import ChatTemplateError, render

_PROBE_NAME = "tandem_probe_fn"
_PROBE_ARGS = {"tandem_probe_arg": 7}
_PROBE_TOOL = Tool(_PROBE_NAME, "probe", {"type": "object",
                                          "properties": {"tandem_probe_arg": {"type": "integer"}}})
_PROBE_TEXT = "tandem probe text"


@dataclass(frozen=True, slots=True)
class CallFormat:
    """How a model writes a call. `kind`: "tagged" (JSON between `open` and `close`
    markers, calls joined by `separator`), "json" (a bare JSON object; `open`/`close`
    empty), "generic" (tandem's JSON reply format for templates without tools).
    `args_key` is the object's arguments key ("arguments" or "parameters"); `parallel`
    whether the template can render several calls in one turn."""

    kind: Literal["tagged", "json", "generic"]
    open: str = ""
    close: str = ""
    separator: str = "\n"
    args_key: str = "arguments"
    parallel: bool = True

    @property
    def trigger(self) -> str:
        """The text that starts a call in free text ("" when none marks it)."""
        return self.open.strip()


GENERIC = CallFormat("generic", parallel=True)


def derive_format(template: str | None, bos: str = "", eos: str = "") -> CallFormat:
    """The call format of `template` (GENERIC when it has no tool support we can read)."""
    return _derive(template or "", bos, eos)


@functools.lru_cache(maxsize=16)
def _derive(template: str, bos: str, eos: str) -> CallFormat:
    if not template:
        return GENERIC
    tools = [_PROBE_TOOL.template_view()]
    user = {"role": "user", "content": "hi"}
    try:
        if render(template, [user], bos, eos, True) == render(template, [user], bos, eos,
                                                                True, tools=tools):
            return GENERIC  # the template never shows the tools to the model
        head = render(template, [user], bos, eos, True, tools=tools)
        call = render(template, [user, _call_turn(1)], bos, eos, False, tools=tools)
        text = render(template, [user, {"role": "assistant", "content": _PROBE_TEXT}],
                      bos, eos, False, tools=tools)
    except ChatTemplateError:
        return GENERIC
    if not (call.startswith(head) and text.startswith(head) and _PROBE_TEXT in text):
        return GENERIC
    end = text[len(head):].split(_PROBE_TEXT, 1)[1]  # what closes an assistant turn
    body = call[len(head):]
    if end and body.endswith(end):
        body = body[: -len(end)]
    found = _find_call(body)
    if found is None:
        return GENERIC
    start, stop, args_key = found
    open_, close = body[:start], body[stop:]
    kind = "tagged" if open_.strip() else "json"
    separator, parallel = _separator(template, bos, eos, tools, head, end, open_, close)
    return CallFormat(kind, open_, close, separator, args_key, parallel)


def _call_turn(n: int) -> dict[str, Any]:
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": _PROBE_NAME, "arguments": dict(_PROBE_ARGS)}}
             for i in range(n)]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _find_call(body: str) -> tuple[int, int, str] | None:
    """(start, end, arguments key) of the probe call's JSON object in `body`."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(body):
        if ch != "{":
            continue
        try:
            value, end = decoder.raw_decode(body, i)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("name") == _PROBE_NAME:
            for key, arg in value.items():
                if arg == _PROBE_ARGS or arg == json.dumps(_PROBE_ARGS):
                    return i, end, key
            return None
    return None


def _separator(template: str, bos: str, eos: str, tools: list[dict[str, Any]], head: str,
               end: str, open_: str, close: str) -> tuple[str, bool]:
    """What the template writes between two calls of one turn, and whether it can."""
    try:
        two = render(template, [{"role": "user", "content": "hi"}, _call_turn(2)], bos, eos,
                     False, tools=tools)
    except ChatTemplateError:
        return "", False  # e.g. Llama-3.1: "This model only supports single tool-calls"
    body = two[len(head):]
    if end and body.endswith(end):
        body = body[: -len(end)]
    first = _find_call(body)
    if first is None or not close:
        return "", False
    rest = body[first[1] + len(close):]
    cut = rest.find(open_) if open_ else -1
    return (rest[:cut], True) if cut >= 0 else ("", False)


def generic_messages(messages: list[dict[str, Any]], tools: list[Tool],
                     choice: ToolChoice) -> list[dict[str, Any]]:
    """`messages` for a template without tool support: the tool list and the JSON reply
    format in the system turn (merged into the first system message, or a new one), past
    calls as their JSON reply. `choice` "none" shows no tools."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in m["tool_calls"]]
            m = {"role": "assistant", "content": json.dumps({"tool_calls": calls},
                                                            ensure_ascii=False)}
        elif m.get("role") == "tool":
            m = {"role": "tool", "content": m.get("content") or ""}
        out.append(m)
    if choice.mode == "none" or not tools:
        return out
    offered = [t for t in tools if choice.mode != "function" or t.name == choice.name]
    listing = json.dumps([{"name": t.name, "description": t.description,
                           "parameters": t.parameters} for t in offered], ensure_ascii=False)
    call = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
    if choice.mode == "auto":
        reply = (f"Respond with one JSON object: either {call} to call tools, or "
                 '{"response": "<your answer>"} to answer directly.')
    else:
        reply = f"Respond with one JSON object: {call}"
    text = f"You can call these tools (arguments as JSON Schema):\n{listing}\n{reply}"
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        return [{**out[0], "content": out[0]["content"] + "\n\n" + text}, *out[1:]]
    return [{"role": "system", "content": text}, *out]
