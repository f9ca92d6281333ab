"""Request bodies of the OpenAI-compatible endpoints (pydantic v2).

Unknown fields are ignored, as OpenAI does (`extra="ignore"`); `null` means "use the
default" for every optional field, because many clients send every field. Range checks here
follow OpenAI's documented limits where a local server has no reason to differ; failures become
400 `invalid_request_error` responses (see `app.server.errors`).

Extensions beyond OpenAI, as llama-server and vLLM accept them: `top_k`, `min_p`,
`repetition_penalty`, `ignore_eos`. tandem's own: `speculative` (see `SamplingFields`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 4
MAX_N = 64
MAX_TOP_LOGPROBS = 20


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


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
    """

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None  # OpenAI's range
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None  # <= 0 disables, as in llama.cpp and vLLM (-1)
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool | None = None
    prediction: Any = None  # checked by app.server.prediction, for OpenAI's error wording
    speculative: bool | None = None

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
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


class CompletionRequest(SamplingFields):
    """Body of `POST /v1/completions`: `prompt` is text, texts, token ids or lists of ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: str | None = None
