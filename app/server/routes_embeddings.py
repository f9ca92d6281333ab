"""`POST /v1/embeddings` (OpenAI) and `POST /api/embed` (Ollama): sentence embeddings.

Both translate shapes around the engine's embedder (`backends.base.Embedder`, from
`AsyncEngine.embedder()`): the loaded model in llama.cpp's embedding mode, pooled as its GGUF
says, or by mean over the input's tokens for a causal LM that says nothing
(`backends.llamacpp.embedder`). Vectors are L2-normalised (length 1), as OpenAI's and
Ollama's are, and sent as float32 values. The work runs on one thread of its own (`_POOL`):
off the event loop, one computation at a time, without taking the shared thread pool
(grammar compiles) or the engine's step thread.

OpenAI (`EmbeddingsRequest`): `input` is a string, a list of strings, a list of token ids or a
list of such lists (at most `MAX_INPUTS`); `encoding_format` "float" (default) or "base64"
(the little-endian float32 bytes, as OpenAI sends them; the `openai` client asks for it);
`dimensions` only equal to the model's width (the served models are not trained to be
shortened: 400 otherwise); `user` ignored (it steers OpenAI's abuse monitoring). Errors (400
`invalid_request_error`): an empty string or list, OpenAI's words (`INVALID_INPUT`); an input
over the embedder's `max_tokens`, code `context_length_exceeded`; a token id outside the
vocabulary; a model that cannot embed.

Ollama (`OllamaEmbedRequest`): `input` a string or list of strings (an empty string or list:
no embeddings, 200, as Ollama answers a request that only loads the model); `truncate`
(default true: an input over the limit is cut at its end, special tokens kept; false: 400
"the input length exceeds the context length", Ollama's words); `options.num_ctx` lowers that
limit, other options mean nothing to an embedding and are ignored; `dimensions` keeps the
first n components and renormalises, as Ollama does; `keep_alive` sets how long the model
stays loaded after the reply (`model_pool.keep_alive_seconds`). Errors are Ollama's
`{"error": message}` (`app.server.errors`).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from fastapi import APIRouter, Request
from pydantic import Field

from app.server.context import Ctx, ServerContext
from app.server.errors import bad_request
from app.server.model_pool import keep_alive_seconds, model_context
from app.server.ollama_models import resolve
from app.server.ollama_schemas import parse_body
from app.server.openapi import documented_body
from app.server.schemas import _Body

router = APIRouter()

# OpenAI's limit of inputs per request (platform.openai.com/docs/api-reference/embeddings)
MAX_INPUTS = 2048
# OpenAI's answer to an empty string or list in `input` (openai-python#576)
INVALID_INPUT = ("'$.input' is invalid. Please check the API reference: "
                 "https://platform.openai.com/docs/api-reference.")
# Ollama's answer to an input over the context with `truncate: false` (server/routes.go)
OLLAMA_TOO_LONG = "the input length exceeds the context length"

_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-embed")
T = TypeVar("T")


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)


class EmbeddingsRequest(_Body):
    """Body of `POST /v1/embeddings`."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None


class OllamaEmbedRequest(_Body):
    """Body of `POST /api/embed`."""

    model: str | None = None
    input: Any = None  # str | list[str], checked by `_ollama_inputs` for Ollama's words
    truncate: bool | None = None
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = None
    dimensions: int | None = None


async def _embedder(ctx: ServerContext) -> Any:
    """The engine's embedder (made on first use, off the loop). Raises APIError 400 when the
    model or its backend cannot embed."""
    make = getattr(ctx.engine, "embedder", None)
    try:
        embedder = None if make is None else await _off_loop(make)
    except ValueError as exc:
        raise _cannot_embed(ctx, str(exc)) from None
    if embedder is None:
        backend = getattr(ctx.engine, "backend_name", "this")
        raise _cannot_embed(ctx, f"the {backend} backend has no embedding mode")
    return embedder


def _cannot_embed(ctx: ServerContext, why: str) -> Exception:
    return bad_request(f"The model `{ctx.model_name}` cannot embed: {why}.", param="model")


def _float32(vectors: list[list[float]]) -> list[np.ndarray]:
    return [np.asarray(v, dtype="<f4") for v in vectors]


# -- OpenAI ----------------------------------------------------------------------------------


def _openai_inputs(value: str | list[str] | list[int] | list[list[int]]
                   ) -> list[str | list[int]]:
    """The request's inputs, each a text or token ids. Raises APIError 400 for an empty
    input (OpenAI's words) or more than `MAX_INPUTS`."""
    if isinstance(value, str):
        inputs: list[str | list[int]] = [value]
    elif value and all(isinstance(t, int) for t in value):
        inputs = [list(value)]  # type: ignore[arg-type]
    else:
        inputs = list(value)  # type: ignore[arg-type]
    if not inputs or any(len(i) == 0 for i in inputs):
        raise bad_request(INVALID_INPUT)
    if len(inputs) > MAX_INPUTS:
        raise bad_request(f"Invalid 'input': at most {MAX_INPUTS} inputs per request "
                          f"(got {len(inputs)}).", param="input")
    return inputs


def _openai_tokens(embedder: Any, inputs: list[str | list[int]]) -> list[list[int]]:
    """Token ids of each input, checked. Raises APIError 400 for an input over
    `embedder.max_tokens` (`context_length_exceeded`) or an id outside the vocabulary."""
    out = []
    for i, item in enumerate(inputs):
        where = "input" if len(inputs) == 1 else f"input[{i}]"
        if isinstance(item, str):
            tokens = embedder.tokenize(item)
        else:
            tokens = item
            bad = next((t for t in tokens if not 0 <= t < embedder.n_vocab), None)
            if bad is not None:
                raise bad_request(f"Invalid '{where}': token id {bad} is outside the "
                                  f"vocabulary (0 to {embedder.n_vocab - 1}).", param="input")
        if len(tokens) > embedder.max_tokens:
            raise bad_request(
                f"Invalid '{where}': maximum context length is {embedder.max_tokens} tokens, "
                f"and this input has {len(tokens)}. Please reduce the length of the input.",
                param="input", code="context_length_exceeded")
        out.append(tokens)
    return out


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingsRequest, request: Request, ctx: Ctx
                            ) -> dict[str, Any]:
    """OpenAI's embeddings: `{"object": "list", "data": [{"object": "embedding", "index",
    "embedding": floats or base64}], "model", "usage": {"prompt_tokens", "total_tokens"}}`."""
    model = ctx.resolve_model(body.model)
    ctx = await model_context(request, ctx, body.model)
    inputs = _openai_inputs(body.input)
    embedder = await _embedder(ctx)
    if body.dimensions is not None and body.dimensions != embedder.n_embd:
        raise bad_request(
            f"Invalid 'dimensions': this model's embeddings have {embedder.n_embd} dimensions "
            f"and cannot be shortened; send {embedder.n_embd} or leave 'dimensions' out.",
            param="dimensions")
    tokens = await _off_loop(_openai_tokens, embedder, inputs)
    vectors = _float32(await _off_loop(embedder.embed, tokens))
    as_base64 = body.encoding_format == "base64"
    n_tokens = sum(map(len, tokens))
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i,
                  "embedding": base64.b64encode(v.tobytes()).decode("ascii") if as_base64
                  else v.tolist()}
                 for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


# -- Ollama ----------------------------------------------------------------------------------


def _ollama_inputs(value: Any) -> list[str]:
    """Ollama's reading of `input`: a string (empty: none), a list of strings, or nothing.
    Raises APIError 400 "invalid input type" (Ollama's words) otherwise."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise bad_request("invalid input type", param="input")


def _ollama_tokens(embedder: Any, texts: list[str], limit: int, truncate: bool
                   ) -> list[list[int]]:
    out = []
    for i, text in enumerate(texts):
        tokens = embedder.tokenize(text, limit if truncate else None)
        if not tokens:
            raise bad_request(f"input[{i}] is empty: an empty string has no tokens to embed",
                              param="input")
        if len(tokens) > limit:
            raise bad_request(OLLAMA_TOO_LONG, param="input")
        out.append(tokens)
    return out


@router.post("/api/embed", openapi_extra=documented_body(OllamaEmbedRequest))
async def ollama_embed(request: Request, ctx: Ctx) -> dict[str, Any]:
    """Ollama's embed: `{"model", "embeddings": [[...]], "total_duration", "load_duration"
    (ns: getting the embedder, which the first request makes), "prompt_eval_count"}`. The
    body is JSON whatever its `Content-Type` (as on every Ollama route: `parse_body`); an
    unknown model is Ollama's 404 `model 'x' not found`."""
    start = time.perf_counter_ns()
    body = await parse_body(request, OllamaEmbedRequest)
    resolve(ctx, body.model)
    ctx = await model_context(request, ctx, body.model, keep_alive_seconds(body.keep_alive))
    texts = _ollama_inputs(body.input)
    embedder = await _embedder(ctx)
    loaded = time.perf_counter_ns()
    limit = embedder.max_tokens
    num_ctx = (body.options or {}).get("num_ctx")
    if isinstance(num_ctx, int) and not isinstance(num_ctx, bool) and num_ctx > 0:
        limit = min(limit, num_ctx)
    truncate = body.truncate is not False
    tokens = await _off_loop(_ollama_tokens, embedder, texts, limit, truncate)
    vectors = _float32(await _off_loop(embedder.embed, tokens)) if tokens else []
    dims = body.dimensions
    if dims is not None and 0 < dims < embedder.n_embd:  # Ollama: cut, then renormalise
        vectors = [v[:dims] / np.float32(max(float(np.linalg.norm(v[:dims])), 1e-12))
                   for v in vectors]
    return {
        "model": body.model or ctx.model_name,
        "embeddings": [v.tolist() for v in vectors],
        "total_duration": time.perf_counter_ns() - start,
        "load_duration": loaded - start,
        "prompt_eval_count": sum(map(len, tokens)),
    }
