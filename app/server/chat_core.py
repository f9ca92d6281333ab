"""The one chat request path every API shares: neutral input in, neutral events out.

Each API (OpenAI chat, Responses, Anthropic Messages, Ollama) parses its own request shape
into a `ChatInput` (template messages, neutral `Tool`s, a `SamplingFields` holding the
sampling fields it maps, OpenAI's `response_format` shape for a JSON constraint) and renders
its own response. Between the two, this module and `app.server.generation` do the rest once:
the chat template, the prompt checks, the grammar (tools or response format), sampling
parameters, submission, cancellation, metrics and server shutdown.

`prepare_chat_jobs` turns a `ChatInput` into engine `Job`s; `submit_jobs` submits them;
`chat_events` turns one submitted choice into `TextDelta` / `CallStart` / `CallArgs`
events (`app.tool_calls`) and a final `Finished`; a collected (non-streamed) reply goes
through `app.server.responses.respond`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jinja2

from app.prompts import call_format, chat_prompt_ids
from app.server.context import ServerContext
from app.server.errors import bad_request, shutting_down
from app.server.generation import (
    ChoiceState,
    Job,
    check_prompt,
    choice_seed,
    merge_outputs,
    n_vocab,
    sampling_params,
)
from app.server.prediction import prediction_ids
from app.server.response_format import response_grammar
from app.server.schemas import SamplingFields
from app.server.tools import ToolRequest, compile_tools, prompt_messages
from app.tool_calls import CallArgs, CallStart, TextDelta, Tool, ToolChoice
from models.chat_template import TemplateRaised


@dataclass
class ChatInput:
    """One chat request, whatever API it came in.

    `messages`: as the chat template takes them, `[{"role": "system"|"user"|"assistant"|
    "tool", "content": str | None}]`, an assistant's calls as `"tool_calls": [{"id", "type":
    "function", "function": {"name", "arguments": dict}}]`, a tool result with
    `"tool_call_id"` and the function's `"name"`. `tool_choice` None means "auto" with
    tools, "none" without. `sampling` holds temperature, top_p, top_k, min_p, seed, stop,
    penalties, `prediction` and `speculative` (fields left None take the model's defaults).
    `max_tokens` None: until EOS or the context's end; larger than the room left: capped.
    `response_format`: OpenAI's shape (`{"type": "json_object"}` or `{"type":
    "json_schema", "json_schema": {"name", "schema"}}`) or None. `param` names the field
    a prompt error points at. `num_ctx`: the context this request's sequence may hold, at
    most the served one (`app.server.generation.request_context`; None: the served
    context); `num_ctx_param` names the field that set it, for the prompt error.
    """

    messages: list[dict[str, Any]]
    sampling: SamplingFields = field(default_factory=SamplingFields)
    max_tokens: int | None = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: Any = None
    n: int = 1
    logprobs: int | None = None
    param: str = "messages"
    num_ctx: int | None = None
    num_ctx_param: str = "num_ctx"


@dataclass
class Finished:
    """The last event of a choice: its state (text, `tool_calls`, `finish_reason` — "stop",
    "length", "tool_calls" or "abort" — and the token counts)."""

    state: ChoiceState


ChatEvent = TextDelta | CallStart | CallArgs | Finished


def render_prompt(engine: Any, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None = None, param: str = "messages"
                  ) -> list[int]:
    """Token ids of the templated conversation.

    Raises APIError 400 (`param`) if the template rejects them: when the template called
    `raise_exception(message)` (e.g. roles out of the order the model was trained on) the
    400's message is exactly that message, as vLLM and transformers report it.
    """
    try:
        return list(chat_prompt_ids(engine.tokenizer, messages, tools=tools))
    except TemplateRaised as exc:
        raise bad_request(exc.message, param) from exc
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as exc:
        raise bad_request(f"The chat template rejected the messages: {exc}", param) from exc


def tool_request(ctx: ServerContext, chat: ChatInput) -> ToolRequest:
    """The request's tools in the served model's call format."""
    choice = chat.tool_choice or ToolChoice("auto" if chat.tools else "none")
    return ToolRequest(chat.tools, choice, chat.parallel_tool_calls,
                       call_format(ctx.engine.tokenizer))


async def prepare_chat_jobs(ctx: ServerContext, chat: ChatInput) -> list[Job]:
    """One `Job` per choice (`chat.n`), ready for `submit_jobs`.

    Raises APIError 400: tools together with a response format (unless tool_choice is
    "none"), a template that rejects the messages, an empty prompt or one that fills the
    context (`context_length_exceeded`), a malformed prediction or response format, tool
    parameters the grammar engine cannot enforce, sampling values the engine refuses.
    """
    tools = tool_request(ctx, chat)
    if tools.choice.mode != "none" and chat.response_format is not None:
        raise bad_request("'response_format' cannot be combined with 'tools' unless "
                          "'tool_choice' is 'none'.", param="response_format",
                          code="invalid_value")
    messages, template_tools = prompt_messages(chat.messages, tools)
    prompt_ids = render_prompt(ctx.engine, messages, template_tools, chat.param)
    limit = ctx.context_length if chat.num_ctx is None else min(chat.num_ctx, ctx.context_length)
    check_prompt(prompt_ids, limit, n_vocab(ctx.engine), chat.param,
                 chat.num_ctx_param if limit < ctx.context_length else None)
    prediction = prediction_ids(ctx.engine, chat.sampling.prediction, ctx.context_length)
    grammar = await response_grammar(ctx.engine, chat.response_format)
    if tools.choice.mode != "none":
        grammar = await compile_tools(ctx.engine, tools)
    parser = tools.parser if chat.tools else None
    return [
        Job(index=i, prompt_index=0, prompt_ids=prompt_ids,
            params=sampling_params(
                chat.sampling, max_tokens=chat.max_tokens, prompt_len=len(prompt_ids),
                context_length=limit, seed=choice_seed(chat.sampling.seed, i),
                logprobs=chat.logprobs, prediction=prediction, defaults=ctx.defaults,
                vocab=n_vocab(ctx.engine), grammar=grammar),
            tool_parser=parser)
        for i in range(chat.n)
    ]


async def chat_events(ctx: ServerContext, streams: list[Any], job: Job
                      ) -> AsyncIterator[ChatEvent]:
    """The events of one submitted choice (`streams` holds its one stream): text and tool
    call events as the engine produces them, then `Finished`.

    Closing the iterator early (client gone) cancels the stream. Raises APIError: an engine
    refusal delivered through the stream (`app.server.generation.api_error`), or 503
    `server_shutting_down` when the server stopped before the reply ended.
    """
    state = ChoiceState(job)
    outputs = merge_outputs(streams, ctx.metrics)
    try:
        async for _, out in outputs:
            if ctx.stopping and out.finished and out.finish_reason == "abort":
                raise shutting_down()
            state.add(out)
            if state.parser is not None:
                for event in state.events:
                    yield event
            elif out.text:
                yield TextDelta(out.text)
            if out.finished:
                yield Finished(state)
    finally:
        await outputs.aclose()
