"""Prometheus counters of speculative decoding, read from the engine's speculator at scrape time.

Exposed (counters cumulative since the engine started; nothing at all when the engine
has no speculator, i.e. speculation is off or the runner cannot truncate exactly):
- `tandem_spec_drafts_total`: verifications of a sequence with at least one draft token;
- `tandem_spec_draft_tokens_total`: draft tokens verified by the target;
- `tandem_spec_accepted_tokens_total`: of those, accepted (drafts from `prediction` and from
  n-gram lookup alike; per-request prediction counts are in each response's usage);
- `tandem_spec_accepted_tokens_by_position_total{position="1".."K"}`: verifications whose
  draft position j was accepted (so position 1 >= position 2 >= ...); K = the draft cap;
- `tandem_spec_chosen_k_total{k="0".."K"}`: how often the controller gave a sequence that
  had a proposal k draft tokens (k=0: drafting would not pay this step);
- `tandem_spec_no_draft_total{reason=...}`: decode steps of a sequence that verified no
  draft, by why (`app.engine.spec_decode.speculator.NO_DRAFT_REASONS`: step_cost, no_gain,
  no_proposal, prediction_exhausted, prediction_lost, at_limit, opted_out, grammar; every
  reason exposed, zeros included). Every decode step of a sequence is a draft (counted in
  `chosen_k` with k >= 1) or one of these, so decode steps = sum over k >= 1 of chosen_k +
  sum of no_draft, less no_draft{reason="grammar"} (drafts the grammar cut after the
  controller chose them);
- with a suffix index (`app.engine.spec_decode.suffix`): gauges
  `tandem_spec_suffix_index_tokens` (earlier outputs' tokens it holds) and
  `tandem_spec_suffix_index_max_tokens` (its cap), and the counter
  `tandem_spec_suffix_index_evicted_outputs_total` (outputs taken out to stay under it).

The speculator's stats are written by the engine's step thread; the scrape copies them
(ints, a list, a dict) through `SpecStats.snapshot()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


def speculator_of(engine: Any) -> Any | None:
    """The `Speculator` behind an `AsyncEngine` (`engine.engine.speculator`), or None."""
    return getattr(getattr(engine, "engine", None), "speculator", None)


def spec_snapshot(engine: Any) -> dict[str, Any] | None:
    """The speculator's `stats.snapshot()` plus `max_k`, or None without a speculator.
    (`SpecStats` keeps fixed-size lists, so the copy is safe from another thread.)"""
    spec = speculator_of(engine)
    if spec is None:
        return None
    snap = dict(spec.stats.snapshot())
    snap["max_k"] = int(spec.max_k)
    return snap


class SpecCollector(Collector):
    """Yields the `tandem_spec_*` families (see the module docstring) on every scrape."""

    def __init__(self, engine: Any):
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        snap = spec_snapshot(self._engine)
        if snap is None:
            return
        yield CounterMetricFamily(
            "tandem_spec_drafts",
            "Verifications of a sequence with at least one draft token.",
            value=int(snap["drafts"]),
        )
        yield CounterMetricFamily(
            "tandem_spec_draft_tokens", "Draft tokens verified by the target.",
            value=int(snap["draft_tokens"]),
        )
        yield CounterMetricFamily(
            "tandem_spec_accepted_tokens", "Draft tokens the target accepted.",
            value=int(snap["accepted_tokens"]),
        )
        by_pos = CounterMetricFamily(
            "tandem_spec_accepted_tokens_by_position",
            "Verifications that accepted the draft token at this position (1-based).",
            labels=["position"],
        )
        for j, count in enumerate(snap["accepted_by_position"]):
            by_pos.add_metric([str(j + 1)], int(count))
        yield by_pos
        chosen = CounterMetricFamily(
            "tandem_spec_chosen_k",
            "Draft lengths the controller chose for sequences that had a proposal.",
            labels=["k"],
        )
        counts = {int(k): int(v) for k, v in snap["chosen_k"].items()}
        for k in range(max(snap["max_k"], *counts, 0) + 1):
            chosen.add_metric([str(k)], counts.get(k, 0))
        yield chosen
        no_draft = CounterMetricFamily(
            "tandem_spec_no_draft",
            "Decode steps of a sequence that verified no draft token, by reason.",
            labels=["reason"],
        )
        for reason, count in snap["no_draft"].items():
            no_draft.add_metric([reason], int(count))
        yield no_draft
        if "suffix_tokens" in snap:
            yield GaugeMetricFamily(
                "tandem_spec_suffix_index_tokens",
                "Tokens of earlier outputs held by the suffix index (drafts for later "
                "requests).", value=int(snap["suffix_tokens"]))
            yield GaugeMetricFamily(
                "tandem_spec_suffix_index_max_tokens",
                "The suffix index's memory cap, in tokens.",
                value=int(snap["suffix_max_tokens"]))
            yield CounterMetricFamily(
                "tandem_spec_suffix_index_evicted_outputs",
                "Outputs taken out of the suffix index to stay under its cap.",
                value=int(snap["suffix_evicted"]))
