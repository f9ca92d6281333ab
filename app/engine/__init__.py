"""Backend-free engine core: requests, KV blocks, scheduler, sampling, detokenizer, step loop."""

from app.engine.async_engine import AsyncEngine, RequestStream
from app.engine.types import (
    EngineError,
    EngineOverloadedError,
    EngineStats,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)

__all__ = [
    "AsyncEngine",
    "EngineError",
    "EngineOverloadedError",
    "EngineStats",
    "PromptTooLongError",
    "RequestMetrics",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "TokenLogprob",
]
