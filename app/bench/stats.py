"""Summary arithmetic the benchmarks share: percentiles, medians, decode rates, ratios."""

from __future__ import annotations

import statistics

import numpy as np


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """`{"p50", "p99"}` of `values` (seconds) times `scale` (default: milliseconds), rounded to
    2 decimals; both None if `values` is empty."""
    if not values:
        return {"p50": None, "p99": None}
    arr = np.asarray(values) * scale
    return {"p50": round(float(np.percentile(arr, 50)), 2),
            "p99": round(float(np.percentile(arr, 99)), 2)}


def median(values: list[float], digits: int | None = 2) -> float:
    """Median of `values`, rounded to `digits` decimals (None: unrounded). Raises
    statistics.StatisticsError if `values` is empty."""
    m = float(statistics.median(values))
    return m if digits is None else round(m, digits)


def ratio(ours: float, base: float, digits: int = 3) -> float | None:
    """`ours / base` rounded to `digits` decimals; None when `base` is 0 or None."""
    return round(ours / base, digits) if base else None


def decode_rate(n_tokens: int, first: float, last: float) -> float:
    """Decode tokens/s of one request: `(n_tokens - 1) / (last - first)`, times in seconds of
    its first and last token, so prefill is excluded; 0.0 for fewer than 2 tokens."""
    return (n_tokens - 1) / (last - first) if n_tokens > 1 and last > first else 0.0


def steady_decode_rate(arrivals: list[list[float]]) -> float | None:
    """Aggregate decode tokens/s while all of the first wave of requests are decoding.

    `arrivals[i]` are the perf_counter times of request i's tokens. The window runs from the
    last first token (every prompt is prefilled) to the first last token (none has finished),
    so prefill chunks of other requests are outside it. None if the window is empty.
    """
    if not arrivals or any(len(a) < 2 for a in arrivals):
        return None
    start = max(a[0] for a in arrivals)
    end = min(a[-1] for a in arrivals)
    if end <= start:
        return None
    tokens = sum(sum(1 for t in a if start < t <= end) for a in arrivals)
    return round(tokens / (end - start), 2)
