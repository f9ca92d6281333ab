"""Ollama's native API: `GET /api/version`, `GET /api/tags`, `POST /api/show`,
`GET /api/ps`, `POST /api/chat`, `POST /api/generate`, and `GET`/`HEAD /` ("Ollama is
running", what clients probe). Shapes follow Ollama's `api/types.go`; requests are
translated in `app.server.ollama_schemas`, model facts come from `app.server.ollama_models`,
generation goes through the shared chat path (`app.server.chat_core`).

Replies stream as NDJSON (`application/x-ndjson`) unless the request says `"stream":
false` (Ollama's default is to stream): one object per piece of text, `{"model",
"created_at", "message": {"role": "assistant", "content"}, "done": false}` (generate:
`"response"` instead of `"message"`), then a last object with `"done": true`,
`"done_reason"` ("stop", "length"; a reply with tool calls ends "stop" as in Ollama) and the
metrics below. A collected reply is that last object with the whole text. Tool calls come
whole, once each is complete, as `"tool_calls": [{"function": {"index", "name",
"arguments": object}}]` on a `"done": false` object (no `id`: Zed reads a call as a
one-key object). An error after streaming began is a last line `{"error": message}`.

Metrics (nanoseconds, from the engine's `RequestMetrics`): `total_duration` (request
received to reply done), `load_duration` (received to handed to the engine: templating,
grammar; the model is always loaded), `prompt_eval_count` (prompt tokens, cached ones
included), `prompt_eval_duration` (scheduled to first token), `eval_count` (reply tokens),
`eval_duration` (first token to the end).

An empty chat (no messages) or an empty generate prompt (no suffix) is a load request,
answered at once with `"done_reason": "load"` as Ollama does (with a model pool it loads
the model; with `keep_alive: 0` it unloads it, as `ollama stop` asks). `keep_alive` sets
how long the model stays loaded after the reply (`app.server.model_pool`); a one-model
server checks it and keeps its model.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.prompts import raw_prompt_ids
from app.server import ollama_pool
from app.server.chat_core import ChatInput, chat_events, prepare_chat_jobs
from app.server.context import Ctx, ServerContext
from app.server.errors import APIError, bad_request
from app.server.fim import fim_prompt_ids
from app.server.generation import (
    ChoiceState,
    Job,
    check_prompt,
    choice_seed,
    n_vocab,
    sampling_params,
    submit_jobs,
)
from app.server.model_pool import model_context
from app.server.ollama_models import facts, now_iso, resolve
from app.server.ollama_schemas import (
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaMessage,
    OllamaShowRequest,
    check_common,
    ollama_context,
    parse_body,
    refuse_images,
    response_format,
    sampling_options,
)
from app.server.openapi import PLAIN_TEXT, STREAMED_NDJSON, documented_body
from app.server.response_format import response_grammar
from app.server.responses import respond
from app.server.schemas import SamplingFields
from app.server.tools import parse_tools
from app.tool_calls import CallArgs, CallStart, TextDelta, ToolCall

log = logging.getLogger("tandem.server")
router = APIRouter()

# The Ollama API version whose routes and fields tandem answers like (Copilot's Ollama
# provider needs >= 0.6.4).
OLLAMA_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"
ROLES = ("system", "user", "assistant", "tool")
# a model that stays loaded is listed by Ollama with this far-off expiry
FOREVER = ollama_pool.FOREVER
DONE_REASONS = {"tool_calls": "stop"}


# one route for both methods, so a 405 on `/` lists both in `Allow`
@router.api_route("/", methods=["GET", "HEAD"], responses=PLAIN_TEXT)
async def root() -> Response:
    """`Ollama is running`, as Ollama answers its liveness probe."""
    return PlainTextResponse("Ollama is running")


@router.get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}


@router.get("/api/tags")
async def tags(request: Request, ctx: Ctx) -> dict[str, Any]:
    """The served model; with a model pool every model of the store (`ollama_pool`)."""
    if ctx.pool is not None:
        return {"models": await ollama_pool.tags(request.app.state, ctx)}
    f = facts(request.app.state, ctx)
    return {"models": [f.listing(await f.digest())]}


@router.get("/api/ps")
async def ps(request: Request, ctx: Ctx) -> dict[str, Any]:
    """The loaded models: the served one, loaded until tandem stops (with a model pool:
    each loaded model and when its keep-alive unloads it); `size_vram`: bytes of weights in
    non-CPU buffers."""
    if ctx.pool is not None:
        return {"models": await ollama_pool.ps(request.app.state, ctx)}
    return {"models": [await ps_entry(request.app.state, ctx, FOREVER)]}


async def ps_entry(state: Any, ctx: ServerContext, expires_at: str) -> dict[str, Any]:
    """One `/api/ps` entry: the model `ctx` serves, unloaded at `expires_at`."""
    f = facts(state, ctx)
    buffers = (ctx.engine.describe().get("weight_buffers") if hasattr(ctx.engine, "describe")
               else None) or {}
    vram = sum(mib for name, mib in buffers.items() if not str(name).upper().startswith("CPU"))
    return {"name": f.name, "model": f.name, "size": f.size, "digest": await f.digest(),
            "details": f.details, "expires_at": expires_at, "size_vram": int(vram * 2**20),
            "context_length": ctx.context_length}


@router.post("/api/show", openapi_extra=documented_body(OllamaShowRequest))
async def show(request: Request, ctx: Ctx) -> dict[str, Any]:
    body = await parse_body(request, OllamaShowRequest)
    resolve(ctx, body.model or body.name)
    ctx = await model_context(request, ctx, body.model or body.name)
    f = facts(request.app.state, ctx)
    source = str(f.path) if f.path else f.name
    modelfile = (f"# Modelfile of the model tandem serves\nFROM {source}\n"
                 + "".join(f"PARAMETER {line}\n" for line in f.parameters.splitlines()))
    return {"modelfile": modelfile, "parameters": f.parameters, "template": f.template,
            "details": f.details, "model_info": f.model_info, "capabilities": f.capabilities,
            "modified_at": f.listing("")["modified_at"]}


def _load_reply(model: str, chat: bool, reason: str = "load") -> dict[str, Any]:
    """Ollama's answer to an empty request: the model loaded ("load") or, with
    `keep_alive: 0`, unloaded ("unload")."""
    body: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return {**body, "done": True, "done_reason": reason}


def _stops(ctx: Any, model: str, keep_alive: Any, empty: bool) -> bool:
    """An empty request with `keep_alive: 0` on a pool (`ollama stop`): unload without
    loading first. True when it did."""
    pool = getattr(ctx, "pool", None)
    if pool is None or not empty or keep_alive != 0:
        return False
    pool.stop(model)
    return True


@router.post("/api/chat", responses=STREAMED_NDJSON,
             openapi_extra=documented_body(OllamaChatRequest))
async def chat(request: Request, ctx: Ctx) -> Response:
    start = time.perf_counter()
    body = await parse_body(request, OllamaChatRequest)
    model = resolve(ctx, body.model)
    keep_alive = check_common(body)
    if _stops(ctx, body.model, keep_alive, not body.messages):
        return JSONResponse(_load_reply(model, chat=True, reason="unload"))
    ctx = await model_context(request, ctx, body.model, keep_alive)
    if not body.messages:
        return JSONResponse(_load_reply(model, chat=True))
    messages = template_messages(body.messages, model)
    tools = parse_tools(body.tools)
    fmt = response_format(body.format)
    if tools and fmt is not None:
        raise bad_request("'format' cannot be combined with 'tools'.", "format")
    sampling, limit = sampling_options(body.options)
    jobs = await prepare_chat_jobs(ctx, ChatInput(
        messages=messages, sampling=sampling, max_tokens=limit, tools=tools,
        response_format=fmt, num_ctx=ollama_context(sampling.num_ctx, ctx.context_length),
        num_ctx_param="options.num_ctx"))
    return await _answer(request, ctx, jobs, model, start, body.stream, chat=True)


@router.post("/api/generate", responses=STREAMED_NDJSON,
             openapi_extra=documented_body(OllamaGenerateRequest))
async def generate(request: Request, ctx: Ctx) -> Response:
    """`prompt` through the chat template as a user turn (after `system`), or as given with
    `raw`; with `suffix`, a fill-in-the-middle prompt (`app.server.fim`; `raw` changes
    nothing there). Refused: `images` and image-generation fields, `template` (tandem
    renders the model's own template), `context` (deprecated by Ollama), `system` with
    `raw` or `suffix`."""
    start = time.perf_counter()
    body = await parse_body(request, OllamaGenerateRequest)
    model = resolve(ctx, body.model)
    keep_alive = check_common(body)
    if _stops(ctx, body.model, keep_alive, not (body.prompt or body.suffix)):
        return JSONResponse(_load_reply(model, chat=False, reason="unload"))
    ctx = await model_context(request, ctx, body.model, keep_alive)
    refuse_images(body.images, model, "images")
    for name in ("width", "height", "steps"):
        if getattr(body, name) is not None:
            raise bad_request(f"'{name}' is not supported: model '{model}' does not "
                              "generate images", name)
    if body.template:
        raise bad_request("'template' is not supported: tandem renders the model's own chat "
                          "template (send a formatted prompt with raw: true instead)",
                          "template")
    if body.context:
        raise bad_request("'context' is not supported (deprecated by Ollama): send the "
                          "conversation to /api/chat instead", "context")
    prompt, suffix, system = body.prompt or "", body.suffix or "", body.system or ""
    if system and (body.raw or suffix):
        raise bad_request("'system' cannot be combined with "
                          + ("'suffix'" if suffix else "raw mode"), "system")
    if not prompt and not suffix:
        return JSONResponse(_load_reply(model, chat=False))
    sampling, limit = sampling_options(body.options)
    fmt = response_format(body.format)
    tok = ctx.engine.tokenizer
    if suffix:
        jobs = await _text_jobs(ctx, fim_prompt_ids(tok, prompt, suffix), sampling, limit,
                                fmt, "prompt")
    elif body.raw:
        jobs = await _text_jobs(ctx, list(raw_prompt_ids(tok, prompt)), sampling, limit, fmt,
                                "prompt")
    else:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        jobs = await prepare_chat_jobs(ctx, ChatInput(
            messages=messages, sampling=sampling, max_tokens=limit, response_format=fmt,
            param="prompt", num_ctx=ollama_context(sampling.num_ctx, ctx.context_length),
            num_ctx_param="options.num_ctx"))
    return await _answer(request, ctx, jobs, model, start, body.stream, chat=False)


async def _text_jobs(ctx: ServerContext, ids: list[int], sampling: SamplingFields,
                     limit: int | None, fmt: Any, param: str) -> list[Job]:
    """The one job of a prompt given as token ids (raw or fill-in-the-middle), within the
    request's `options.num_ctx` (`ollama_context`)."""
    num_ctx = ollama_context(sampling.num_ctx, ctx.context_length)
    window = ctx.context_length if num_ctx is None else num_ctx
    check_prompt(ids, window, n_vocab(ctx.engine), param,
                 None if num_ctx is None else "options.num_ctx")
    grammar = await response_grammar(ctx.engine, fmt)
    return [Job(index=0, prompt_index=0, prompt_ids=ids, params=sampling_params(
        sampling, max_tokens=limit, prompt_len=len(ids), context_length=window,
        seed=choice_seed(sampling.seed, 0), logprobs=None, defaults=ctx.defaults,
        vocab=n_vocab(ctx.engine), grammar=grammar))]


def template_messages(messages: list[OllamaMessage], model: str) -> list[dict[str, Any]]:
    """Ollama messages as the chat template takes them (`app.server.chat_core.ChatInput`):
    an assistant's `tool_calls` get ids (`call_<i>_<j>` unless given) and object arguments
    (JSON text is parsed too), a tool message is matched to the latest call of its
    `tool_name` (or its `tool_call_id`). Raises APIError 400 for an unknown role, images,
    malformed calls, or calls on a message that is not the assistant's."""
    out: list[dict[str, Any]] = []
    by_id: dict[str, str] = {}
    by_name: dict[str, str] = {}
    for i, m in enumerate(messages):
        role = m.role.lower()
        if role not in ROLES:
            raise bad_request(f"invalid role '{m.role}' in messages[{i}]: expected one of "
                              f"{', '.join(ROLES)}", f"messages[{i}].role")
        refuse_images(m.images, model, f"messages[{i}].images")
        item: dict[str, Any] = {"role": role, "content": m.content or ""}
        if m.tool_calls:
            if role != "assistant":
                raise bad_request(f"messages[{i}].tool_calls: only assistant messages carry "
                                  "tool calls", f"messages[{i}].tool_calls")
            item["tool_calls"] = [_history_call(c, i, j) for j, c in enumerate(m.tool_calls)]
            item["content"] = item["content"] or None
            for c in item["tool_calls"]:
                by_id[c["id"]] = c["function"]["name"]
                by_name[c["function"]["name"]] = c["id"]
        if role == "tool":
            name = m.tool_name or by_id.get(m.tool_call_id or "", "")
            item["name"] = name
            item["tool_call_id"] = m.tool_call_id or by_name.get(name, "")
        out.append(item)
    return out


def _history_call(call: Any, i: int, j: int) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{j}]"
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"{where}.function.name is required (a string)",
                          f"{where}.function.name")
    args = fn.get("arguments")
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            args = None
    if not isinstance(args, dict):
        raise bad_request(f"{where}.function.arguments must be an object",
                          f"{where}.function.arguments")
    uid = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{i}_{j}"
    return {"id": uid, "type": "function", "function": {"name": fn["name"], "arguments": args}}


# -- replies ---------------------------------------------------------------------------------


async def _answer(request: Request, ctx: ServerContext, jobs: list[Job], model: str,
                  start: float, stream: bool | None, chat: bool) -> Response:
    streams = submit_jobs(ctx.engine, jobs, f"ollama-{uuid.uuid4().hex}",
                          "messages" if chat else "prompt")
    lines = _lines(ctx, streams, jobs[0], model, start, chat) if stream is not False else None
    return await respond(request, ctx, streams, jobs, lines,
                         lambda states: _collected(states[0], model, start, chat),
                         media_type=NDJSON)


def _call(call: ToolCall, index: int) -> dict[str, Any]:
    return {"function": {"index": index, "name": call.name,
                         "arguments": call.arguments_object()}}


def _piece(model: str, chat: bool, text: str, calls: list[dict[str, Any]] | None = None
           ) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if chat:
        body["message"] = {"role": "assistant", "content": text}
        if calls:
            body["message"]["tool_calls"] = calls
    else:
        body["response"] = text
    body["done"] = False
    return body


def _final(state: ChoiceState, model: str, start: float, chat: bool, text: str,
           calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = _piece(model, chat, text, calls)
    reason = state.finish_reason or "stop"
    body["done"] = True
    body["done_reason"] = DONE_REASONS.get(reason, reason)
    body.update(_metrics(state, start))
    return body


def _metrics(state: ChoiceState, start: float) -> dict[str, int]:
    def ns(a: float | None, b: float | None) -> int:
        return max(0, int(round((b - a) * 1e9))) if a is not None and b is not None else 0

    m = state.metrics
    end = time.perf_counter()
    return {
        "total_duration": ns(start, end),
        "load_duration": ns(start, m.arrival_time if m and m.arrival_time else None),
        "prompt_eval_count": state.prompt_tokens,
        "prompt_eval_duration": ns(m.first_scheduled_time, m.first_token_time) if m else 0,
        "eval_count": state.completion_tokens,
        "eval_duration": ns(m.first_token_time, m.finish_time) if m else 0,
    }


def _collected(state: ChoiceState, model: str, start: float, chat: bool) -> dict[str, Any]:
    calls = [_call(c, i) for i, c in enumerate(state.tool_calls)]
    return _final(state, model, start, chat, state.text, calls or None)


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


async def _lines(ctx: ServerContext, streams: list[Any], job: Job, model: str, start: float,
                 chat: bool) -> AsyncIterator[bytes]:
    """The NDJSON lines of a streamed reply (see the module docstring). A call is sent once
    the next one starts, or at the end (then from the parser's own record of the calls)."""
    open_call: tuple[str, list[str]] | None = None  # the call being written: name, fragments
    sent = 0  # tool calls sent so far
    try:
        async for event in chat_events(ctx, streams, job):
            if isinstance(event, TextDelta):
                if event.text:
                    yield _line(_piece(model, chat, event.text))
            elif isinstance(event, CallStart):
                if open_call is not None:
                    done = ToolCall(open_call[0], "".join(open_call[1]))
                    yield _line(_piece(model, chat, "", [_call(done, sent)]))
                    sent += 1
                open_call = (event.name, [])
            elif isinstance(event, CallArgs):
                if open_call is not None:
                    open_call[1].append(event.fragment)
            else:
                state = event.state
                calls = [_call(c, i) for i, c in enumerate(state.tool_calls)][sent:]
                if calls:
                    yield _line(_piece(model, chat, "", calls))
                yield _line(_final(state, model, start, chat, ""))
    except Exception as exc:  # after the first line: the error goes in the stream
        if not isinstance(exc, APIError):
            log.exception("ollama stream failed")
        message = exc.message if isinstance(exc, APIError) else (
            f"Internal server error: {type(exc).__name__}: {exc}")
        yield _line({"error": message})
