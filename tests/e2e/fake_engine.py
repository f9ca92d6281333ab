"""A small in-process stand-in for `AsyncEngine`, for server tests without a model.

Same public surface as the real engine (`submit`, streams with `cancel`, `stats`,
`apply_chat_template`, `encode_prompt`, `tokenizer`, `info`, `context_length`); tokens are
bytes (ids 0-255) plus BOS=256 and EOS=257, so a multi-byte character spans tokens. Greedy
output is a fixed text chosen by the prompt, sampled output is seeded random letters. Stop
strings are held back and never emitted; KV blocks (16 tokens) are counted per running
sequence; a prefix cache of full prompt blocks reports `cached_tokens`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from typing import Any

from app.engine.types import (
    EngineOverloadedError,
    EngineStats,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from backends.base import ModelInfo

BOS, EOS = 256, 257
GREEDY_TEXT = "Hello wörld, the quick brown fox jumps over the lazy dog; naïve café. "
BLOCK = 16


class FakeTokenizer:
    bos_id = BOS
    eos_ids = {EOS}
    chat_template = None

    def encode(
        self, text: str, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        return ([BOS] if add_special else []) + list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", "replace")


class FakeStream:
    def __init__(self, request_id: str):
        self.request_id = request_id
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.finished = False
        self._ended = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._ended:
            raise StopAsyncIteration
        out = await self.queue.get()
        if isinstance(out, BaseException):
            self._ended = True
            raise out
        if out.finished:
            self._ended = True
        return out

    def cancel(self) -> None:
        if not self.finished and self.task is not None:
            self.task.cancel()


class FakeEngine:
    """`AsyncEngine` look-alike; `step_s` is the simulated time per generated token."""

    backend_name = "fake"

    def __init__(
        self,
        context_length: int = 512,
        max_seqs: int = 32,
        max_waiting: int = 64,
        num_blocks: int = 1024,
        step_s: float = 0.003,
        fail_after: int | None = None,
    ):
        self.model_name = "fake-model"
        self.context_length = context_length
        self.tokenizer = FakeTokenizer()
        self.info = ModelInfo("fake-model", "fake", 1, 1, 8, 258, context_length)
        self.max_seqs = max_seqs
        self.max_waiting = max_waiting
        self.num_blocks = num_blocks
        self.step_s = step_s
        self.fail_after = fail_after  # tokens after which every stream fails (backend error)
        self._slots: asyncio.Semaphore | None = None
        self._ids = 0
        self.waiting = 0
        self.running = 0
        self.blocks_used = 0
        self._cache: set[bytes] = set()
        self._held: dict[str, int] = {}
        self._totals = {"hit": 0, "prompt": 0, "gen": 0, "finished": 0}

    # -- prompts -----------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "<|assistant|>"
        return [BOS, *self.tokenizer.encode(text)]

    def encode_prompt(self, text: str) -> list[int]:
        return [BOS, *self.tokenizer.encode(text)]

    # -- requests ----------------------------------------------------------------------------
    def submit(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> FakeStream:
        loop = asyncio.get_running_loop()
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(len(prompt_ids), self.context_length)
        if self.waiting >= self.max_waiting:
            raise EngineOverloadedError(f"{self.waiting} requests are waiting")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_seqs)
        self._ids += 1
        stream = FakeStream(request_id or f"req-{self._ids}")
        self.waiting += 1
        stream.task = loop.create_task(self._run(stream, list(prompt_ids), params))
        return stream

    def _cached_prefix(self, prompt: list[int]) -> int:
        h = b""
        hit = 0
        for start in range(0, len(prompt) - 1 - (len(prompt) - 1) % BLOCK, BLOCK):
            h = hashlib.sha1(h + bytes(str(prompt[start : start + BLOCK]), "ascii")).digest()
            if h not in self._cache:
                break
            hit = start + BLOCK
        return hit

    def _remember(self, prompt: list[int]) -> None:
        h = b""
        for start in range(0, len(prompt) - len(prompt) % BLOCK, BLOCK):
            h = hashlib.sha1(h + bytes(str(prompt[start : start + BLOCK]), "ascii")).digest()
            self._cache.add(h)

    async def _run(self, stream: FakeStream, prompt: list[int], p: SamplingParams) -> None:
        m = RequestMetrics(prompt_tokens=len(prompt), arrival_time=time.perf_counter())
        admitted = False
        assert self._slots is not None
        try:
            async with self._slots:
                self.waiting -= 1
                admitted = True
                self.running += 1
                m.first_scheduled_time = time.perf_counter()
                m.cached_tokens = self._cached_prefix(prompt)
                self._totals["hit"] += m.cached_tokens
                self._totals["prompt"] += len(prompt)
                self._hold(stream.request_id, math.ceil(len(prompt) / BLOCK))
                await asyncio.sleep(0.00005 * (len(prompt) - m.cached_tokens))
                self._remember(prompt)
                await self._generate(stream, prompt, p, m)
        except asyncio.CancelledError:
            self._finish(stream, m, "abort")
        finally:
            if not admitted:
                self.waiting -= 1
            else:
                self.running -= 1
            self.blocks_used -= self._held.pop(stream.request_id, 0)

    def _hold(self, request_id: str, blocks: int) -> None:
        """The sequence now needs `blocks` KV blocks in all."""
        have = self._held.get(request_id, 0)
        if blocks > have:
            self.blocks_used += blocks - have
            self._held[request_id] = blocks

    def _finish(self, stream: FakeStream, m: RequestMetrics, reason: str, text: str = "") -> None:
        if stream.finished:
            return
        stream.finished = True
        m.finish_time = time.perf_counter()
        self._totals["finished"] += 1
        stream.queue.put_nowait(RequestOutput(stream.request_id, text, [], True, reason, None, m))

    def _next_token(
        self, prompt: list[int], out: list[int], p: SamplingParams, rng: random.Random
    ) -> int:
        if p.temperature == 0:
            if len(out) >= 40 and not p.ignore_eos:
                return EOS
            data = GREEDY_TEXT.encode("utf-8")
            return data[(sum(prompt) + len(out)) % len(data)]
        if not p.ignore_eos and rng.random() < 0.01:
            return EOS
        return rng.choice(b"abcdefghij klmnop")

    async def _generate(
        self,
        stream: FakeStream,
        prompt: list[int],
        p: SamplingParams,
        m: RequestMetrics,
    ) -> None:
        rng = random.Random(p.seed)
        out: list[int] = []
        emitted = 0  # characters of decoded text already sent
        limit = self.context_length - len(prompt)
        max_tokens = limit if p.max_tokens is None else min(p.max_tokens, limit)
        max_stop = max((len(s) for s in p.stop), default=0)
        while True:
            await asyncio.sleep(self.step_s)
            tok = self._next_token(prompt, out, p, rng)
            if m.first_token_time is None:
                m.first_token_time = time.perf_counter()
            self._totals["gen"] += 1
            m.completion_tokens += 1
            if self.fail_after is not None and m.completion_tokens > self.fail_after:
                stream.finished = True
                stream.queue.put_nowait(RuntimeError("engine failed: simulated backend error"))
                return
            if tok == EOS:
                self._finish_text(stream, m, out, emitted, "stop", [tok], p)
                return
            out.append(tok)
            self._hold(stream.request_id, math.ceil((len(prompt) + len(out)) / BLOCK))
            raw = bytes(out)
            text = raw.decode("utf-8", "ignore") if raw[-1] < 0x80 else _complete_prefix(raw)
            cut = _find_stop(text, p.stop, max(0, emitted - max_stop))
            if cut is not None:
                self._finish_text(stream, m, out, emitted, "stop", [tok], p, text[:cut])
                return
            if len(out) >= max_tokens:
                self._finish_text(stream, m, out, emitted, "length", [tok], p, text)
                return
            safe = len(text) - _held_back(text, p.stop)
            new = text[emitted:safe] if safe > emitted else ""
            emitted = max(emitted, safe)
            stream.queue.put_nowait(
                RequestOutput(stream.request_id, new, [tok], False, None, self._lp([tok], p))
            )

    def _finish_text(
        self,
        stream: FakeStream,
        m: RequestMetrics,
        out: list[int],
        emitted: int,
        reason: str,
        toks: list[int],
        p: SamplingParams,
        text: str | None = None,
    ) -> None:
        if text is None:
            text = bytes(out).decode("utf-8", "replace")
        stream.finished = True
        m.finish_time = time.perf_counter()
        self._totals["finished"] += 1
        stream.queue.put_nowait(
            RequestOutput(
                stream.request_id, text[emitted:], toks, True, reason, self._lp(toks, p), m
            )
        )

    def _lp(self, toks: list[int], p: SamplingParams) -> list[TokenLogprob] | None:
        if p.logprobs is None:
            return None
        result = []
        for t in toks:
            text = self.tokenizer.decode([t])
            top = [(t, text, -0.25)] + [
                (a, self.tokenizer.decode([a]), -2.0 - i)
                for i, a in enumerate(b"xyz"[: max(0, p.logprobs - 1)])
            ]
            result.append(TokenLogprob(t, text, -0.25, top[: p.logprobs]))
        return result

    def stats(self) -> EngineStats:
        return EngineStats(
            running=self.running,
            waiting=self.waiting,
            kv_blocks_total=self.num_blocks,
            kv_blocks_used=self.blocks_used,
            prefix_cache_hit_tokens=self._totals["hit"],
            prompt_tokens_total=self._totals["prompt"],
            generation_tokens_total=self._totals["gen"],
            requests_finished=self._totals["finished"],
        )

    def shutdown(self) -> None:
        pass


def _complete_prefix(raw: bytes) -> str:
    """Decode the longest prefix of `raw` that ends on a complete UTF-8 character."""
    for cut in range(len(raw), max(len(raw) - 4, -1), -1):
        try:
            return raw[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", "ignore")


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    hits = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                best = max(best, k)
                break
    return best


def fake_engine(**kwargs: Any) -> FakeEngine:
    return FakeEngine(**kwargs)
