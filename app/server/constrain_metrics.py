"""Prometheus metrics of constrained decoding, read from the engine at scrape time.

Exposed (cumulative since the engine started):
- `tandem_constrained_requests_total`: sequences added with a grammar (`response_format`
  json_object / json_schema; each of `n` choices counts);
- `tandem_grammar_mask_seconds` (histogram): grammar mask time per constrained sequence
  and step, fill and apply (a step's batched fill is shared out evenly among its
  sequences; `app.engine.constrain.pipeline.MaskStats`);
- `tandem_grammar_mask_fill_seconds_total`, `tandem_grammar_mask_apply_seconds_total`,
  `tandem_grammar_mask_wait_seconds_total`: fill time (on a worker thread, while the
  runner computes), apply time (on the step's critical path), and the part of the fills the
  step waited for after the runner returned;
- with a speculator: `tandem_spec_forced_draft_tokens_total` (draft tokens forced by a
  grammar, verified by the target) and `tandem_spec_forced_accepted_tokens_total`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from app.engine.constrain.pipeline import MASK_BUCKETS
from app.server.spec_metrics import spec_snapshot


def _core(engine: Any) -> Any | None:
    """The `LLMEngine` behind an `AsyncEngine`, or None (a fake engine)."""
    return getattr(engine, "engine", None)


class ConstrainCollector(Collector):
    """Yields the families above on every scrape; nothing for an engine without them."""

    def __init__(self, engine: Any):
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        core = _core(self._engine)
        stats = getattr(core, "mask_stats", None)
        if stats is None:
            return
        yield CounterMetricFamily(
            "tandem_constrained_requests", "Sequences decoded under a grammar.",
            value=int(core.constrained_requests))
        snap = stats.snapshot()
        cumulative, total = [], 0
        for bound, n in zip((*map(str, MASK_BUCKETS), "+Inf"), snap["buckets"], strict=True):
            total += n
            cumulative.append((bound, total))
        yield HistogramMetricFamily(
            "tandem_grammar_mask_seconds",
            "Grammar mask time (fill and apply) per constrained sequence and step.",
            buckets=cumulative, sum_value=snap["sum_s"])
        for what, key, help_text in (
                ("fill", "fill_s", "Seconds filling grammar masks (beside the runner)."),
                ("apply", "apply_s", "Seconds applying grammar masks to logits."),
                ("wait", "wait_s", "Seconds steps waited for mask fills after the runner.")):
            yield CounterMetricFamily(f"tandem_grammar_mask_{what}_seconds", help_text,
                                      value=float(snap[key]))
        spec = spec_snapshot(self._engine)
        if spec is not None:
            yield CounterMetricFamily(
                "tandem_spec_forced_draft_tokens",
                "Draft tokens forced by a grammar and verified by the target.",
                value=int(spec["forced_draft_tokens"]))
            yield CounterMetricFamily(
                "tandem_spec_forced_accepted_tokens",
                "Grammar-forced draft tokens the target accepted.",
                value=int(spec["forced_accepted_tokens"]))
