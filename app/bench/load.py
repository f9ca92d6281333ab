"""The in-process request driver the benchmarks share: forced-length greedy requests on an
`AsyncEngine`, with the client-side arrival time of every token."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from app.engine import SamplingParams
from app.engine.types import RequestMetrics


@dataclass(slots=True)
class Trace:
    """One request as the caller saw it. Times are `time.perf_counter()` seconds."""

    start: float  # when the request was submitted
    token_times: list[float]  # arrival of each output token (a multi-token output repeats)
    metrics: RequestMetrics  # the engine's own counters and timings

    @property
    def ttft(self) -> float | None:
        """Submit to first token, seconds (None if no token came)."""
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (None below 2 tokens)."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None


def forced_params(max_tokens: int) -> SamplingParams:
    """Greedy, exactly `max_tokens` output tokens (EOS ignored)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def run_request(engine, prompt: list[int], max_tokens: int) -> Trace:
    """Generate `max_tokens` tokens (greedy, EOS ignored) after the token ids `prompt`.
    Raises what `engine.generate` raises."""
    times: list[float] = []
    metrics = None
    start = time.perf_counter()
    async for out in engine.generate(prompt, forced_params(max_tokens)):
        times.extend([time.perf_counter()] * len(out.token_ids))
        metrics = out.metrics if out.metrics is not None else metrics
    return Trace(start, times, metrics)


async def run_requests(engine, prompts: list[list[int]], max_tokens: int,
                       concurrency: int | None = None) -> list[Trace]:
    """`run_request` for each prompt, at most `concurrency` in flight (None: all at once);
    traces in prompt order (the first `concurrency` are the first wave)."""
    if concurrency is None:
        return list(await asyncio.gather(*(run_request(engine, p, max_tokens) for p in prompts)))
    sem = asyncio.Semaphore(concurrency)

    async def limited(prompt: list[int]) -> Trace:
        async with sem:
            return await run_request(engine, prompt, max_tokens)

    return list(await asyncio.gather(*(limited(p) for p in prompts)))
