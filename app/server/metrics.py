"""Prometheus metrics of one server (prometheus-client, one `CollectorRegistry` per app).

Two sources:
- per-request observations the HTTP layer makes when a sequence finishes: TTFT, TPOT and
  end-to-end latency histograms (seconds), finished sequences by finish reason, HTTP
  responses by path and status;
- an engine collector that reads `engine.stats()` at scrape time: running/waiting/remote-
  prefilling requests, sequence slots total/used, KV blocks total/used/free, host memory of
  saved prefixes, and the engine's cumulative prompt, generation and prefix-cache
  hit token counters. Nothing is polled in the background;
- a constrained-decoding collector: constrained requests, grammar mask time, forced-token
  drafts and their acceptance (`app.server.constrain_metrics`);
- a speculative-decoding collector reading the engine's speculator stats at scrape time
  (`tandem_spec_*`, see `app.server.spec_metrics`);
- a router collector: per served model, under vLLM's names (`vllm:num_requests_running`,
  `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, ...) and `tandem_kv_cache_usage_ratio`,
  what load-balancing routers read (`app.server.router_metrics`);
- two-box mode, per finished sequence with a prefill peer configured: where its prompt was
  prefilled and why, remote prefills that fell back by reason, KV bytes and tokens
  received (`tandem_prefill_route`, `tandem_remote_prefill_*`).

Names are `tandem_*` (the router collector's `vllm:*` aside), units in the name (`_seconds`, `_tokens`), as Prometheus advises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from app.engine.types import RequestMetrics
from app.server.constrain_metrics import ConstrainCollector
from app.server.router_metrics import RouterCollector
from app.server.spec_metrics import SpecCollector

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

KNOWN_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}
)


class _EngineCollector(Collector):
    """Reads `engine.stats()` (an `EngineStats`) on every scrape."""

    def __init__(self, engine: Any):
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        s = self._engine.stats()
        yield GaugeMetricFamily(
            "tandem_requests_running", "Sequences in the running batch.", value=s.running
        )
        yield GaugeMetricFamily(
            "tandem_requests_waiting", "Sequences admitted but waiting.", value=s.waiting
        )
        yield GaugeMetricFamily(
            "tandem_requests_remote_prefilling",
            "Sequences waiting for the prefill peer's KV (two-box mode).",
            value=s.remote_prefilling,
        )
        yield GaugeMetricFamily(
            "tandem_slots_total", "The runner's sequence slots.", value=s.slots_total
        )
        yield GaugeMetricFamily(
            "tandem_slots_used", "Sequence slots held by live sequences.", value=s.slots_used
        )
        yield GaugeMetricFamily(
            "tandem_kv_blocks_total", "KV cache capacity in blocks.", value=s.kv_blocks_total
        )
        yield GaugeMetricFamily(
            "tandem_kv_blocks_used",
            "KV blocks held by live sequences.",
            value=s.kv_blocks_used,
        )
        yield GaugeMetricFamily(
            "tandem_kv_blocks_free",
            "KV blocks not held by live sequences (cached-but-evictable included).",
            value=s.kv_blocks_total - s.kv_blocks_used,
        )
        yield GaugeMetricFamily(
            "tandem_kv_saved_bytes",
            "Host memory holding cached prefixes that no running sequence holds (llama.cpp; "
            "bounded by the KV cache's size: evicted with their blocks).",
            value=s.kv_saved_bytes,
        )
        yield CounterMetricFamily(
            "tandem_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache.",
            value=s.prefix_cache_hit_tokens,
        )
        yield CounterMetricFamily(
            "tandem_prompt_tokens", "Prompt tokens received.", value=s.prompt_tokens_total
        )
        yield CounterMetricFamily(
            "tandem_generation_tokens", "Tokens generated.", value=s.generation_tokens_total
        )
        yield CounterMetricFamily(
            "tandem_engine_requests_finished",
            "Sequences the engine finished (any reason).",
            value=s.requests_finished,
        )


class ServerMetrics:
    """The metrics of one app; `render()` gives the Prometheus text exposition."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: Any,
                 models: Callable[[], Iterable[tuple[str, Any]]] | None = None):
        """`models()`: (model name, engine) of every model served, read at each scrape
        (default: `engine` under its `model_name`)."""
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.registry.register(RouterCollector(
            models or (lambda: [(str(getattr(engine, "model_name", "")), engine)])))
        self.registry.register(SpecCollector(engine))
        self.registry.register(ConstrainCollector(engine))
        self.http_responses = Counter(
            "tandem_http_requests",
            "HTTP responses by path and status code.",
            ["path", "status"],
            registry=self.registry,
        )
        self.finished = Counter(
            "tandem_requests_finished",
            "Sequences served over HTTP that finished, by finish reason.",
            ["finish_reason"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "tandem_time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "tandem_time_per_output_token_seconds",
            "Mean time per output token after the first, per sequence.",
            buckets=TPOT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "tandem_e2e_request_latency_seconds",
            "Time from arrival to the last token, per sequence.",
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )

        self.prefill_route = Counter(
            "tandem_prefill_route",
            "Prompts by where they were prefilled (two-box mode) and why: remote, local (the "
            "policy's reason), or fallback (remote failed and local finished it; the failure).",
            ["route", "reason"],
            registry=self.registry,
        )
        self.remote_fallbacks = Counter(
            "tandem_remote_prefill_fallbacks",
            "Remote prefills that failed and were finished locally, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.remote_bytes = Counter(
            "tandem_remote_prefill_kv_bytes", "KV bytes received from the prefill peer.",
            registry=self.registry,
        )
        self.remote_tokens = Counter(
            "tandem_remote_prefill_imported_tokens",
            "Prompt tokens whose KV was imported from the prefill peer.",
            registry=self.registry,
        )

    def observe_finished(self, finish_reason: str | None, m: RequestMetrics | None) -> None:
        """Record one finished sequence (its timings come from the engine's metrics)."""
        self.finished.labels(finish_reason or "unknown").inc()
        if m is None:
            return
        if m.remote_prefill is not None:
            self._observe_route(m.remote_prefill)
        if m.ttft is not None:
            self.ttft.observe(max(m.ttft, 0.0))
        if m.tpot is not None:
            self.tpot.observe(max(m.tpot, 0.0))
        if m.finish_time is not None:
            self.e2e.observe(max(m.finish_time - m.arrival_time, 0.0))

    def _observe_route(self, route: dict) -> None:
        if "failure" in route:
            self.prefill_route.labels("fallback", route["failure"]).inc()
            self.remote_fallbacks.labels(route["failure"]).inc()
        else:
            self.prefill_route.labels("remote" if route["remote"] else "local",
                                      route["reason"]).inc()
        self.remote_bytes.inc(route.get("bytes", 0))
        self.remote_tokens.inc(route.get("imported_tokens", 0))

    def observe_response(self, path: str, status: int) -> None:
        self.http_responses.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
