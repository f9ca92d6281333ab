"""`POST /v1/completions`: legacy text completion.

`prompt` is a string, a list of strings, a list of token ids or a list of such lists; each
prompt gets `n` choices, choice index `prompt_index * n + i` (OpenAI's order). Text prompts
are tokenized with `app.prompts.raw_prompt_ids` (BOS added if the model wants it); id prompts are
used as given. `max_tokens` defaults to 16, as OpenAI's does. `echo` prepends the prompt
(its text, or the decoded ids) to each choice; with `logprobs`, echoed prompt tokens carry
null log-probabilities (the engine does not score prompts). `prediction` (one for every
prompt and choice), `speculative` and `response_format` (a tandem extension here, as in
vLLM: the completion must match it) work as on chat completions. `suffix` (OpenAI's
insertion) makes each text prompt the prefix of a fill-in-the-middle prompt
(`app.server.fim`) on models with FIM tokens; without them it is a 400 naming the missing
tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.prompts import raw_prompt_ids
from app.server.context import Ctx, ServerContext
from app.server.errors import bad_request
from app.server.fim import fim_prompt_ids
from app.server.generation import (
    ChoiceState,
    Job,
    check_prompt,
    choice_seed,
    n_vocab,
    request_context,
    sampling_params,
    submit_jobs,
    usage,
)
from app.server.logprobs import LegacyLogprobs, merge_legacy
from app.server.model_pool import model_context
from app.server.openapi import STREAMED_SSE
from app.server.prediction import prediction_ids
from app.server.response_format import refuse_tool_fields, response_grammar
from app.server.responses import (
    Choice,
    envelope,
    respond,
    response_head,
    stream_chunks,
)
from app.server.schemas import CompletionRequest

router = APIRouter()

DEFAULT_MAX_TOKENS = 16


@dataclass
class Prompt:
    ids: list[int]
    text: str | None  # the request's text, when given as text


def parse_prompts(
    engine: Any, prompt: str | list[str] | list[int] | list[list[int]]
) -> list[Prompt]:
    """The request's prompts as token ids; 400 for an empty list."""
    if isinstance(prompt, str):
        return [Prompt(list(raw_prompt_ids(engine.tokenizer, prompt)), prompt)]
    if not prompt:
        raise bad_request("The prompt must not be empty.", "prompt")
    if isinstance(prompt[0], str):
        return [Prompt(list(raw_prompt_ids(engine.tokenizer, p)), p) for p in prompt]  # type: ignore[arg-type]
    if isinstance(prompt[0], int):
        return [Prompt(list(prompt), None)]  # type: ignore[arg-type]
    return [Prompt(list(p), None) for p in prompt]  # type: ignore[union-attr]


def fim_prompts(engine: Any, prompt: str | list[str] | list[int] | list[list[int]],
                suffix: str) -> list[Prompt]:
    """Each text prompt as the prefix of a fill-in-the-middle prompt before `suffix`
    (`app.server.fim`). Raises APIError 400: the model has no FIM tokens (the message names
    the missing ones), or the prompts are token ids (a suffix needs text)."""
    texts = [prompt] if isinstance(prompt, str) else prompt
    if not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request("'suffix' needs the prompt as text (a string or a list of "
                          "strings), not token ids.", "prompt")
    return [Prompt(fim_prompt_ids(engine.tokenizer, t, suffix), t) for t in texts]  # type: ignore[arg-type]


class _Echo:
    """The echoed prompt of one prompt: its text and (for logprobs) its token texts."""

    def __init__(self, engine: Any, prompt: Prompt):
        tok = engine.tokenizer
        self.text = prompt.text if prompt.text is not None else tok.decode(prompt.ids)
        self._engine = engine
        self._ids = prompt.ids

    def token_texts(self) -> list[str]:
        return [self._engine.tokenizer.decode([t]) for t in self._ids]


@router.post("/v1/completions", responses=STREAMED_SSE)
async def completions(body: CompletionRequest, request: Request, ctx: Ctx) -> Response:
    model = ctx.resolve_model(body.model)
    ctx = await model_context(request, ctx, body.model)
    refuse_tool_fields(body)
    n = body.n or 1
    if body.best_of is not None and body.best_of != n:
        raise bad_request("best_of is not supported (use n).", "best_of")
    prompts = (fim_prompts(ctx.engine, body.prompt, body.suffix) if body.suffix
               else parse_prompts(ctx.engine, body.prompt))
    limit = request_context(body.num_ctx, ctx.context_length)
    for p in prompts:
        check_prompt(p.ids, limit, n_vocab(ctx.engine), "prompt",
                     "num_ctx" if limit < ctx.context_length else None)
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    prediction = prediction_ids(ctx.engine, body.prediction, ctx.context_length)
    grammar = await response_grammar(ctx.engine, body.response_format)
    jobs = []
    for pi, p in enumerate(prompts):
        for i in range(n):
            index = pi * n + i
            params = sampling_params(
                body,
                max_tokens=max_tokens,
                prompt_len=len(p.ids),
                context_length=limit,
                seed=choice_seed(body.seed, index),
                logprobs=body.logprobs,
                prediction=prediction,
                defaults=ctx.defaults,
                vocab=n_vocab(ctx.engine),
                grammar=grammar,
            )
            jobs.append(Job(index=index, prompt_index=pi, prompt_ids=p.ids, params=params))
    echoes = [_Echo(ctx.engine, p) for p in prompts] if body.echo else None
    head = response_head(ctx, "cmpl", model)
    streams = submit_jobs(ctx.engine, jobs, head["id"], "prompt")
    events = (_chunks(ctx, streams, jobs, head, body.include_usage, body.logprobs, echoes)
              if body.stream else None)
    return await respond(request, ctx, streams, jobs, events,
                         lambda states: _completion(head, states, body.logprobs, echoes))


def _completion(
    head: dict[str, Any],
    states: list[ChoiceState],
    top: int | None,
    echoes: list[_Echo] | None,
) -> dict[str, Any]:
    choices = []
    for s in states:
        echo = echoes[s.job.prompt_index] if echoes else None
        text = (echo.text if echo else "") + s.text
        logprobs = None
        if top is not None:
            builder = LegacyLogprobs(top)
            parts = [builder.echo(echo.token_texts(), echo.text)] if echo else []
            parts.append(builder.add(s.logprobs))
            logprobs = merge_legacy(parts)
        choices.append(
            {
                "index": s.job.index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": s.finish_reason,
            }
        )
    return {**envelope(head, "text_completion"), "choices": choices, "usage": usage(states)}


def _chunks(
    ctx: ServerContext,
    streams: list[Any],
    jobs: list[Job],
    head: dict[str, Any],
    include_usage: bool,
    top: int | None,
    echoes: list[_Echo] | None,
) -> AsyncIterator[bytes]:
    """Per choice: its echoed prompt (with `echo`), text pieces, a last empty piece with the
    `finish_reason`; legacy logprobs offsets continue across a choice's chunks."""
    builders = [LegacyLogprobs(top) if top is not None else None for _ in jobs]

    def choice(index: int, text: str, lp: Any = None, finish: str | None = None) -> Choice:
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}

    def opening(pos: int, job: Job) -> Choice | None:
        if not echoes:
            return None
        echo, builder = echoes[job.prompt_index], builders[pos]
        lp = builder.echo(echo.token_texts(), echo.text) if builder else None
        return choice(job.index, echo.text, lp)

    def content(pos: int, state: ChoiceState, out: Any) -> Choice | str | None:
        builder = builders[pos]
        if builder and out.logprobs:
            return choice(state.job.index, out.text, builder.add(out.logprobs))
        return out.text or None  # the text alone: `text_choice`

    return stream_chunks(
        ctx, streams, jobs, envelope(head, "text_completion"),
        include_usage, opening=opening, content=content,
        last=lambda state: choice(state.job.index, "", finish=state.finish_reason),
        text_choice=choice,
    )
