"""Ollama's request bodies (pydantic v2) and their translation to tandem's neutral fields.

Shapes follow Ollama's `api/types.go` (`ChatRequest`, `GenerateRequest`, `Message`,
`Options`) as of ollama/ollama@fb30760. Unknown top-level fields are ignored, as Ollama's
JSON binding does. Every refusal is a 400 `{"error": message}` (`app.server.errors`).

`options` (`Options` + `Runner` in Ollama):
- applied: `num_predict` (-1 and -2: until EOS or the context's end; other values below 1
  are refused), `temperature`, `top_p`, `top_k`, `min_p`, `seed` (negative: random),
  `stop`, `repeat_penalty`, `repeat_last_n` (the tokens `repeat_penalty` looks back over:
  -1 all, 0 none; default 64, as Ollama), `presence_penalty`, `frequency_penalty`;
- `num_ctx`: the context this request's sequence may hold (`ollama_context`): below the
  served context (`--ctx-size`, what `/api/show` reports) it is honoured per sequence
  without touching the model (a prompt that fills it is a 400, the reply stops with
  `done_reason: "length"` when prompt + reply reach it); above, it is capped at the served
  context, as Ollama caps it at the model's trained context (`llm/server.go`), and the
  model is never reloaded (Ollama reloads for every new `num_ctx`; aider sends one per
  request); below 4 it is 4, Ollama's floor (`sched.go`);
- accepted and ignored because they only tune hardware or Ollama's runner:
  `HARDWARE_OPTIONS` (tandem picks threads, batch and memory itself; `num_keep` matters only
  to Ollama's context shift, which tandem does not do; `draft_num_predict`: tandem sizes its
  drafts adaptively);
- refused unless neutral, since tandem's sampler has no such step: `typical_p` (1),
  `mirostat` (0), `tfs_z` (1), and `repeat_last_n` other than -1 (the whole history)
  while a presence or frequency penalty is on (tandem applies those over the whole reply,
  as OpenAI does);
- any other key is ignored and logged, as Ollama does (`Options.FromMap`).
A value of the wrong type is refused with Ollama's wording (`option "top_k" must be of type
integer`).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from app.server.errors import bad_request
from app.server.model_pool import keep_alive_seconds
from app.server.schemas import SamplingFields, _Body

log = logging.getLogger("tandem.server")
B = TypeVar("B", bound=BaseModel)

INT_OPTIONS = ("num_predict", "top_k", "seed", "repeat_last_n", "mirostat", "num_ctx",
               "num_keep", "num_batch", "num_gpu", "main_gpu", "num_thread",
               "draft_num_predict")
FLOAT_OPTIONS = ("temperature", "top_p", "min_p", "typical_p", "repeat_penalty",
                 "presence_penalty", "frequency_penalty", "mirostat_tau", "mirostat_eta",
                 "tfs_z")
BOOL_OPTIONS = ("use_mmap", "use_mlock", "numa", "low_vram", "f16_kv", "vocab_only",
                "penalize_newline")
HARDWARE_OPTIONS = ("num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap",
                    "use_mlock", "numa", "low_vram", "f16_kv", "vocab_only", "num_keep",
                    "draft_num_predict", "mirostat_tau", "mirostat_eta", "penalize_newline")
# options tandem cannot apply, with the value that means "off"
NEUTRAL = {"typical_p": 1.0, "mirostat": 0, "tfs_z": 1.0}


class OllamaMessage(_Body):
    """A chat message: `role` system, user, assistant or tool (any case, as Ollama
    lowercases it); an assistant's `tool_calls` as `[{"function": {"name", "arguments":
    object}}]`; a tool result names its function in `tool_name`."""

    role: str
    content: str | None = None
    images: list[Any] | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    thinking: str | None = None


class _OllamaBody(_Body):
    model: str | None = None
    stream: bool | None = None  # Ollama streams unless told `false`
    format: Any = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class OllamaChatRequest(_OllamaBody):
    """Body of `POST /api/chat`; no messages is a load request."""

    messages: list[OllamaMessage] | None = None
    tools: Any = None


class OllamaGenerateRequest(_OllamaBody):
    """Body of `POST /api/generate`; an empty prompt (without suffix) is a load request."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[Any] | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None


class OllamaShowRequest(_Body):
    """Body of `POST /api/show`: `model` (or the older `name`, which Continue sends)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None


async def parse_body(request: Request, model: type[B]) -> B:
    """The request's JSON body as `model`, whatever its `Content-Type` says: Ollama reads
    the body as JSON regardless, and its documented examples post with `curl -d`, which
    says form data. Raises APIError 400 `missing request body` (Ollama's words) for an
    empty body; malformed JSON or fields are 400s through the validation handler."""
    raw = await request.body()
    if not raw.strip():
        raise bad_request("missing request body")
    try:  # Python's parser, as FastAPI's: a lone surrogate then gets its own clear 400
        data = json.loads(raw)
    except ValueError as exc:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                       "msg": f"JSON decode error: {exc}"}]) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
        raise RequestValidationError(errors) from None


def _typed(key: str, value: Any) -> Any:
    """`value` checked against the option's type (Ollama's `Options.FromMap` wording)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key in INT_OPTIONS:
        if not number or not math.isfinite(value):
            raise bad_request(f'option "{key}" must be of type integer', "options")
        return int(value)
    if key in FLOAT_OPTIONS:
        if not number or not math.isfinite(value):
            raise bad_request(f'option "{key}" must be of type float32', "options")
        return float(value)
    if key in BOOL_OPTIONS:
        if not isinstance(value, bool):
            raise bad_request(f'option "{key}" must be of type boolean', "options")
        return value
    if key == "stop":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            raise bad_request('option "stop" must be of type array', "options")
        if not all(isinstance(s, str) for s in value):
            raise bad_request('option "stop" must be of an array of strings', "options")
        return value
    return value


def sampling_options(options: dict[str, Any] | None) -> tuple[SamplingFields, int | None]:
    """Ollama `options` as tandem's sampling fields and the reply's token limit (None: until
    EOS or the context's end). Raises APIError 400 for a wrongly typed value, an option
    tandem cannot apply (see the module docstring) or a `num_predict` of 0 or below -2."""
    opts: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if value is None:
            continue
        if key not in (*INT_OPTIONS, *FLOAT_OPTIONS, *BOOL_OPTIONS, "stop"):
            log.warning("ollama: ignored an unknown option %r", key)
            continue
        opts[key] = _typed(key, value)
    for key, off in NEUTRAL.items():
        if key in opts and opts[key] != off:
            raise bad_request(f'option "{key}" is not supported: tandem has no such sampler '
                              f"(send {off:g} or leave it out)", "options")
    last_n = opts.get("repeat_last_n")
    if last_n is not None and last_n < -1:
        raise bad_request('option "repeat_last_n" must be -1 (the whole history), 0 (off) or '
                          "a number of tokens", "options")
    if (opts.get("presence_penalty", 0.0) or opts.get("frequency_penalty", 0.0)) and (
            last_n not in (None, -1)):
        raise bad_request('option "repeat_last_n" applies to repeat_penalty only: tandem '
                          "applies presence_penalty and frequency_penalty over the whole "
                          "reply (send -1 or leave it out)", "options")
    limit = opts.get("num_predict")
    if limit is not None and limit < 1 and limit not in (-1, -2):
        raise bad_request('option "num_predict" must be a positive number of tokens, or -1 '
                          "(until the end of the reply)", "options")
    seed = opts.get("seed")
    fields = SamplingFields.model_construct(
        temperature=opts.get("temperature"), top_p=opts.get("top_p"),
        top_k=opts.get("top_k"), min_p=opts.get("min_p"),
        seed=seed if seed is None or seed >= 0 else None, stop=opts.get("stop"),
        num_ctx=opts.get("num_ctx"),
        repetition_penalty=opts.get("repeat_penalty"), repeat_last_n=last_n,
        presence_penalty=opts.get("presence_penalty"),
        frequency_penalty=opts.get("frequency_penalty"))
    return fields, (limit if limit is not None and limit > 0 else None)


MIN_NUM_CTX = 4  # Ollama's floor (server/sched.go: `if opts.NumCtx < 4`)


def ollama_context(num_ctx: int | None, served: int) -> int | None:
    """The context one Ollama request's sequence may hold: `options.num_ctx` floored at 4
    and capped at the `served` context (see the module docstring); None when the request
    sends none or asks for the served context or more (the served context applies)."""
    if num_ctx is None:
        return None
    limit = max(MIN_NUM_CTX, num_ctx)
    return limit if limit < served else None


def response_format(value: Any) -> Any:
    """Ollama's `format` as OpenAI's `response_format`: `"json"` -> any JSON object, a JSON
    schema object -> that schema, `""` or null -> none. Raises APIError 400 otherwise."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}
    raise bad_request(f'invalid format: expected "json" or a JSON schema, got '
                      f"{json.dumps(value)}", "format")


def check_common(body: _OllamaBody) -> float | None | str:
    """Refusals shared by chat and generate: `truncate` / `shift` true (tandem never drops
    history or shifts the context: a prompt that does not fit is a 400, a reply that
    reaches the context's end stops with `done_reason: "length"`), `logprobs`, and a
    malformed `keep_alive`. `think` is accepted and ignored (no reasoning model is served
    with a thinking mode). Returns `keep_alive` parsed (`model_pool.keep_alive_seconds`:
    a server with a model pool applies it, a one-model server keeps its model loaded)."""
    keep_alive = keep_alive_seconds(body.keep_alive)
    for name in ("truncate", "shift"):
        if getattr(body, name):
            raise bad_request(f"'{name}: true' is not supported: tandem never truncates the "
                              "history or shifts the context (send false or leave it out); "
                              "a prompt that does not fit is refused", name)
    if body.logprobs or body.top_logprobs:
        raise bad_request("'logprobs' is not supported on the Ollama API yet; use "
                          "/v1/chat/completions with logprobs", "logprobs")
    return keep_alive


def refuse_images(images: list[Any] | None, model: str, param: str) -> None:
    """400 for any image: the served model reads text only."""
    if images:
        raise bad_request(f"images are not supported: model '{model}' reads text only",
                          param)
