"""`POST /v1/responses`: OpenAI's Responses API, stateless, over the shared chat path.

The request (`app.server.responses_input`) becomes a `ChatInput`; the reply is a response
object: `{"id": "resp_...", "object": "response", "created_at", "status": "completed" |
"incomplete" (`incomplete_details.reason` "max_output_tokens" when the reply hit
`max_output_tokens` or the context's end), "model", "output": [items], "usage", ...}` plus
the request's parameters echoed as OpenAI does. Output items, in the order the model wrote
them: `{"type": "message", "id": "msg_...", "role": "assistant", "status", "content":
[{"type": "output_text", "text", "annotations": []}]}` for text (one, possibly empty, when
there is no call) and `{"type": "function_call", "id": "fc_...", "call_id": "call_...",
"name", "arguments", "status", "namespace"?}` per call.

Streamed (`stream: true`), each event is `event: <type>` + `data: {json}` with a
`sequence_number` counting from 0: `response.created`, `response.in_progress`; per message
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
..., `response.output_text.done`, `response.content_part.done`, `response.output_item.done`;
per call `response.output_item.added`, `response.function_call_arguments.delta` ...,
`response.function_call_arguments.done`, `response.output_item.done`; then
`response.completed` (or `response.incomplete`) with the whole response. An error after the
stream began is an `error` event (`code`, `message`, `param`) followed by `response.failed`
(`response.error`: `{"code": "server_error", "message"}`). No `[DONE]` line (OpenAI sends
none on this route). `previous_response_id` is a 400: nothing is stored.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.server.chat_core import ChatEvent, ChatInput, Finished, chat_events, prepare_chat_jobs
from app.server.context import Ctx, ServerContext
from app.server.errors import APIError
from app.server.generation import ChoiceState, submit_jobs
from app.server.model_pool import model_context
from app.server.openapi import STREAMED_SSE
from app.server.responses import respond
from app.server.responses_input import (
    ResponsesRequest,
    ToolSet,
    parse_tool_choice,
    parse_tools,
    refuse_unserved,
    renamed,
    response_format,
    template_messages,
)
from app.server.sse import sse_named
from app.server.tools import parse_parallel
from app.tool_calls import CallArgs, CallStart, TextDelta

log = logging.getLogger("tandem.server")
router = APIRouter()

Event = dict[str, Any]


@router.post("/v1/responses", responses=STREAMED_SSE)
async def create_response(body: ResponsesRequest, request: Request, ctx: Ctx) -> Response:
    model = ctx.resolve_model(body.model)
    ctx = await model_context(request, ctx, body.model)
    refuse_unserved(body)
    tools = parse_tools(body.tools)
    chat = ChatInput(
        messages=template_messages(body, tools), sampling=body.sampling(),
        max_tokens=body.max_output_tokens, tools=tools.tools,
        tool_choice=parse_tool_choice(body.tool_choice, tools),
        parallel_tool_calls=parse_parallel(body.parallel_tool_calls),
        response_format=response_format(body.text), param="input")
    try:
        jobs = await prepare_chat_jobs(ctx, chat)
    except APIError as exc:
        raise renamed(exc) from None
    reply = Reply(body, model, tools)
    streams = submit_jobs(ctx.engine, jobs, reply.id, "input")
    events = None
    if body.stream:
        events = reply.stream(ctx, chat_events(ctx, streams, jobs[0]))
    return await respond(request, ctx, streams, jobs, events, lambda s: reply.collected(s[0]))


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Reply:
    """One response: its id, the echo of the request, and its output items as the model's
    events arrive (`feed`), each change also an event of the stream."""

    def __init__(self, body: ResponsesRequest, model: str, tools: ToolSet):
        self.id = _id("resp")
        self.created_at = int(time.time())
        self.body = body
        self.model = model
        self.tools = tools
        self.output: list[dict[str, Any]] = []
        self.seq = 0
        self._open: int | None = None  # output index of the item being written
        self._calls: dict[int, int] = {}  # call index -> output index

    # the response object

    def response(self, status: str, state: ChoiceState | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object with `status` (usage and completion from `state`)."""
        b = self.body
        usage = None
        if state is not None:
            usage = {"input_tokens": state.prompt_tokens,
                     "input_tokens_details": {"cached_tokens": state.cached_tokens,
                                              "cache_write_tokens": 0},
                     "output_tokens": state.completion_tokens,
                     "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": state.prompt_tokens + state.completion_tokens}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": False, "error": error,
            "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                                   else None),
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
            "max_tool_calls": None, "model": self.model, "output": self.output,
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
            "store": False, "temperature": b.temperature,
            "text": b.text if b.text is not None else {"format": {"type": "text"}},
            "tool_choice": b.tool_choice if b.tool_choice is not None else "auto",
            "tools": b.tools or [], "top_p": b.top_p, "truncation": "disabled",
            "usage": usage, "user": b.user, "metadata": b.metadata or {},
            **({"completed_at": int(time.time())} if status == "completed" else {}),
        }

    def collected(self, state: ChoiceState) -> dict[str, Any]:
        """The whole response of a collected (non-streamed) choice."""
        events: list[ChatEvent] = [TextDelta(state.text)] if state.text else []
        for i, call in enumerate(state.tool_calls):
            events += [CallStart(i, call.uid, call.name), CallArgs(i, call.arguments)]
        for e in events:
            self.feed(e)
        self.finish(state)
        return self.response(_status(state), state)

    # output items, as events

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def feed(self, e: ChatEvent) -> list[Event]:
        """The stream events for one model event (text or call); updates `output`."""
        if isinstance(e, TextDelta):
            if not e.text:
                return []
            out = []
            if self._open is None or self.output[self._open]["type"] != "message":
                out = self._close("completed") + self._open_message()
            index = self._open
            assert index is not None
            item = self.output[index]
            item["content"][0]["text"] += e.text
            return [*out, self._event("response.output_text.delta", item_id=item["id"],
                                      output_index=index, content_index=0, delta=e.text,
                                      logprobs=[])]
        if isinstance(e, CallStart):
            out = self._close("completed")
            namespace, name = self.tools.split(e.name)
            item: dict[str, Any] = {"id": _id("fc"), "type": "function_call",
                                    "status": "in_progress", "arguments": "",
                                    "call_id": f"call_{e.uid}", "name": name}
            if namespace is not None:
                item["namespace"] = namespace
            self.output.append(item)
            self._open = self._calls[e.index] = len(self.output) - 1
            return [*out, self._event("response.output_item.added",
                                      output_index=self._open, item=dict(item))]
        assert isinstance(e, CallArgs)
        index = self._calls[e.index]
        item = self.output[index]
        item["arguments"] += e.fragment
        return [self._event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=index, delta=e.fragment)]

    def finish(self, state: ChoiceState) -> list[Event]:
        """The events that close the reply's last item (an empty message if there was
        none)."""
        out = [] if self.output else self._open_message()
        return out + self._close("incomplete" if _status(state) == "incomplete" else
                                 "completed")

    def _open_message(self) -> list[Event]:
        item = {"id": _id("msg"), "type": "message", "status": "in_progress",
                "role": "assistant", "content": []}
        self.output.append(item)
        self._open = index = len(self.output) - 1
        added = self._event("response.output_item.added", output_index=index,
                            item={**item, "content": []})
        part = {"type": "output_text", "text": "", "annotations": []}
        item["content"].append(part)
        return [added, self._event("response.content_part.added", item_id=item["id"],
                                   output_index=index, content_index=0, part=dict(part))]

    def _close(self, status: str) -> list[Event]:
        index, self._open = self._open, None
        if index is None:
            return []
        item = self.output[index]
        item["status"] = status
        if item["type"] == "message":
            part = item["content"][0]
            events = [
                self._event("response.output_text.done", item_id=item["id"],
                            output_index=index, content_index=0, text=part["text"],
                            logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"],
                            output_index=index, content_index=0, part=dict(part)),
            ]
        else:
            events = [self._event("response.function_call_arguments.done",
                                  item_id=item["id"], output_index=index,
                                  arguments=item["arguments"])]
        return [*events, self._event("response.output_item.done", output_index=index,
                                     item=item)]

    # streaming

    async def stream(self, ctx: ServerContext, events: AsyncIterator[ChatEvent]
                     ) -> AsyncIterator[bytes]:
        """The server-sent events of the streamed response (see the module docstring)."""

        def frame(event: Event) -> bytes:
            return sse_named(event, event["type"])

        yield frame(self._event("response.created", response=self.response("in_progress")))
        yield frame(self._event("response.in_progress",
                                response=self.response("in_progress")))
        try:
            async for e in events:
                if isinstance(e, Finished):
                    for event in self.finish(e.state):
                        yield frame(event)
                    status = _status(e.state)
                    yield frame(self._event(f"response.{status}",
                                            response=self.response(status, e.state)))
                    break
                for event in self.feed(e):
                    yield frame(event)
        except Exception as exc:
            if not ctx.stopping:
                log.exception("stream %s failed", self.id)
            message = (exc.message if isinstance(exc, APIError)
                       else f"Internal server error: {type(exc).__name__}: {exc}")
            code = (exc.code if isinstance(exc, APIError) else None) or "server_error"
            param = exc.param if isinstance(exc, APIError) else None
            yield frame(self._event("error", code=code, message=message, param=param))
            yield frame(self._event("response.failed", response=self.response(
                "failed", error={"code": "server_error", "message": message})))
        finally:
            await events.aclose()  # type: ignore[attr-defined]


def _status(state: ChoiceState) -> str:
    return "incomplete" if state.finish_reason == "length" else "completed"
