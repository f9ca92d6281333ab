"""`POST /v1/chat/completions`: messages through the model's chat template, then generation.

Streaming emits, per choice, a first delta carrying the role, content deltas, and a last
chunk with an empty delta and the `finish_reason`; with `stream_options.include_usage` every
chunk has `"usage": null` and a final chunk with `choices: []` carries the usage. Then
`data: [DONE]`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from app.server.context import Ctx, ServerContext
from app.server.errors import bad_request
from app.server.generation import (
    SSE_DONE,
    ChoiceState,
    ClientDisconnected,
    Job,
    cancel_all,
    check_prompt,
    choice_seed,
    collect,
    event_stream,
    merge_outputs,
    n_vocab,
    sampling_params,
    sse,
    stream_error,
    submit_jobs,
    until_disconnect,
    usage,
)
from app.server.logprobs import chat_content
from app.server.schemas import ChatCompletionRequest, ChatMessage

log = logging.getLogger("tandem.server")
router = APIRouter()

ROLE_ALIASES = {"developer": "system"}


def _message_text(msg: ChatMessage, i: int) -> str:
    content = msg.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"Content part type '{part.type}' is not supported; this model takes text only.",
                param=f"messages[{i}].content[{j}].type",
            )
        texts.append(part.text)
    return "\n".join(texts)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Request messages as the chat template takes them: `[{"role", "content": str}]`.

    Raises APIError 400 for non-text content parts.
    """
    return [
        {"role": ROLE_ALIASES.get(m.role, m.role), "content": _message_text(m, i)}
        for i, m in enumerate(messages)
    ]


def render_prompt(engine: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the templated conversation; 400 if the template rejects it."""
    try:
        return list(engine.apply_chat_template(messages, add_generation_prompt=True))
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as exc:
        raise bad_request(f"The chat template rejected the messages: {exc}", "messages") from exc


def _fingerprint(ctx: ServerContext) -> str:
    return f"tandem-{getattr(ctx.engine, 'backend_name', 'engine')}"


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, ctx: Ctx) -> Response:
    model = ctx.resolve_model(body.model)
    prompt_ids = render_prompt(ctx.engine, template_messages(body.messages))
    check_prompt(prompt_ids, ctx.context_length, n_vocab(ctx.engine), "messages")
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", "top_logprobs")
    top = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = body.max_completion_tokens or body.max_tokens
    jobs = [
        Job(
            index=i,
            prompt_index=0,
            prompt_ids=prompt_ids,
            params=sampling_params(
                body,
                max_tokens=max_tokens,
                prompt_len=len(prompt_ids),
                context_length=ctx.context_length,
                seed=choice_seed(body.seed, i),
                logprobs=top,
            ),
        )
        for i in range(body.n or 1)
    ]
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    streams = submit_jobs(ctx.engine, jobs, rid, "messages")
    head = {
        "id": rid,
        "created": created,
        "model": model,
        "system_fingerprint": _fingerprint(ctx),
    }
    if body.stream:
        events = _chunks(ctx, streams, jobs, head, body.include_usage, top)
        response = event_stream(events)
        response.background = BackgroundTask(cancel_all, streams)
        return response
    try:
        states = await until_disconnect(request, collect(streams, jobs, ctx.metrics))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        cancel_all(streams)
    return JSONResponse(_completion(ctx, head, states, top))


def _completion(
    ctx: ServerContext, head: dict[str, Any], states: list[ChoiceState], top: int | None
) -> dict[str, Any]:
    choices = []
    for s in states:
        logprobs = None
        if top is not None:
            logprobs = {"content": chat_content(s.logprobs, ctx.engine.tokenizer, top)}
        choices.append(
            {
                "index": s.job.index,
                "message": {"role": "assistant", "content": s.text, "refusal": None},
                "logprobs": logprobs,
                "finish_reason": s.finish_reason,
            }
        )
    return {
        "id": head["id"],
        "object": "chat.completion",
        **head,
        "choices": choices,
        "usage": usage(states),
    }


async def _chunks(
    ctx: ServerContext,
    streams: list[Any],
    jobs: list[Job],
    head: dict[str, Any],
    include_usage: bool,
    top: int | None,
) -> AsyncIterator[str]:
    base = {"id": head["id"], "object": "chat.completion.chunk", **head}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> str:
        body: dict[str, Any] = {
            **base,
            "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    states = [ChoiceState(job) for job in jobs]
    outputs = merge_outputs(streams, ctx.metrics)
    try:
        for job in jobs:
            yield chunk(job.index, {"role": "assistant", "content": ""})
        async for pos, out in outputs:
            state = states[pos]
            state.add(out)
            lp = None
            if top is not None and out.logprobs:
                lp = {"content": chat_content(out.logprobs, ctx.engine.tokenizer, top)}
            if out.text or lp is not None:
                yield chunk(state.job.index, {"content": out.text}, lp=lp)
            if out.finished:
                yield chunk(state.job.index, {}, finish=out.finish_reason)
        if include_usage:
            yield sse({**base, "choices": [], "usage": usage(states)})
    except Exception as exc:
        log.exception("chat stream %s failed", head["id"])
        yield stream_error(exc)
    finally:
        await outputs.aclose()
    yield SSE_DONE
