"""The router-facing series of /metrics (vLLM's names, label `model_name`), exact values from
an engine snapshot: KV usage as a 0-1 fraction, running (batch + remote prefill) and waiting,
and what production-stack's own scraper parses out of the text."""

from prometheus_client.parser import text_string_to_metric_families

from app.engine.types import EngineStats
from app.server.metrics import ServerMetrics


class _Engine:
    model_name = "smol"

    def __init__(self, stats: EngineStats, kv_type: str = "f16"):
        self._stats = stats
        self._kv_type = kv_type

    def stats(self) -> EngineStats:
        return self._stats

    def describe(self) -> dict:
        return {"block_size": 16, "kv_cache_type": self._kv_type}


BUSY = EngineStats(running=3, waiting=2, kv_blocks_total=512, kv_blocks_used=128,
                   prefix_cache_hit_tokens=40, prompt_tokens_total=100,
                   generation_tokens_total=7, requests_finished=1, remote_prefilling=1)


def _lines(metrics: ServerMetrics, *prefixes: str) -> list[str]:
    return [line for line in metrics.render().decode().splitlines()
            if line.startswith(prefixes) and "_created" not in line]


def test_vllm_names_per_model():
    idle = EngineStats(0, 0, 0, 0, 0, 0, 0, 0)
    models = [("smol", _Engine(BUSY)), ("coder", _Engine(idle, "q8_0"))]
    metrics = ServerMetrics(models[0][1], models=lambda: models)
    assert _lines(metrics, "vllm:", "tandem_kv_cache_usage_ratio") == [
        'vllm:num_requests_running{model_name="smol"} 4.0',
        'vllm:num_requests_running{model_name="coder"} 0.0',
        'vllm:num_requests_waiting{model_name="smol"} 2.0',
        'vllm:num_requests_waiting{model_name="coder"} 0.0',
        'vllm:kv_cache_usage_perc{model_name="smol"} 0.25',
        'vllm:kv_cache_usage_perc{model_name="coder"} 0.0',
        'vllm:gpu_cache_usage_perc{model_name="smol"} 0.25',
        'vllm:gpu_cache_usage_perc{model_name="coder"} 0.0',
        'tandem_kv_cache_usage_ratio{model_name="smol"} 0.25',
        'tandem_kv_cache_usage_ratio{model_name="coder"} 0.0',
        'vllm:prefix_cache_queries_total{model_name="smol"} 100.0',
        'vllm:prefix_cache_queries_total{model_name="coder"} 0.0',
        'vllm:prefix_cache_hits_total{model_name="smol"} 40.0',
        'vllm:prefix_cache_hits_total{model_name="coder"} 0.0',
        'vllm:gpu_prefix_cache_queries_total{model_name="smol"} 100.0',
        'vllm:gpu_prefix_cache_queries_total{model_name="coder"} 0.0',
        'vllm:gpu_prefix_cache_hits_total{model_name="smol"} 40.0',
        'vllm:gpu_prefix_cache_hits_total{model_name="coder"} 0.0',
        'vllm:cache_config_info{block_size="16",cache_dtype="f16",enable_prefix_caching="True",'
        'model_name="smol",num_gpu_blocks="512"} 1.0',
        'vllm:cache_config_info{block_size="16",cache_dtype="q8_0",enable_prefix_caching="True",'
        'model_name="coder",num_gpu_blocks="0"} 1.0',
    ]


def test_default_model_is_the_engine():
    assert _lines(ServerMetrics(_Engine(BUSY)), "vllm:kv_cache_usage_perc") == [
        'vllm:kv_cache_usage_perc{model_name="smol"} 0.25']


def test_production_stack_parse():
    """The samples production-stack's `EngineStats.from_vllm_scrape` looks up by name."""
    text = ServerMetrics(_Engine(BUSY)).render().decode()
    wanted = {"vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits_total",
              "vllm:gpu_prefix_cache_queries_total"}
    got = {s.name: s.value for f in text_string_to_metric_families(text)
           for s in f.samples if s.name in wanted}
    assert got == {"vllm:num_requests_running": 4, "vllm:num_requests_waiting": 2,
                   "vllm:gpu_cache_usage_perc": 0.25, "vllm:gpu_prefix_cache_hits_total": 40,
                   "vllm:gpu_prefix_cache_queries_total": 100}
