"""What load-balancing routers read from `/metrics`, per served model, under vLLM's names.

Routers in front of several inference servers pick one by scraping each server's Prometheus
endpoint; they look for vLLM's metric names, so tandem exports those too (same types, same
units, the `model_name` label vLLM puts on them), beside its own `tandem_*` names:

| series (label `model_name`) | type | meaning | read by |
|---|---|---|---|
| `vllm:num_requests_running` | gauge | sequences being served: in the running batch, or prefilling on a two-box peer | production-stack router, llm-d / Gateway API Inference Extension EPP |
| `vllm:num_requests_waiting` | gauge | sequences admitted but not yet running | production-stack, EPP (`TotalQueuedRequests`) |
| `vllm:kv_cache_usage_perc` | gauge | KV blocks held by live sequences / all KV blocks, a fraction 0-1 (vLLM v1's name) | EPP (`KVCacheUtilization`) |
| `vllm:gpu_cache_usage_perc` | gauge | the same fraction under vLLM v0's name | production-stack, older EPPs |
| `vllm:cache_config_info` | gauge, 1 | labels `block_size` (tokens), `num_gpu_blocks`, `cache_dtype`, `enable_prefix_caching` | EPP prefix-cache scorer (block size, capacity) |
| `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` | counters | prompt tokens looked up in / served from the prefix cache (vLLM v1) | dashboards |
| `vllm:gpu_prefix_cache_queries_total`, `vllm:gpu_prefix_cache_hits_total` | counters | the same under the names production-stack's scraper reads | production-stack |
| `tandem_kv_cache_usage_ratio` | gauge | the KV fraction under tandem's name | - |

Sources: vLLM's metrics design doc (v0 and v1 lists), production-stack
`src/vllm_router/stats/engine_stats.py` (`from_vllm_scrape`), Gateway API Inference Extension
`docs/proposals/003-model-server-protocol`. "Used" blocks exclude cached blocks no live
sequence holds (evictable), as vLLM counts them. A block pool of 0 blocks reports 0.
Everything is read from each engine's `stats()` snapshot at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# (model name, engine) of every model served right now
ModelsFn = Callable[[], Iterable[tuple[str, Any]]]


def kv_usage(stats: Any) -> float:
    """KV blocks held by live sequences over all KV blocks (0-1; 0 for an empty pool)."""
    total = int(stats.kv_blocks_total)
    return min(1.0, stats.kv_blocks_used / total) if total > 0 else 0.0


def _cache_config(engine: Any, stats: Any) -> dict[str, str]:
    describe = getattr(engine, "describe", None)
    info = describe() if callable(describe) else {}
    return {
        "block_size": str(info.get("block_size", getattr(engine, "block_size", ""))),
        "num_gpu_blocks": str(int(stats.kv_blocks_total)),
        "cache_dtype": str(info.get("kv_cache_type") or "f16"),
        "enable_prefix_caching": "True",
    }


class RouterCollector(Collector):
    """Yields the families of the module docstring for every model `models()` lists."""

    def __init__(self, models: ModelsFn):
        self._models = models

    def collect(self) -> Iterable[Metric]:
        label = ["model_name"]
        gauges = {
            "vllm:num_requests_running": "Sequences being served (running batch and remote "
                                         "prefill).",
            "vllm:num_requests_waiting": "Sequences admitted but waiting to run.",
            "vllm:kv_cache_usage_perc": "Fraction of KV cache blocks in use (0-1).",
            "vllm:gpu_cache_usage_perc": "Fraction of KV cache blocks in use (0-1); vLLM v0 "
                                         "name.",
            "tandem_kv_cache_usage_ratio": "Fraction of KV cache blocks held by live "
                                           "sequences (0-1).",
        }
        families = {name: GaugeMetricFamily(name, doc, labels=label)
                    for name, doc in gauges.items()}
        counters = {
            "vllm:prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
            "vllm:prefix_cache_hits": "Prompt tokens served from the prefix cache.",
            "vllm:gpu_prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
            "vllm:gpu_prefix_cache_hits": "Prompt tokens served from the prefix cache.",
        }
        families.update({name: CounterMetricFamily(name, doc, labels=label)
                         for name, doc in counters.items()})
        config = GaugeMetricFamily(
            "vllm:cache_config_info", "KV cache configuration (labels); value 1.",
            labels=["model_name", "block_size", "num_gpu_blocks", "cache_dtype",
                    "enable_prefix_caching"])
        for name, engine in self._models():
            s = engine.stats()
            usage = kv_usage(s)
            values = {
                "vllm:num_requests_running": s.running + getattr(s, "remote_prefilling", 0),
                "vllm:num_requests_waiting": s.waiting,
                "vllm:kv_cache_usage_perc": usage,
                "vllm:gpu_cache_usage_perc": usage,
                "tandem_kv_cache_usage_ratio": usage,
                "vllm:prefix_cache_queries": s.prompt_tokens_total,
                "vllm:prefix_cache_hits": s.prefix_cache_hit_tokens,
                "vllm:gpu_prefix_cache_queries": s.prompt_tokens_total,
                "vllm:gpu_prefix_cache_hits": s.prefix_cache_hit_tokens,
            }
            for key, value in values.items():
                families[key].add_metric([name], value)
            cfg = _cache_config(engine, s)
            config.add_metric([name, *cfg.values()], 1.0)
        yield from families.values()
        yield config
