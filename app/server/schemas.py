"""Request bodies of the OpenAI-compatible endpoints (pydantic v2).

Unknown fields are ignored and logged once (`_Body`); `null` means "use the
default" for every optional field, because many clients send every field. Range checks here
follow OpenAI's documented limits where a local server has no reason to differ; failures become
400 `invalid_request_error` responses (see `app.server.errors`).

Extensions beyond OpenAI, as llama-server and vLLM accept them: `top_k`, `min_p`,
`repetition_penalty`, `repeat_last_n` (llama-server's name: the tokens the repetition penalty
looks back over, -1 all, 0 none, default the model's, 64), `ignore_eos`. tandem's own:
`speculative` and `num_ctx` (see `SamplingFields`).

What a client's mistake gets (each a 400 `invalid_request_error` naming the field):
- text that is not well-formed Unicode: a JSON `\\ud800`-style escape of half a UTF-16
  surrogate pair, in any string of any field, at any depth (invalid UTF-8 bytes in the body
  are refused before parsing, see `app.server.errors`);
- numbers a field cannot hold: integers outside 64 bits (`seed` is an int64, as in vLLM),
  NaN or infinity in any float field, values outside the documented ranges below.
Documented clamps instead of errors: `max_tokens` / `max_completion_tokens` larger than the
room left in the context window are cut to that room (the reply then ends with
`finish_reason: "length"`, as llama-server does); `top_k` at or above the vocabulary size,
or <= 0, disables top-k.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator
from pydantic_core import PydanticCustomError

log = logging.getLogger("tandem.server")

MAX_STOP_STRINGS = 4
MAX_N = 64
MAX_TOP_LOGPROBS = 20
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100..100

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TokenCount = Annotated[int, Field(ge=1, le=INT64_MAX)]

UNICODE_ERROR = "unicode_surrogate"  # pydantic error type; `ctx["where"]`: path in the field
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any) -> tuple[str, str, int] | None:
    """The first string in `value` (nested lists and dicts, keys included) holding a UTF-16
    surrogate code point: (path below `value` like "[0].text", the code point escaped as
    `\\udXXX`, its index in the string)."""
    if isinstance(value, str):
        m = _SURROGATE.search(value)
        return None if m is None else ("", f"\\u{ord(m.group()):04x}", m.start())
    items = (enumerate(value) if isinstance(value, list)
             else value.items() if isinstance(value, dict) else ())
    for key, item in items:
        found = _lone_surrogate(key) if isinstance(key, str) else None
        found = found or _lone_surrogate(item)
        if found:
            step = f"[{key}]" if isinstance(key, int) else "." + ascii(key)[1:-1]
            return (step + found[0], found[1], found[2])
    return None


_warned: set[tuple[str, str]] = set()  # (body class, field) already logged


class _Body(BaseModel):
    """A request body: unknown fields are ignored, as vLLM and llama-server ignore them
    (clients send fields of newer API versions), and each (body, field) pair is logged
    once at warning level, so a misspelled field (`stop_sequence`) does not pass unseen."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _log_unknown_fields(cls, value: Any) -> Any:
        if isinstance(value, dict):
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values()
                                             if f.alias}
            for key in value.keys() - known:
                if isinstance(key, str) and (cls.__name__, key) not in _warned:
                    _warned.add((cls.__name__, key))
                    log.warning("ignored the unknown field %r of a %s (not applied; is it "
                                "spelled right?)", key[:80], cls.__name__)
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _well_formed_unicode(cls, value: Any) -> Any:
        """Refuse any string, at any depth, with a lone surrogate: it cannot be encoded as
        UTF-8, so no tokenizer can take it (Python's json accepts `\\ud800` escapes)."""
        if isinstance(value, (str, list, dict)) and (found := _lone_surrogate(value)):
            where, char, index = found
            raise PydanticCustomError(
                UNICODE_ERROR,
                "the text is not well-formed Unicode: it holds the lone surrogate {char} at "
                "index {index} (half of a UTF-16 pair; send valid UTF-8)",
                {"where": where, "char": char, "index": index},
            )
        return value


class StreamOptions(_Body):
    include_usage: bool | None = None


class ContentPart(_Body):
    """One part of a message's content; only `{"type": "text", "text": ...}` is served."""

    type: str
    text: str | None = None


class ChatMessage(_Body):
    """A chat message: `content` is a string, a list of text parts, or null (assistant)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]  # OpenAI's roles
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: Any = None  # an assistant's calls; checked by app.server.tools
    tool_call_id: str | None = None  # a tool message's answer to this call


class SamplingFields(_Body):
    """Fields shared by chat and legacy completions.

    `prediction` is OpenAI's Predicted Outputs, `{"type": "content", "content": str | [{"type":
    "text", "text": str}, ...]}`: text the reply is expected to repeat (a file being edited),
    used as the draft source of speculative decoding; it never changes the reply, only its
    speed. Validated by `app.server.prediction` (400, param "prediction"); accepted on
    `/v1/completions` too. `usage.completion_tokens_details` reports how many predicted tokens
    were accepted and rejected.

    `speculative` (tandem extension, default true; null = default): false opts this request
    out of speculative decoding (no drafts, neither from `prediction` nor n-gram lookup),
    e.g. to measure plain decoding. The reply is the same either way.

    `num_ctx` (tandem extension, Ollama's name; null = the served context): the most tokens
    this request's sequence holds, prompt and reply together. A prompt that fills it is a
    400 `context_length_exceeded`; the reply ends with `finish_reason: "length"` when
    prompt + reply reach it. Larger than the served context (`--ctx-size`): 400, the model
    is not reloaded (`app.server.generation.request_context`).

    `logit_bias` is OpenAI's: {token id (a JSON object key): bias in [-100, 100]}, added to
    the token's logit before sampling, for this request only; ids outside the vocabulary
    are a 400 (checked by `app.server.generation.sampling_params`).

    `response_format` is OpenAI's structured outputs (`text`, `json_object`, `json_schema`),
    enforced by the engine's grammar masks; see `app.server.response_format`. `tools`,
    `tool_choice` and `parallel_tool_calls` are served on chat (`app.server.tools`) and
    refused on legacy completions; `functions` and `function_call` are refused (400).
    """

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None  # OpenAI's range
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Int64 | None = None  # <= 0 disables, as in llama.cpp and vLLM (-1)
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    max_tokens: TokenCount | None = None
    # JSON object keys are strings: the token ids are parsed from them (strict elsewhere)
    logit_bias: dict[Annotated[int, Strict(False)], Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool | None = None
    prediction: Any = None  # checked by app.server.prediction, for OpenAI's error wording
    speculative: bool | None = None
    num_ctx: TokenCount | None = None
    response_format: Any = None  # checked by app.server.response_format
    # tool calling: checked by app.server.tools (chat) or refused (completions)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
        return value

    def stop_list(self) -> list[str]:
        """`stop` as a list without empty strings."""
        if self.stop is None:
            return []
        items = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in items if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    """Body of `POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


class CompletionRequest(SamplingFields):
    """Body of `POST /v1/completions`: `prompt` is text, texts, token ids or lists of ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    suffix: str | None = None
