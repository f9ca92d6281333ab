"""`POST /v1/chat/completions`: messages through the model's chat template, then generation.

Streaming emits, per choice, a first delta carrying the role, content deltas, and a last
chunk with an empty delta and the `finish_reason`; with `stream_options.include_usage` every
chunk has `"usage": null` and a final chunk with `choices: []` carries the usage. Then
`data: [DONE]`.

`prediction` (OpenAI's Predicted Outputs) and `speculative` (tandem's opt-out) steer
speculative decoding only; see `app.server.schemas.SamplingFields`. `response_format`
constrains the reply (`app.server.response_format`). `tools`, `tool_choice` and
`parallel_tool_calls` (`app.server.tools`) offer functions: the model's template shows them,
a grammar enforces calls in the model's native format, and the reply's calls are parsed
once (`app.tool_calls`) into `message.tool_calls` (`finish_reason: "tool_calls"`); streamed,
each call is a `tool_calls` delta with `index`, `id`, `type` and `function.name` once, then
`function.arguments` fragments that concatenate to the collected reply's arguments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.server.chat_core import ChatInput, prepare_chat_jobs
from app.server.context import Ctx, ServerContext
from app.server.errors import bad_request
from app.server.generation import (
    ChoiceState,
    Job,
    request_context,
    submit_jobs,
    usage,
)
from app.server.logprobs import chat_content
from app.server.model_pool import model_context
from app.server.openapi import STREAMED_SSE
from app.server.responses import (
    Choice,
    envelope,
    respond,
    response_head,
    stream_chunks,
)
from app.server.schemas import ChatCompletionRequest, ChatMessage
from app.server.tools import (
    history_calls,
    parse_parallel,
    parse_tool_choice,
    parse_tools,
    refuse_deprecated,
)
from app.tool_calls import CallStart, TextDelta

router = APIRouter()

ROLE_ALIASES = {"developer": "system"}


def _message_text(msg: ChatMessage, i: int) -> str:
    content = msg.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not content:  # OpenAI's wording and code for an empty parts array
        raise bad_request(
            f"Invalid 'messages[{i}].content': empty array. Expected an array with minimum "
            "length 1, but got an empty array instead.",
            param=f"messages[{i}].content", code="empty_array",
        )
    texts = []
    for j, part in enumerate(content):
        if part.type != "text":
            raise bad_request(
                f"Content part type '{part.type}' is not supported; this model takes text only.",
                param=f"messages[{i}].content[{j}].type",
            )
        if part.text is None:
            where = f"messages[{i}].content[{j}].text"
            raise bad_request(f"Missing required parameter: '{where}'.", param=where)
        texts.append(part.text)
    return "\n".join(texts)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Request messages as the chat template takes them: `[{"role", "content": str}]`;
    an assistant message with `tool_calls` keeps them (arguments as objects; content None
    when empty), a `tool` message carries `tool_call_id` and the called function's `name`.

    Raises APIError 400 for an empty parts array (code `empty_array`), a text part without
    `text`, non-text content parts, malformed `tool_calls`, and a `tool` message without
    `tool_call_id`.
    """
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for tool messages
    for i, m in enumerate(messages):
        item: dict[str, Any] = {"role": ROLE_ALIASES.get(m.role, m.role),
                                "content": _message_text(m, i)}
        if m.tool_calls is not None:
            if m.role != "assistant":
                raise bad_request(f"'messages[{i}].tool_calls' is only allowed on assistant "
                                  "messages.", param=f"messages[{i}].tool_calls",
                                  code="invalid_value")
            item["tool_calls"] = history_calls(m.tool_calls, i)
            item["content"] = item["content"] or None
            names.update((c["id"], c["function"]["name"]) for c in item["tool_calls"])
        if m.role == "tool":
            if m.tool_call_id is None:
                where = f"messages[{i}].tool_call_id"
                raise bad_request(f"Missing required parameter: '{where}'.", param=where,
                                  code="missing_required_parameter")
            item["tool_call_id"] = m.tool_call_id
            item["name"] = m.name or names.get(m.tool_call_id, "")
        out.append(item)
    return out


@router.post("/v1/chat/completions", responses=STREAMED_SSE)
async def chat_completions(body: ChatCompletionRequest, request: Request, ctx: Ctx) -> Response:
    model = ctx.resolve_model(body.model)
    ctx = await model_context(request, ctx, body.model)
    refuse_deprecated(body)
    tools = parse_tools(body.tools)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", "top_logprobs")
    top = (body.top_logprobs or 0) if body.logprobs else None
    jobs = await prepare_chat_jobs(ctx, ChatInput(
        messages=template_messages(body.messages), sampling=body,
        max_tokens=body.max_completion_tokens or body.max_tokens, tools=tools,
        tool_choice=parse_tool_choice(body.tool_choice, tools),
        parallel_tool_calls=parse_parallel(body.parallel_tool_calls),
        response_format=body.response_format, n=body.n or 1, logprobs=top,
        num_ctx=request_context(body.num_ctx, ctx.context_length)))
    head = response_head(ctx, "chatcmpl", model)
    streams = submit_jobs(ctx.engine, jobs, head["id"], "messages")
    events = _chunks(ctx, streams, jobs, head, body.include_usage, top) if body.stream else None
    return await respond(request, ctx, streams, jobs, events,
                         lambda states: _completion(ctx, head, states, top))


def _completion(
    ctx: ServerContext, head: dict[str, Any], states: list[ChoiceState], top: int | None
) -> dict[str, Any]:
    choices = []
    for s in states:
        logprobs = None
        if top is not None:
            logprobs = {"content": chat_content(s.logprobs, ctx.engine.tokenizer, top)}
        message: dict[str, Any] = {"role": "assistant", "content": s.text, "refusal": None}
        if s.tool_calls:
            message["content"] = s.text or None
            message["tool_calls"] = [
                {"id": f"call_{c.uid}", "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in s.tool_calls]
        choices.append(
            {
                "index": s.job.index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": s.finish_reason,
            }
        )
    return {**envelope(head, "chat.completion"), "choices": choices, "usage": usage(states)}


def _chunks(
    ctx: ServerContext,
    streams: list[Any],
    jobs: list[Job],
    head: dict[str, Any],
    include_usage: bool,
    top: int | None,
) -> AsyncIterator[bytes]:
    def choice(index: int, delta: dict[str, Any], finish: str | None = None,
               lp: Any = None) -> Choice:
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}

    def content(pos: int, state: ChoiceState, out: Any) -> Choice | list[Choice] | str | None:
        if state.parser is not None:
            return _tool_deltas(state, out, top, choice, ctx.engine.tokenizer)
        if top is not None and out.logprobs:
            lp = {"content": chat_content(out.logprobs, ctx.engine.tokenizer, top)}
            return choice(state.job.index, {"content": out.text}, lp=lp)
        return out.text or None  # the text alone: `text_choice`

    return stream_chunks(
        ctx, streams, jobs, envelope(head, "chat.completion.chunk"),
        include_usage,
        opening=lambda pos, job: choice(job.index, {"role": "assistant", "content": ""}),
        content=content,
        last=lambda state: choice(state.job.index, {}, finish=state.finish_reason),
        text_choice=lambda index, text: choice(index, {"content": text}),
    )


def _tool_deltas(state: ChoiceState, out: Any, top: int | None, choice: Any,
                 tokenizer: Any) -> list[Choice]:
    """The chunks of one output of a choice that may call tools: content deltas, and per
    call `{"index", "id", "type", "function": {"name", "arguments": ""}}` once, then
    `{"index", "function": {"arguments": fragment}}`. Logprobs ride on the first chunk."""
    index = state.job.index
    deltas: list[dict[str, Any]] = []
    for e in state.events:
        if isinstance(e, TextDelta):
            deltas.append({"content": e.text})
        elif isinstance(e, CallStart):
            deltas.append({"tool_calls": [{"index": e.index, "id": f"call_{e.uid}",
                                           "type": "function",
                                           "function": {"name": e.name, "arguments": ""}}]})
        else:
            deltas.append({"tool_calls": [{"index": e.index,
                                           "function": {"arguments": e.fragment}}]})
    lp = None
    if top is not None and out.logprobs:
        lp = {"content": chat_content(out.logprobs, tokenizer, top)}
    chunks = [choice(index, d) for d in deltas]
    if lp is not None:
        if chunks:
            chunks[0]["logprobs"] = lp
        else:
            chunks.append(choice(index, {}, lp=lp))
    return chunks
