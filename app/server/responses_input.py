"""The request side of `POST /v1/responses` (OpenAI's Responses API): body, input items,
tools and `text.format`, translated to the shared chat path's `ChatInput` shapes.

Shapes (OpenAI's, as the `openai` 3.x client's `responses.create` sends them):
- `input`: a string (one user message) or a list of items:
  `{"type": "message", "role": "user"|"assistant"|"system"|"developer", "content": str |
  [{"type": "input_text"|"output_text", "text": str}]}` (`type` may be left out: an
  easy input message), `{"type": "function_call", "call_id", "name", "arguments",
  "namespace"?}` and `{"type": "function_call_output", "call_id", "output": str |
  [{"type": "input_text", "text"}]}`. `instructions` becomes a system message first;
  `developer` is a system message; system messages at the start are joined into one
  (templates that take one system turn, and Codex sends two).
- `tools`: `{"type": "function", "name", "description", "parameters", "strict"}` (the
  schema is enforced whatever `strict` says), `{"type": "namespace", "name",
  "description", "tools": [function tools]}` (flattened: the model sees
  `<namespace>__<name>`, or `<namespace><name>` when the namespace ends in `_`, as Codex
  names MCP tools `mcp__server__tool`; a call comes back as `name` and `namespace`
  separately, which is how Codex routes it, `ToolName::new(namespace, name)`), and
  hosted tools (`HOSTED_TOOLS`), which run on OpenAI's side: not offered to the model.
- `tool_choice`: "auto" | "none" | "required" | `{"type": "function", "name"}`;
  `{"type": <a hosted tool>}` is a 400 (nothing here can run it).
- `text.format`: `{"type": "text"}` | `{"type": "json_object"}` | `{"type":
  "json_schema", "name", "schema", "strict", "description"}`, mapped to chat's
  `response_format`.

Every malformed value is a 400 `invalid_request_error` naming its dotted path as `param`,
with OpenAI's codes (`invalid_type`, `invalid_value`, `missing_required_parameter`,
`unsupported_parameter`, `invalid_function_parameters`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from app.engine.constrain import GrammarError
from app.engine.constrain.grammar import check_schema
from app.server.errors import APIError, bad_request, checked_name
from app.server.errors import invalid_type as _invalid_type
from app.server.errors import invalid_value as _invalid
from app.server.errors import json_type_name as _type_name
from app.server.errors import missing_parameter as _missing
from app.server.schemas import Int64, SamplingFields, TokenCount, _Body
from app.tool_calls import Tool, ToolChoice

# Tools OpenAI runs itself (platform.openai.com/docs/api-reference/responses/create, `tools`):
# a local server cannot, so they are not shown to the model.
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_2025_08_26",
    "web_search_preview_2025_03_11", "file_search", "code_interpreter", "image_generation",
    "computer_use_preview", "computer", "mcp", "tool_search",
})
ROLES = ("user", "assistant", "system", "developer")
ITEM_TYPES = ("message", "function_call", "function_call_output")
TEXT_PARTS = ("input_text", "output_text")
# sampling fields a Responses body may carry: OpenAI's two, and tandem's extensions as on chat
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
            "repeat_last_n", "speculative")


class ResponsesRequest(_Body):
    """Body of `POST /v1/responses`. Fields a hosted service uses and that mean nothing
    here are accepted and ignored (`IGNORED`); `REFUSED` ones are a 400 when set."""

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    max_output_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Int64 | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Int64 | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    speculative: bool | None = None
    text: Any = None
    stream: bool | None = None
    truncation: str | None = None
    include: list[str] | None = None
    # accepted, ignored (see the README): they steer OpenAI's service, not the reply
    store: bool | None = None
    reasoning: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Any = None
    client_metadata: Any = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    stream_options: Any = None
    # refused when set: each changes the reply, and none is served
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    background: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None

    def sampling(self) -> SamplingFields:
        return SamplingFields(**{k: getattr(self, k) for k in SAMPLING})


REFUSED = {
    "conversation": "conversations are stored on OpenAI's side; send the whole conversation "
                    "in 'input'",
    "prompt": "prompt templates are stored on OpenAI's side; send the text in 'input'",
    "max_tool_calls": "it is not supported",
    "top_logprobs": "log probabilities are not returned on this route",
}


def refuse_unserved(body: ResponsesRequest) -> None:
    """400 for the fields this server does not serve (see the module docstring)."""
    if body.previous_response_id is not None:
        raise bad_request("'previous_response_id' is not supported: this server is stateless "
                          "and stores no responses. Send the whole conversation in 'input' "
                          "(with 'store': false).", param="previous_response_id",
                          code="unsupported_parameter")
    if body.background:
        raise bad_request("'background' is not supported: responses are answered while the "
                          "request is open.", param="background", code="unsupported_parameter")
    for name, why in REFUSED.items():
        if getattr(body, name) is not None:
            raise bad_request(f"'{name}' is not supported: {why}.", param=name,
                              code="unsupported_parameter")
    if body.truncation not in (None, "disabled"):
        raise _invalid("truncation", f"{body.truncation!r}. Supported values are: "
                       "'disabled' (a prompt beyond the context is a 400 "
                       "'context_length_exceeded').")
    for i, value in enumerate(body.include or []):
        if value == "message.output_text.logprobs":
            raise _invalid(f"include[{i}]", f"{value!r}: log probabilities are not returned "
                           "on this route.", "unsupported_parameter")


# ---------------------------------------------------------------- tools


@dataclass
class ToolSet:
    """The request's tools: `tools` as the model sees them (flat names), `origin` maps a
    flat name to (namespace, name) for namespaced ones."""

    tools: list[Tool] = field(default_factory=list)
    origin: dict[str, tuple[str, str]] = field(default_factory=dict)
    hosted: set[str] = field(default_factory=set)

    def flat(self, name: str, namespace: str | None) -> str:
        """The flat name of `name` in `namespace` (None: a top-level function)."""
        return name if namespace is None else flat_name(namespace, name)

    def split(self, flat: str) -> tuple[str | None, str]:
        """(namespace or None, name) of a called function."""
        ns, name = self.origin.get(flat, (None, flat))
        return ns, name


def flat_name(namespace: str, name: str) -> str:
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


def _function(item: dict[str, Any], where: str) -> Tool:
    name = checked_name(item.get("name"), f"{where}.name")
    description = item.get("description")
    if description is not None and not isinstance(description, str):
        raise _invalid_type(f"{where}.description", "a string", description)
    strict = item.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid_type(f"{where}.strict", "a boolean", strict)
    schema = item.get("parameters")
    if schema is None:
        return Tool(name, description)
    if not isinstance(schema, dict):
        raise _invalid_type(f"{where}.parameters", "an object", schema)
    if schema.get("type") != "object":
        raise _invalid(f"{where}.parameters", "a function's parameters must be a JSON Schema "
                       "with \"type\": \"object\".", "invalid_function_parameters")
    try:
        check_schema(schema)
    except GrammarError as exc:
        raise _invalid(f"{where}.parameters", exc.reason + ".",
                       "invalid_function_parameters") from None
    return Tool(name, description, schema)


def _kind(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise _invalid_type(where, "an object", item)
    kind = item.get("type")
    if kind is None:
        raise _missing(f"{where}.type")
    if not isinstance(kind, str):
        raise _invalid_type(f"{where}.type", "a string", kind)
    return kind


def parse_tools(value: Any) -> ToolSet:
    """`tools` as a `ToolSet`. Raises APIError 400 (param `tools[i]...`)."""
    out = ToolSet()
    if value is None:
        return out
    if not isinstance(value, list):
        raise _invalid_type("tools", "an array", value)

    def add(tool: Tool, where: str, namespace: str | None) -> None:
        flat = out.flat(tool.name, namespace)
        if any(t.name == flat for t in out.tools):
            raise _invalid(f"{where}.name", f"the function name {flat!r} is used by more "
                           "than one tool.")
        if namespace is not None:
            out.origin[flat] = (namespace, tool.name)
            tool = Tool(flat, tool.description, tool.parameters)
        out.tools.append(tool)

    for i, item in enumerate(value):
        where = f"tools[{i}]"
        kind = _kind(item, where)
        if kind == "function":
            add(_function(item, where), where, None)
        elif kind == "namespace":
            ns = checked_name(item.get("name"), f"{where}.name")
            inner = item.get("tools")
            if not isinstance(inner, list):
                raise _invalid_type(f"{where}.tools", "an array", inner)
            for j, fn in enumerate(inner):
                at = f"{where}.tools[{j}]"
                if _kind(fn, at) != "function":
                    raise _invalid(f"{at}.type", f"{fn['type']!r}. Supported values are: "
                                   "'function'.")
                add(_function(fn, at), at, ns)
        elif kind in HOSTED_TOOLS:
            out.hosted.add(kind)
        else:
            raise _invalid(f"{where}.type", f"{kind!r}. Supported values are: 'function', "
                           "'namespace', and hosted tools (not offered to the model: "
                           f"{', '.join(sorted(HOSTED_TOOLS))}).")
    return out


def parse_tool_choice(value: Any, tools: ToolSet) -> ToolChoice:
    """`tool_choice` (default "auto" with tools, "none" without). Raises APIError 400 for a
    malformed value, a named function not in `tools`, or a hosted tool."""
    if value is None:
        return ToolChoice("auto" if tools.tools else "none")
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise _invalid("tool_choice", f"{value!r}. Supported values are: 'none', "
                           "'auto', 'required', or an object naming a function.")
        if value == "required" and not tools.tools:
            raise _invalid("tool_choice", "'required' needs at least one function in "
                           "'tools'.")
        return ToolChoice(value if tools.tools else "none")  # type: ignore[arg-type]
    kind = _kind(value, "tool_choice")
    if kind in HOSTED_TOOLS:
        raise _invalid("tool_choice.type", f"{kind!r} is a hosted tool that this server "
                       "cannot run; it is not offered to the model.")
    if kind != "function":
        raise _invalid("tool_choice.type", f"{kind!r}. Supported values are: 'function'.")
    name = value.get("name")
    if name is None:
        raise _missing("tool_choice.name")
    namespace = value.get("namespace")
    flat = tools.flat(name, namespace) if isinstance(namespace, str) else name
    if not isinstance(name, str) or flat not in {t.name for t in tools.tools}:
        raise _invalid("tool_choice.name", f"no function named {name!r} is in 'tools'.")
    return ToolChoice("function", flat)


# ---------------------------------------------------------------- input items


def _text_content(content: Any, where: str) -> str:
    """A message's or output's content as text: a string, or text parts joined by "\\n"."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid_type(where, "a string or an array of content parts", content)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = _kind(part, at)
        if kind not in TEXT_PARTS:
            raise _invalid(f"{at}.type", f"{kind!r}: this model takes text only. Supported "
                           "values are: 'input_text', 'output_text'.")
        text = part.get("text")
        if text is None:
            raise _missing(f"{at}.text")
        if not isinstance(text, str):
            raise _invalid_type(f"{at}.text", "a string", text)
        texts.append(text)
    return "\n".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if value is None:
        raise _missing(f"{where}.{key}")
    if not isinstance(value, str):
        raise _invalid_type(f"{where}.{key}", "a string", value)
    return value


def template_messages(body: ResponsesRequest, tools: ToolSet) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat template messages (`ChatInput.messages`):
    consecutive `function_call` items become one assistant message's `tool_calls` (joined
    to the assistant text just before them), a `function_call_output` a `tool` message
    with the called function's flat name. Raises APIError 400 naming `input[i]...`."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    items = body.input
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return _join_leading_system(out)
    names: dict[str, str] = {}  # call id -> flat function name
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _invalid_type(where, "an object", item)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role is None:
                raise _missing(f"{where}.role")
            if role not in ROLES:
                shown = repr(role) if isinstance(role, str) else _type_name(role)
                raise _invalid(f"{where}.role", f"{shown}. Supported values are: 'user', "
                               "'assistant', 'system', and 'developer'.")
            if "content" not in item:
                raise _missing(f"{where}.content")
            text = _text_content(item["content"], f"{where}.content")
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call_id = _string(item, "call_id", where)
            name = _string(item, "name", where)
            arguments = _string(item, "arguments", where)
            namespace = item.get("namespace")
            if namespace is not None and not isinstance(namespace, str):
                raise _invalid_type(f"{where}.namespace", "a string", namespace)
            try:
                args = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                args = None
            if not isinstance(args, dict):
                raise _invalid(f"{where}.arguments", "expected JSON text of an object.")
            flat = tools.flat(name, namespace)
            names[call_id] = flat
            call = {"id": call_id, "type": "function",
                    "function": {"name": flat, "arguments": args}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            if "output" not in item:
                raise _missing(f"{where}.output")
            text = _text_content(item["output"], f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "name": names.get(call_id, ""), "content": text})
        else:
            shown = repr(kind) if isinstance(kind, str) else _type_name(kind)
            raise _invalid(f"{where}.type", f"{shown}. Supported values are: 'message', "
                           "'function_call', and 'function_call_output'.")
    if not any(m["role"] != "system" for m in out):
        raise bad_request("'input' must hold at least one message that is not a system or "
                          "developer message.", param="input", code="invalid_value")
    return _join_leading_system(out)


def _join_leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system messages at the start as one (blank line between)."""
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    if n < 2:
        return messages
    joined = "\n\n".join(m["content"] for m in messages[:n] if m["content"])
    return [{"role": "system", "content": joined}, *messages[n:]]


# ---------------------------------------------------------------- text.format


def response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` in chat's `response_format` shape (None: plain text). Raises APIError
    400 naming `text.format...`."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _invalid_type("text", "an object", text)
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = _kind(fmt, "text.format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise _invalid("text.format.type", f"{kind!r}. Supported values are: 'text', "
                       "'json_object', and 'json_schema'.")
    name = checked_name(fmt.get("name"), "text.format.name")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid_type("text.format.strict", "a boolean", strict)
    schema = fmt.get("schema")
    if schema is None:
        raise _missing("text.format.schema")
    if not isinstance(schema, dict):
        raise _invalid_type("text.format.schema", "an object", schema)
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": strict}}


def renamed(exc: APIError) -> APIError:
    """`exc` from the shared path with chat's `response_format` called `text.format`."""
    if exc.param and exc.param.startswith("response_format"):
        exc.param = "text.format"
    exc.message = exc.message.replace("'response_format'", "'text.format'").replace(
        "response_format", "text.format")
    return exc
