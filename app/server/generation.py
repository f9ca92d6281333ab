"""Shared request plumbing between the HTTP routes and `AsyncEngine`.

A request becomes one `Job` per choice (`n` choices per prompt; choice `j` of a request
with a seed samples with `seed + j`). Jobs are submitted together — any refusal cancels the
ones already submitted and becomes an OpenAI error — and their outputs are merged as they
arrive. Leaving the merge early (client gone, error) cancels every stream, which frees their
KV blocks within one engine step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from app.engine.constrain import CompiledGrammar
from app.engine.types import (
    EngineOverloadedError,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from app.server.errors import (
    APIError,
    bad_request,
    context_length_exceeded,
    overloaded,
)
from app.server.metrics import ServerMetrics
from app.server.schemas import SamplingFields
from app.tool_calls import TextDelta, ToolCall, ToolCallParser
from app.tool_calls.parser import Event
from models.registry import GenerationDefaults

T = TypeVar("T")

# What a request gets when the served model has no recommended settings (OpenAI's defaults).
OPENAI_DEFAULTS = GenerationDefaults(1.0, source="OpenAI's defaults")


@dataclass
class Job:
    """One choice to generate: `index` is its choice index in the response. `tool_parser`
    makes the choice's `ToolCallParser` (None: the reply is all text)."""

    index: int
    prompt_index: int
    prompt_ids: list[int]
    params: SamplingParams
    tool_parser: Callable[[], ToolCallParser | None] | None = None


@dataclass
class ChoiceState:
    """Accumulated output of one choice. With a tool parser, `text_parts` holds only the
    text outside tool calls, `events` the parser's events of the latest output (each API
    renders them), `tool_calls` the calls so far; a choice that ends ("stop") with calls
    has `finish_reason` "tool_calls". `stop_sequence`: the stop string that ended it."""

    job: Job
    text_parts: list[str] = field(default_factory=list)
    n_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    metrics: RequestMetrics | None = None
    events: list[Event] = field(default_factory=list)
    parser: ToolCallParser | None = None
    stop_sequence: str | None = None

    def __post_init__(self) -> None:
        if self.parser is None and self.job.tool_parser is not None:
            self.parser = self.job.tool_parser()

    def add(self, out: RequestOutput) -> None:
        if self.parser is None:
            if out.text:
                self.text_parts.append(out.text)
        else:
            self.events = self.parser.feed(out.text) if out.text else []
            if out.finished:
                self.events += self.parser.finish(cut=out.finish_reason == "length")
            self.text_parts += [e.text for e in self.events if isinstance(e, TextDelta)]
        self.n_tokens += len(out.token_ids)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finished:
            self.finish_reason = out.finish_reason
            self.stop_sequence = out.stop_sequence
            if self.tool_calls and out.finish_reason == "stop":
                self.finish_reason = "tool_calls"
            self.metrics = out.metrics

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.parser.calls if self.parser is not None else []

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def prompt_tokens(self) -> int:
        return self.metrics.prompt_tokens if self.metrics else len(self.job.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return self.metrics.completion_tokens if self.metrics else self.n_tokens

    @property
    def cached_tokens(self) -> int:
        return self.metrics.cached_tokens if self.metrics else 0

    @property
    def accepted_prediction_tokens(self) -> int:
        return self.metrics.accepted_prediction_tokens if self.metrics else 0

    @property
    def rejected_prediction_tokens(self) -> int:
        return self.metrics.rejected_prediction_tokens if self.metrics else 0


def usage(states: list[ChoiceState]) -> dict[str, Any]:
    """OpenAI `usage`: each prompt counted once (the `n` choices share it), completions summed.

    `prompt_tokens_details.cached_tokens` per prompt is the smallest prefix-cache hit among its
    choices — what the cache held before this request, not what its own siblings put there.
    `completion_tokens_details` (OpenAI's `CompletionTokensDetails`; `reasoning_tokens` and
    `audio_tokens` are always 0 here): `accepted_prediction_tokens` = predicted tokens that
    the model produced (drafts from `prediction` it accepted), `rejected_prediction_tokens` =
    predicted tokens it computed and discarded; both summed over the choices, 0 without a
    prediction. Rejected tokens are not in `completion_tokens` (unlike OpenAI's billing, the
    count here is of tokens in the reply).
    """
    prompt_tokens = 0
    cached = 0
    seen: dict[int, list[ChoiceState]] = {}
    for s in states:
        seen.setdefault(s.job.prompt_index, []).append(s)
    for group in seen.values():
        prompt_tokens += group[0].prompt_tokens
        cached += min(s.cached_tokens for s in group)
    completion = sum(s.completion_tokens for s in states)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": sum(s.accepted_prediction_tokens for s in states),
            "rejected_prediction_tokens": sum(s.rejected_prediction_tokens for s in states),
        },
    }


def check_prompt(prompt_ids: list[int], context_length: int, n_vocab: int, param: str,
                 limit: str | None = None) -> None:
    """Raise 400 for an empty prompt, out-of-vocabulary ids, or one that fills the context
    (`context_length` tokens; `limit` names the request field that set it, if one did)."""
    if not prompt_ids:
        raise bad_request(f"The {param} must not be empty.", param=param)
    if len(prompt_ids) >= context_length:
        raise context_length_exceeded(len(prompt_ids), context_length, param, limit)
    if n_vocab > 0:
        bad = next((t for t in prompt_ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise bad_request(
                f"Token id {bad} is out of the vocabulary [0, {n_vocab}).", param=param
            )


def request_context(num_ctx: int | None, served: int, param: str = "num_ctx") -> int:
    """The context, in tokens, one request's sequence may hold: its `num_ctx` (a tandem
    extension on the OpenAI routes), or the served context when it sends none.

    The prompt plus the reply never exceed it: a prompt that fills it is a 400 (see
    `check_prompt`), and the reply stops with finish reason "length" when prompt + reply
    reach it. Raises APIError 400 when `num_ctx` is larger than `served`: the model is never
    reloaded for one request. (Ollama's `options.num_ctx` is capped instead, as Ollama caps
    it: `app.server.ollama_schemas.ollama_context`.)"""
    if num_ctx is None:
        return served
    if num_ctx > served:
        raise bad_request(
            f"'{param}' is {num_ctx} tokens, larger than the context this server loaded "
            f"({served} tokens, `--ctx-size`); tandem does not reload a model for one "
            f"request. Send at most {served} or leave '{param}' out.", param=param,
            code="invalid_value")
    return num_ctx


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def logit_bias(req: SamplingFields, vocab: int) -> dict[int, float] | None:
    """The request's `logit_bias` as {token id: bias}; None when absent or empty.

    Raises APIError 400 (param "logit_bias") for an id outside ``[0, vocab)`` (when the
    engine reports its vocabulary size `vocab` > 0)."""
    if not req.logit_bias:
        return None
    for token in req.logit_bias:
        if token < 0 or (vocab > 0 and token >= vocab):
            raise bad_request(
                f"Invalid key in 'logit_bias': token id {token} is out of the vocabulary "
                f"[0, {vocab}).", param="logit_bias")
    return dict(req.logit_bias)


def sampling_params(
    req: SamplingFields,
    *,
    max_tokens: int | None,
    prompt_len: int,
    context_length: int,
    seed: int | None,
    logprobs: int | None,
    prediction: list[int] | None = None,
    defaults: GenerationDefaults | None = None,
    vocab: int = 0,
    grammar: CompiledGrammar | None = None,
) -> SamplingParams:
    """Engine `SamplingParams` for one choice.

    `max_tokens` is capped to the room left in `context_length` (`None` = until EOS, a stop
    string or that limit, which may be a request's own context below the engine's, see
    `request_context`). Each of temperature, top_p, top_k, min_p, repetition_penalty and
    repeat_last_n the request leaves out (or sends as null) comes from `defaults`, the
    served model's recommended settings (as vLLM takes a model's generation_config); without
    them OpenAI's defaults apply: temperature 1, top_p 1, no top-k/min-p/repetition penalty.
    `prediction`: the predicted output's token ids (see `app.server.prediction`), shared by
    every choice; `req.speculative` false (not null) opts out of speculative decoding.
    `vocab` (the vocabulary size, 0 = unknown) bounds `logit_bias` ids. `grammar`: the
    request's compiled `response_format` (shared by every choice; each sequence gets its
    own matcher). Raises APIError 400 when the engine rejects a value.
    """
    room = context_length - prompt_len
    max_tokens = max(1, room if max_tokens is None else min(max_tokens, room))
    base = defaults or OPENAI_DEFAULTS
    bias = logit_bias(req, vocab)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_or(req.temperature, base.temperature),
            top_p=_or(req.top_p, base.top_p),
            top_k=max(_or(req.top_k, base.top_k), 0),
            min_p=_or(req.min_p, base.min_p),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=_or(req.repetition_penalty, base.repetition_penalty),
            repeat_last_n=_or(req.repeat_last_n, base.repeat_last_n),
            logit_bias=bias,
            seed=seed,
            stop=req.stop_list(),
            ignore_eos=bool(req.ignore_eos),
            logprobs=logprobs,
            speculative=req.speculative is not False,
            prediction=prediction,
            grammar=grammar,
        )
    except ValueError as exc:
        raise bad_request(str(exc)) from exc


def n_vocab(engine: Any) -> int:
    """The engine's vocabulary size, or 0 when it does not say."""
    info = getattr(engine, "info", None)
    return int(getattr(info, "n_vocab", 0) or 0)


def cancel_all(streams: list[Any]) -> None:
    """Cancel every stream (idempotent)."""
    for s in streams:
        s.cancel()


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index`: `seed + index`, wrapped to an unsigned 64-bit value (numpy
    generators take no negative seeds; OpenAI's are any int64)."""
    return None if seed is None else (seed + index) % 2**64


def submit_jobs(engine: Any, jobs: list[Job], request_id: str, param: str) -> list[Any]:
    """Submit every job; all-or-nothing.

    Raises APIError: 400 `context_length_exceeded` (PromptTooLongError), 503 (overload),
    400 (other ValueError from the engine).
    """
    streams: list[Any] = []
    try:
        for job in jobs:
            streams.append(
                engine.submit(job.prompt_ids, job.params, request_id=f"{request_id}-{job.index}")
            )
    except BaseException as exc:
        for s in streams:
            s.cancel()
        mapped = api_error(exc, param)
        if mapped is not None:
            raise mapped from exc
        raise
    return streams


def api_error(exc: BaseException, param: str | None = None) -> APIError | None:
    """The client-facing error for an engine refusal, or None for a server fault.

    PromptTooLongError -> 400 `context_length_exceeded`; EngineOverloadedError -> 503;
    any other ValueError (the engine's input validation) -> 400.
    """
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return context_length_exceeded(exc.prompt_tokens, exc.context_length, param or "prompt")
    if isinstance(exc, EngineOverloadedError):
        return overloaded(str(exc))
    if isinstance(exc, ValueError):
        return bad_request(str(exc), param)
    return None


async def merge_outputs(
    streams: list[Any], metrics: ServerMetrics | None
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield `(stream position, output)` in arrival order until every stream has finished.

    Closing the iterator early (or an error, or cancellation) cancels every stream. An
    engine refusal delivered through a stream is raised as its APIError (see `api_error`).
    """
    inner = _merge(streams, metrics)
    try:
        async for item in inner:
            yield item
    except Exception as exc:
        mapped = api_error(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc
    finally:
        await inner.aclose()
        cancel_all(streams)  # even if the close above was itself interrupted


async def _merge(
    streams: list[Any], metrics: ServerMetrics | None
) -> AsyncIterator[tuple[int, RequestOutput]]:
    try:
        if len(streams) == 1:
            async for out in streams[0]:
                if out.finished and metrics is not None:
                    metrics.observe_finished(out.finish_reason, out.metrics)
                yield 0, out
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]] = (
            asyncio.Queue()
        )

        async def pump(pos: int, stream: Any) -> None:
            try:
                async for item in stream:
                    await queue.put((pos, item, None))
            except Exception as exc:  # reported to the consumer, which re-raises it
                await queue.put((pos, None, exc))
                return
            await queue.put((pos, None, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        try:
            remaining = len(tasks)
            while remaining:
                pos, out, err = await queue.get()
                if err is not None:
                    raise err
                if out is None:
                    remaining -= 1
                    continue
                if out.finished and metrics is not None:
                    metrics.observe_finished(out.finish_reason, out.metrics)
                yield pos, out
        finally:
            for t in tasks:
                t.cancel()
    finally:
        for s in streams:
            if metrics is not None and not s.finished:  # client gone or a sibling failed
                metrics.observe_finished("abort", None)
            s.cancel()


async def collect(
    streams: list[Any], jobs: list[Job], metrics: ServerMetrics | None
) -> list[ChoiceState]:
    """Run every stream to its end; the choices' accumulated outputs, in job order."""
    states = [ChoiceState(job) for job in jobs]
    gen = merge_outputs(streams, metrics)
    try:
        async for pos, out in gen:
            states[pos].add(out)
    finally:
        await gen.aclose()
    return states


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ClientDisconnected(Exception):
    """The client went away before its (non-streamed) response was ready."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first.

    Raises ClientDisconnected in that case (answered with status 499, which nobody reads).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        watcher.cancel()
        task.cancel()
        raise
    watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected()
    return task.result()
