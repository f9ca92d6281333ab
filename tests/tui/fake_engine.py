"""A scripted stand-in for `app.engine.AsyncEngine` with the same API, for TUI tests.

Replies come from a script (list of strings, consumed in order) or, when it runs out, echo
the last user message. Tokens are characters; a reply streams one word per step. Timings in the final metrics
are fixed (TTFT 50 ms, 100 tok/s) so snapshots are deterministic. `hold()` pauses every
stream after its first token until `release()` or cancel, so tests can press Esc mid-reply.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass

from app.engine.types import (
    EngineStats,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
)

BLOCK_SIZE = 16
_WORD = re.compile(r"\s*\S+|\s+")


@dataclass(slots=True)
class FakeInfo:
    name: str
    n_ctx_train: int


class FakeTokenizer:
    """One token per character (id = code point), so a templated history always starts
    with the exact tokens of the earlier prompt + reply, as with a real BPE at turn edges."""

    bos_id = None
    eos_ids = {0}
    chat_template = None

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(i) for i in token_ids)


class FakeEngine:
    """Same surface as AsyncEngine: submit/stream/cancel, apply_chat_template, stats, shutdown."""

    backend_name = "fake"

    def __init__(
        self,
        replies: list[str] | None = None,
        *,
        model_name: str = "fake-135m",
        context_length: int = 4096,
        step_delay: float = 0.0,
    ):
        self.model_name = model_name
        self.context_length = context_length
        self.info = FakeInfo(model_name, context_length)
        self.tokenizer = FakeTokenizer()
        self.replies = list(replies or [])
        self.step_delay = step_delay
        self.submitted: list[tuple[list[dict], list[int], SamplingParams]] = []
        self.cancelled: list[str] = []
        self.closed = False
        self._held = False
        self._release = asyncio.Event()
        self._prompts: list[list[int]] = []
        self._ids = itertools.count(1)
        self._last_messages: list[dict] = []
        self._kv_tokens = 0

    # -- script control -------------------------------------------------------------------

    def hold(self) -> None:
        """Pause streams after their first token until `release()`."""
        self._held = True
        self._release = asyncio.Event()

    def release(self) -> None:
        self._held = False
        self._release.set()

    # -- AsyncEngine API ------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        self._last_messages = [dict(m) for m in messages]
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        if add_generation_prompt:
            text += "<assistant>"
        return self.tokenizer.encode(text)

    def encode_prompt(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None):
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(len(prompt_ids), self.context_length)
        self.submitted.append((self._last_messages, list(prompt_ids), params))
        cached = self._cached_prefix(prompt_ids)
        # The stream extends this record with its output: like a real prefix cache, the
        # reply's tokens are reusable by the next turn.
        self._prompts.append(list(prompt_ids))
        if self.replies:
            text = self.replies.pop(0)
        else:
            last_user = next(
                (m["content"] for m in reversed(self._last_messages) if m["role"] == "user"), ""
            )
            text = f"You said: {last_user}"
        return FakeStream(self, request_id or f"req-{next(self._ids)}", prompt_ids, params, text, cached)

    async def generate(self, prompt_ids: list[int], params: SamplingParams):
        stream = self.submit(prompt_ids, params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.cancel()

    def stats(self) -> EngineStats:
        used = -(-self._kv_tokens // BLOCK_SIZE)
        return EngineStats(
            running=0, waiting=0, kv_blocks_total=256, kv_blocks_used=used,
            prefix_cache_hit_tokens=0, prompt_tokens_total=0, generation_tokens_total=0,
            requests_finished=len(self._prompts),
        )

    def shutdown(self) -> None:
        self.closed = True

    def _cached_prefix(self, prompt: list[int]) -> int:
        """Full blocks shared with an earlier prompt, never the last prompt token."""
        best = 0
        for old in self._prompts:
            n = 0
            for a, b in zip(old, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        best = min(best, len(prompt) - 1)
        return best - best % BLOCK_SIZE


class FakeStream:
    """One request's stream: one word per step, then a final output with metrics."""

    def __init__(self, engine: FakeEngine, request_id: str, prompt: list[int],
                 params: SamplingParams, text: str, cached: int):
        self.request_id = request_id
        self._engine = engine
        self._prompt = prompt
        self._pieces = _WORD.findall(text)
        self._max = params.max_tokens
        self._cached = cached
        self._cancelled = asyncio.Event()

    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._engine.cancelled.append(self.request_id)
        self._cancelled.set()

    async def _wait(self, event: asyncio.Event, timeout: float | None) -> None:
        """Sleep up to `timeout` (None: forever), waking early on cancel or `event`."""
        waits = [asyncio.ensure_future(self._cancelled.wait()), asyncio.ensure_future(event.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def __aiter__(self):
        engine = self._engine
        pieces = self._pieces if self._max is None else self._pieces[: self._max]
        sent = 0
        for i, piece in enumerate(pieces):
            if self._cancelled.is_set():
                break
            if i == 1 and engine._held:
                await self._wait(engine._release, None)
                if self._cancelled.is_set():
                    break
            if engine.step_delay:
                await self._wait(asyncio.Event(), engine.step_delay)
            else:
                await asyncio.sleep(0)
            if self._cancelled.is_set():
                break
            sent += 1
            tokens = engine.tokenizer.encode(piece)
            engine._prompts[-1].extend(tokens)
            yield RequestOutput(self.request_id, piece, tokens)
        if self._cancelled.is_set():
            reason = "abort"
        elif len(pieces) < len(self._pieces):
            reason = "length"
        else:
            reason = "stop"
        completion = sum(len(p) for p in pieces[:sent])
        engine._kv_tokens = len(self._prompt) + completion
        # Fixed clock: TTFT 50 ms, 10 ms per later token (100 tok/s).
        metrics = RequestMetrics(
            prompt_tokens=len(self._prompt), completion_tokens=completion,
            cached_tokens=self._cached, arrival_time=100.0, first_scheduled_time=100.01,
            first_token_time=100.05, finish_time=100.05 + 0.01 * max(completion - 1, 0),
        )
        yield RequestOutput(self.request_id, "", [], finished=True, finish_reason=reason,
                            metrics=metrics)
