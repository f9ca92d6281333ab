"""The seam between the chat UI and whatever produces replies.

`ChatClient` has two implementations: `EngineClient` (the in-process `AsyncEngine`,
`engine_client.py`) and `ServerClient` (any OpenAI-compatible HTTP server,
`server_client.py`). The app only sees this module's types, so it does not care which.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tui.chat_settings import ChatSettings

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


class ClientError(Exception):
    """A failure to show the user as text (model missing, server unreachable, overload)."""


class ContextFullError(ClientError):
    """The conversation no longer fits the model's context window."""

    def __init__(
        self,
        prompt_tokens: int | None = None,
        context_length: int | None = None,
        detail: str | None = None,
    ):
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        if detail is None:
            detail = (
                f"the conversation is {prompt_tokens} tokens and the model's window is "
                f"{context_length}"
            )
        super().__init__(f"Context full: {detail}.")


@dataclass(slots=True)
class ReplyStats:
    """Numbers about one reply for the status bar; times in seconds, rates in tokens/s.

    Fields a client cannot know stay None (an HTTP server may not report cached tokens).
    """

    ttft_s: float | None = None
    decode_tok_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    cached_tokens: int | None = None
    finish_reason: str | None = None
    draft_tokens: int | None = None  # speculative decoding: drafted, verified by the model
    accepted_tokens: int | None = None  # of those, accepted
    prefill_route: dict | None = None  # two-box mode: `RequestMetrics.remote_prefill`

    @property
    def context_tokens(self) -> int | None:
        """Tokens the conversation occupies after this reply (prompt + reply)."""
        if self.prompt_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


class ReplyStream(ABC):
    """One reply being generated: an async iterator of text chunks plus live counters.

    Subclasses implement `_chunks()` and `cancel()` and call `_count(n)` as tokens arrive;
    after iteration ends, `stats` holds the final numbers (`finish_reason` "abort" when
    cancelled).
    """

    def __init__(self, prompt_tokens: int | None = None):
        self.stats = ReplyStats(prompt_tokens=prompt_tokens)
        self._t_start = time.perf_counter()
        self._t_first: float | None = None
        self._t_last: float | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        return self._chunks()

    @abstractmethod
    def _chunks(self) -> AsyncIterator[str]:
        """Yield text chunks; fill `self.stats` before returning."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop generating (idempotent); iteration ends soon after with reason "abort"."""

    def _count(self, n_tokens: int) -> None:
        """Record `n_tokens` new tokens for the live TTFT and tok/s readings."""
        if n_tokens <= 0:
            return
        now = time.perf_counter()
        if self._t_first is None:
            self._t_first = now
            self.stats.ttft_s = now - self._t_start
        self._t_last = now
        self.stats.completion_tokens += n_tokens

    def prefill_progress(self) -> tuple[int, int] | None:
        """(prompt tokens computed, prompt tokens) while the prompt is being prefilled;
        None once the first token is out, or where the client cannot see it (a server)."""
        return None

    def live_decode_tok_s(self) -> float | None:
        """Decode rate so far, measured after the first token (None until two tokens)."""
        if self._t_first is None or self._t_last is None or self.stats.completion_tokens < 2:
            return None
        dt = self._t_last - self._t_first
        return (self.stats.completion_tokens - 1) / dt if dt > 0 else None


class ChatClient(ABC):
    """Produces chat replies. `load()` runs in a worker thread; the rest on the event loop."""

    kind: str = "?"  # shown in the status bar: "llamacpp", "mlx", "server", ...
    model_name: str = "?"
    context_length: int | None = None

    @abstractmethod
    def load(self) -> None:
        """Blocking: load the model or check the server. Raises ClientError on failure."""

    @abstractmethod
    def start_reply(self, messages: list[Message], settings: ChatSettings) -> ReplyStream:
        """Begin a reply to the full conversation `messages` (the client applies the chat
        template). Must be called on the event loop. Raises ContextFullError when the
        conversation is too long and ClientError for other refusals."""

    def available_models(self) -> list[str]:
        """Models `switch_model` accepts (the loaded one first)."""
        return [self.model_name]

    def switch_model(self, model: str) -> None:
        """Blocking (run in a worker thread): make `model` the one replies come from.
        On failure raise ClientError and keep the current model."""
        raise ClientError(f"{self.kind} cannot switch models")

    def count_tokens(self, messages: list[Message]) -> int | None:
        """Tokens `messages` take once templated, or None if the client cannot tell."""
        return None

    def kv_usage(self) -> tuple[int, int] | None:
        """(tokens held in the engine's KV cache, tokens it can hold), or None if not
        known."""
        return None

    def close(self) -> None:
        """Release the model or connection. Safe to call twice."""
        return None
