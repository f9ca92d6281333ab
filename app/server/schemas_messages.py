"""Request bodies of Anthropic's Messages API (`POST /v1/messages`, `.../count_tokens`).

Shapes follow docs.anthropic.com/en/api/messages (and the `anthropic` SDK's
`MessageCreateParams`): `messages: [{"role": "user" | "assistant", "content": str | [block]}]`
with blocks `text`, `image`, `document`, `thinking`, `redacted_thinking`, `tool_use`
`{id, name, input}` and `tool_result` `{tool_use_id, content: str | [text block], is_error}`;
`system: str | [text block]`; a `system` role inside `messages` is accepted too (Claude Code
sends one). Unknown fields are ignored, `cache_control` on any block included. `tools` are
checked by `app.server.routes_messages` (custom tools and Anthropic's server tools differ in
shape).

Validation errors read like Anthropic's own (which come from pydantic as well):
`"max_tokens: Field required"`, `"messages.0.content.0: Input tag 'video' found using
'type' does not match any of the expected tags: ..."` — see `anthropic_message`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.server.errors import APIError, bad_request
from app.server.schemas import INT64_MAX, UNICODE_ERROR, Int64, _Body


class _Part(BaseModel):
    """A nested object: the body's own `_Body` check already refused lone surrogates at any
    depth (a `mode="before"` validator cannot sit on a discriminator field)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class TextBlock(_Part):
    type: Literal["text"]
    text: str


class ImageBlock(_Part):
    """Refused by the route: the served models take text only."""

    type: Literal["image"]
    source: Any = None


class DocumentBlock(_Part):
    """Refused by the route: the served models take text only."""

    type: Literal["document"]
    source: Any = None


class ThinkingBlock(_Part):
    """A reasoning block of an earlier reply: dropped from the prompt."""

    type: Literal["thinking"]
    thinking: str = ""
    signature: str | None = None


class RedactedThinkingBlock(_Part):
    """Dropped from the prompt, like `thinking`."""

    type: Literal["redacted_thinking"]
    data: str = ""


class ToolUseBlock(_Part):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolReferenceBlock(_Part):
    """In a tool search's result: the tool `tool_name` (sent with `defer_loading`) is now
    offered to the model."""

    type: Literal["tool_reference"]
    tool_name: str


ResultBlock = Annotated[TextBlock | ImageBlock | DocumentBlock | ToolReferenceBlock,
                        Field(discriminator="type")]


class ToolResultBlock(_Part):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultBlock] | None = None
    is_error: bool | None = None


Block = Annotated[
    TextBlock | ImageBlock | DocumentBlock | ThinkingBlock | RedactedThinkingBlock
    | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]


class Message(_Part):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class ToolChoiceAuto(_Part):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Part):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Part):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Part):
    type: Literal["none"]


ToolChoiceParam = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
                            Field(discriminator="type")]


class JSONOutputFormat(_Part):
    """Anthropic's structured outputs: the reply is JSON valid for `schema`."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Part):
    """`effort` steers Claude's thinking budget: accepted and ignored. `format` is applied."""

    effort: str | None = None
    format: JSONOutputFormat | None = None


class CustomTool(_Part):
    """A tool the client runs (`type` absent or "custom"); checked on its own, since
    Anthropic's server tools (other `type`s) have other shapes."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    defer_loading: bool | None = None  # offered once a tool_reference names it


class CountTokensRequest(_Body):
    """Body of `POST /v1/messages/count_tokens`: the prompt fields of a create request."""

    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoiceParam | None = None
    # accepted and ignored (see the README): they steer Anthropic's service or thinking
    thinking: Any = None
    context_management: Any = None
    cache_control: Any = None
    output_config: OutputConfig | None = None
    output_format: JSONOutputFormat | None = None  # the beta name of output_config.format
    # output-changing features this server does not have: refused (400 naming the field)
    container: Any = None
    mcp_servers: Any = None


class MessagesRequest(CountTokensRequest):
    """Body of `POST /v1/messages`. `temperature` and `top_p` in [0, 1] (Anthropic's
    ranges); `top_k` <= 0 disables top-k. Left out, each takes the served model's
    recommended value (as on `/v1/chat/completions`)."""

    max_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)]
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Int64 | None = None
    stream: bool | None = None
    metadata: Any = None
    service_tier: Any = None
    speed: Any = None
    inference_geo: Any = None


REFUSED_FIELDS = ("container", "mcp_servers")


def _loc(loc: tuple[Any, ...]) -> str:
    """A pydantic location as Anthropic writes it (`messages.0.content`), without the
    member names pydantic adds inside a plain union (`str`, `list[...]`)."""
    parts = [str(p) for p in loc
             if not (isinstance(p, str) and ("[" in p or p in ("str", "list", "dict")))]
    return ".".join(parts)


def anthropic_message(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    """The message of a 400 for `exc`: `"<location>: <pydantic's message>"` of its most
    specific error (the deepest location: a union field reports one error per member)."""
    errors = exc.errors()
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    where = _loc(prefix + tuple(first.get("loc", ())))
    if first.get("type") == UNICODE_ERROR:  # the path inside the field, as `[0].text`
        where += re.sub(r"\[(\d+)\]", r".\1", first.get("ctx", {}).get("where", ""))
    msg = str(first.get("msg", "invalid value"))
    return f"{where}: {msg}" if where else msg


def parse(model: type[CountTokensRequest], body: Any) -> Any:
    """`body` validated as `model`. Raises APIError 400 worded like Anthropic's."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise bad_request(anthropic_message(exc)) from None


def validation_400(exc: ValidationError, prefix: tuple[Any, ...]) -> APIError:
    """A 400 for a part of the body validated on its own at `prefix` (e.g. `tools.3`)."""
    return bad_request(anthropic_message(exc, prefix))
