"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

Both also answer with a query string (`?beta=true`, what Claude Code sends). Request shapes:
`app.server.schemas_messages`. The request is translated into the shared chat path
(`app.server.chat_core`): `system` (and `system`-role messages) become system turns,
`tool_use` blocks an assistant's calls, `tool_result` blocks tool turns (`is_error` prefixes
the result with "Error: "), `thinking` blocks are dropped; `image` and `document` blocks are
a 400 (the served models take text only). `tools` with `input_schema` are offered as
functions; Anthropic's server tools (any other `type`, e.g. `web_search_20250305`) are not
offered and a `tool_choice` naming one is a 400; a tool with `defer_loading` is offered once a
`tool_reference` block in a tool result names it (Claude Code's tool search). `tool_choice`: `auto`, `any` (at least one
call), `tool` (that one), `none`; `disable_parallel_tool_use` allows one call at most.
`output_config.format` (or the beta `output_format`) constrains the reply to its JSON schema.

Reply: `{"id": "msg_...", "type": "message", "role": "assistant", "model", "content":
[text block, tool_use blocks {"id": "toolu_...", "name", "input": object}], "stop_reason",
"stop_sequence", "usage"}`. `stop_reason`: `end_turn`, `tool_use`, `stop_sequence` (with
the matched string in `stop_sequence`), `max_tokens`, or `model_context_window_exceeded`
when the reply filled the context before `max_tokens` (Anthropic's semantics for a
`max_tokens` larger than the room left: a cap, not an error). `usage` as Anthropic counts
it: `input_tokens` are the prompt tokens not read from the prefix cache,
`cache_read_input_tokens` those that were (their sum is the prompt's length, what
`count_tokens` answers), `cache_creation_input_tokens` is 0.

Streamed (`stream: true`), events named as Anthropic's (docs.anthropic.com/en/docs/
build-with-claude/streaming): `message_start`, `ping`, then per block `content_block_start`,
`content_block_delta` (`text_delta`, or `input_json_delta` whose `partial_json` fragments
concatenate to the call's input), `content_block_stop`; then `message_delta` (stop reason,
stop sequence and the final usage) and `message_stop`. A `ping` also goes out every
`PING_INTERVAL_S` seconds without output (a long prefill), so proxies and clients keep the
connection. An error after the stream began is an `error` event in Anthropic's shape.

A prompt that does not fit the context is a 400 "prompt is too long: N tokens > M maximum"
(Anthropic's wording, which Claude Code reads to compact its conversation).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Collection
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from app.engine.constrain import GrammarError
from app.engine.constrain.grammar import check_schema
from app.server.chat_core import (
    ChatInput,
    Finished,
    chat_events,
    prepare_chat_jobs,
    render_prompt,
    tool_request,
)
from app.server.context import Ctx, ServerContext
from app.server.errors import ANTHROPIC_PREFIX, APIError, bad_request
from app.server.generation import ChoiceState, Job, submit_jobs
from app.server.model_pool import model_context
from app.server.openapi import STREAMED_SSE, documented_body
from app.server.responses import respond
from app.server.schemas import SamplingFields
from app.server.schemas_messages import (
    REFUSED_FIELDS,
    CountTokensRequest,
    CustomTool,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
    parse,
    validation_400,
)
from app.server.sse import sse_named
from app.server.tools import prompt_messages
from app.tool_calls import CallArgs, CallStart, TextDelta, Tool, ToolChoice

router = APIRouter()

# the body is validated by `schemas_messages.parse`, for Anthropic's error wording
JSONObject = Annotated[dict[str, Any], Body()]

PING_INTERVAL_S = 10.0
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")  # Anthropic's rule for tool names
_FINISH = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
           "abort": "end_turn"}


def _text(blocks: list[Any], where: str) -> str:
    """The text of text blocks, joined with newlines (as chat completions joins parts).
    Raises APIError 400 for an image or document block."""
    texts = []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolReferenceBlock):
            texts.append(f"Tool {b.tool_name} is now available.")
        elif not isinstance(b, ThinkingBlock):
            raise _text_only(b, f"{where}.{j}")
    return "\n".join(texts)


def _text_only(block: Any, where: str) -> APIError:
    if getattr(block, "type", None) in ("image", "document"):
        return bad_request(f"{where}: '{block.type}' content blocks are not supported: "
                           "this model takes text only.")
    return bad_request(f"{where}: '{block.type}' content blocks are not allowed here.")


def template_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """`system` and `messages` as the chat template takes them (see `ChatInput`).

    The top-level `system` and the `system` messages before the first user or assistant
    message form one leading system turn; later `system` messages stay in place. A user
    message's runs of text blocks become user turns, each `tool_result` a tool turn (its
    function's name looked up from the `tool_use` it answers); an assistant's text and
    `tool_use` blocks one assistant turn with `tool_calls`. Raises APIError 400 for image
    or document blocks, blocks in the wrong role, and a conversation that ends with an
    assistant message (a prefill, which this server does not continue).
    """
    lead: list[str] = []
    if body.system:
        lead.append(body.system if isinstance(body.system, str) else _text(body.system, "system"))
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> tool name
    for i, m in enumerate(body.messages):
        where = f"messages.{i}.content"
        blocks: list[Any] = ([TextBlock(type="text", text=m.content)]
                             if isinstance(m.content, str) else m.content)
        if m.role == "system":
            text = _text(blocks, where)
            if out:
                out.append({"role": "system", "content": text})
            else:
                lead.append(text)
        elif m.role == "assistant":
            out.append(_assistant(blocks, where, names))
        else:
            out.extend(_user(blocks, where, names))
    if body.messages[-1].role == "assistant":
        raise bad_request(f"messages.{len(body.messages) - 1}: the conversation must end with "
                          "a user message (this server does not continue a prefilled "
                          "assistant message).")
    if lead:
        out.insert(0, {"role": "system", "content": "\n".join(lead)})
    return out


def _assistant(blocks: list[Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    texts, calls = [], []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolUseBlock):
            names[b.id] = b.name
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": b.input}})
        elif not isinstance(b, ThinkingBlock) and b.type != "redacted_thinking":
            raise _text_only(b, f"{where}.{j}")
    item: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        item["tool_calls"] = calls
        item["content"] = item["content"] or None
    return item


def _user(blocks: list[Any], where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            turns.append({"role": "user", "content": "\n".join(texts)})
            texts.clear()

    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolResultBlock):
            flush()
            content = b.content or ""
            text = content if isinstance(content, str) else _text(content, f"{where}.{j}.content")
            if b.is_error:
                text = f"Error: {text}"
            turns.append({"role": "tool", "tool_call_id": b.tool_use_id,
                          "name": names.get(b.tool_use_id, ""), "content": text})
        elif isinstance(b, ThinkingBlock) or b.type == "redacted_thinking":
            continue
        else:
            raise _text_only(b, f"{where}.{j}")
    flush()
    return turns or [{"role": "user", "content": ""}]


def referenced_tools(body: CountTokensRequest) -> set[str]:
    """The names in the `tool_reference` blocks of the messages' tool results."""
    return {r.tool_name for m in body.messages if isinstance(m.content, list)
            for b in m.content if isinstance(b, ToolResultBlock) and isinstance(b.content, list)
            for r in b.content if isinstance(r, ToolReferenceBlock)}


def parse_tools(value: list[dict[str, Any]] | None, loaded: Collection[str] = ()
                ) -> tuple[list[Tool], set[str]]:
    """(the custom tools offered, as functions; the names of server tools, not offered).

    A custom tool (no `type`, or `"custom"`) needs `name` (1 to 128 letters, digits, `_` or
    `-`, unique) and `input_schema` (a JSON Schema of type object). One with
    `defer_loading: true` is offered only once a tool search's result referenced it (its
    name in `loaded`), as Anthropic does. Raises APIError 400 naming `tools.N....`."""
    tools: list[Tool] = []
    server: set[str] = set()
    names: set[str] = set()
    for i, item in enumerate(value or []):
        kind = item.get("type")
        if kind not in (None, "custom"):
            if isinstance(item.get("name"), str):
                server.add(item["name"])
            continue
        try:
            spec = CustomTool.model_validate(item)
        except ValidationError as exc:
            raise validation_400(exc, ("tools", i)) from None
        if not _TOOL_NAME.match(spec.name):
            raise bad_request(f"tools.{i}.name: String should match pattern "
                              f"'{_TOOL_NAME.pattern}'")
        if spec.name in names:
            raise bad_request(f"tools: Tool names must be unique (duplicate: {spec.name!r})")
        names.add(spec.name)
        schema = _input_schema(spec.input_schema, f"tools.{i}.input_schema")
        if not spec.defer_loading or spec.name in loaded:
            tools.append(Tool(spec.name, spec.description, schema))
    return tools, server


def _input_schema(schema: dict[str, Any], where: str) -> dict[str, Any]:
    if schema.get("type") != "object":
        raise bad_request(f"{where}.type: Input should be 'object'")
    try:
        check_schema(schema)
    except GrammarError as exc:
        raise bad_request(f"{where}: {exc.reason}") from None
    return schema


def _tool_choice(body: CountTokensRequest, tools: list[Tool], server: set[str]
                 ) -> tuple[ToolChoice, bool]:
    """(the neutral tool choice, whether parallel calls are allowed)."""
    choice = body.tool_choice
    parallel = not getattr(choice, "disable_parallel_tool_use", None)
    if choice is None or isinstance(choice, ToolChoiceNone) or not tools:
        if isinstance(choice, (ToolChoiceAny, ToolChoiceTool)):
            named = getattr(choice, "name", None)
            if named in server:
                raise bad_request(f"tool_choice.name: '{named}' is a server tool, which this "
                                  "server does not run.")
            raise bad_request(f"tool_choice: '{choice.type}' needs at least one tool with an "
                              "input_schema in 'tools'.")
        return ToolChoice("auto" if choice is None and tools else "none"), parallel
    if isinstance(choice, ToolChoiceAny):
        return ToolChoice("required"), parallel
    if isinstance(choice, ToolChoiceTool):
        if choice.name in server:
            raise bad_request(f"tool_choice.name: '{choice.name}' is a server tool, which "
                              "this server does not run.")
        if choice.name not in {t.name for t in tools}:
            raise bad_request(f"tool_choice.name: no tool named '{choice.name}' is in "
                              "'tools'.")
        return ToolChoice("function", choice.name), parallel
    return ToolChoice("auto"), parallel


def chat_input(body: CountTokensRequest, max_tokens: int | None = None,
               sampling: SamplingFields | None = None) -> ChatInput:
    """The request as the shared chat path takes it. Raises APIError 400."""
    for name in REFUSED_FIELDS:
        if getattr(body, name) is not None:
            raise bad_request(f"{name}: this server does not support '{name}'.")
    tools, server = parse_tools(body.tools, referenced_tools(body))
    choice, parallel = _tool_choice(body, tools, server)
    fmt = (body.output_config.format if body.output_config else None) or body.output_format
    response_format = None
    if fmt is not None:
        if choice.mode != "none":
            raise bad_request("output_config.format: a JSON output format cannot be combined "
                              "with tools unless tool_choice is 'none'.")
        response_format = {"type": "json_schema",
                           "json_schema": {"name": "output", "schema": fmt.schema_}}
    return ChatInput(messages=template_messages(body), sampling=sampling or SamplingFields(),
                     max_tokens=max_tokens, tools=tools, tool_choice=choice,
                     parallel_tool_calls=parallel, response_format=response_format)


def _sampling(body: MessagesRequest) -> SamplingFields:
    # model_construct: the values are checked already; SamplingFields' OpenAI limits (4 stop
    # strings) are not Anthropic's
    return SamplingFields.model_construct(
        temperature=body.temperature, top_p=body.top_p or None, top_k=body.top_k,
        stop=[s for s in body.stop_sequences or [] if s])


async def prompt_ids(ctx: ServerContext, chat: ChatInput) -> list[int]:
    """The prompt's token ids, rendered as `prepare_chat_jobs` renders them."""
    messages, template_tools = prompt_messages(chat.messages, tool_request(ctx, chat))
    return await asyncio.to_thread(render_prompt, ctx.engine, messages, template_tools)


@router.post("/v1/messages/count_tokens", openapi_extra=documented_body(CountTokensRequest))
async def count_tokens(request: Request, ctx: Ctx, body: JSONObject) -> JSONResponse:
    req = parse(CountTokensRequest, body)
    ctx.resolve_model(req.model)
    ctx = await model_context(request, ctx, req.model)
    ids = await prompt_ids(ctx, chat_input(req))
    return JSONResponse({"input_tokens": len(ids)})


@router.post("/v1/messages", responses=STREAMED_SSE,
             openapi_extra=documented_body(MessagesRequest))
async def messages(request: Request, ctx: Ctx, body: JSONObject) -> Response:
    req: MessagesRequest = parse(MessagesRequest, body)
    model = ctx.resolve_model(req.model)
    ctx = await model_context(request, ctx, req.model)
    chat = chat_input(req, req.max_tokens, _sampling(req))
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    try:
        jobs = await prepare_chat_jobs(ctx, chat)
        streams = submit_jobs(ctx.engine, jobs, msg_id, "messages")
    except APIError as exc:
        if exc.code != "context_length_exceeded":
            raise
        n = len(await prompt_ids(ctx, chat))
        raise bad_request(f"prompt is too long: {n} tokens > {ctx.context_length - 1} "
                          "maximum") from exc
    head = {"id": msg_id, "type": "message", "role": "assistant", "model": model}
    events = (_events(ctx, streams, jobs[0], head, req.max_tokens) if req.stream else None)
    return await respond(request, ctx, streams, jobs, events,
                         lambda states: _message(head, states[0], req.max_tokens))


def _event(obj: dict[str, Any]) -> bytes:
    """One streamed event: Anthropic names each after its data's `type`."""
    return sse_named(obj, obj["type"])


def _stop_reason(state: ChoiceState, max_tokens: int) -> str:
    if state.finish_reason == "stop" and state.stop_sequence is not None:
        return "stop_sequence"
    if state.finish_reason == "length" and state.completion_tokens < max_tokens:
        return "model_context_window_exceeded"
    return _FINISH.get(state.finish_reason or "stop", "end_turn")


def _usage(state: ChoiceState) -> dict[str, int]:
    cached = state.cached_tokens
    return {"input_tokens": state.prompt_tokens - cached,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": state.completion_tokens}


def _message(head: dict[str, Any], state: ChoiceState, max_tokens: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if state.text:
        content.append({"type": "text", "text": state.text})
    content += [{"type": "tool_use", "id": f"toolu_{c.uid}", "name": c.name,
                 "input": c.arguments_object()} for c in state.tool_calls]
    return {**head, "content": content, "stop_reason": _stop_reason(state, max_tokens),
            "stop_sequence": state.stop_sequence, "usage": _usage(state)}


async def _events(ctx: ServerContext, streams: list[Any], job: Job, head: dict[str, Any],
                  max_tokens: int) -> AsyncIterator[bytes]:
    """The named events of a streamed message (see the module docstring)."""
    start = {**head, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": len(job.prompt_ids), "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 0, "output_tokens": 0}}
    yield _event({"type": "message_start", "message": start})
    yield _event({"type": "ping"})
    index, kind = -1, None  # the open block's index and type

    def stop_block() -> bytes:
        return _event({"type": "content_block_stop", "index": index})

    try:
        async for e in _with_pings(chat_events(ctx, streams, job), PING_INTERVAL_S):
            if e is None:
                yield _event({"type": "ping"})
            elif isinstance(e, TextDelta):
                if not e.text:
                    continue
                if kind != "text":
                    if kind is not None:
                        yield stop_block()
                    index, kind = index + 1, "text"
                    yield _event({
                        "type": "content_block_start", "index": index,
                        "content_block": {"type": "text", "text": ""}})
                yield _event({
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": e.text}})
            elif isinstance(e, CallStart):
                if kind is not None:
                    yield stop_block()
                index, kind = index + 1, "tool_use"
                yield _event({
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": f"toolu_{e.uid}",
                                      "name": e.name, "input": {}}})
            elif isinstance(e, CallArgs):
                yield _event({
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": e.fragment}})
            elif isinstance(e, Finished):
                if kind is not None:
                    yield stop_block()
                state = e.state
                yield _event({
                    "type": "message_delta",
                    "delta": {"stop_reason": _stop_reason(state, max_tokens),
                              "stop_sequence": state.stop_sequence},
                    "usage": _usage(state)})
                yield _event({"type": "message_stop"})
    except Exception as exc:
        if not isinstance(exc, APIError):
            exc = APIError(500, f"Internal server error: {type(exc).__name__}: {exc}",
                           "server_error")
        yield _event(exc.body(ANTHROPIC_PREFIX))


async def _with_pings(events: AsyncIterator[Any], interval: float) -> AsyncIterator[Any]:
    """`events`, with None yielded whenever `interval` seconds pass without one. Closing
    this iterator closes `events` (which cancels the engine stream)."""
    it = aiter(events)
    pending: asyncio.Future[Any] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(it))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await it.aclose()  # type: ignore[attr-defined]
