"""Why a decode step drafted nothing: counted by reason on the speculator and the request,
exposed in /metrics, logged once per change, and said in `tandem run`'s stats line."""

import logging

from prometheus_client import CollectorRegistry, generate_latest

from app.commands.run import _summary
from app.engine.config import SpecConfig
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import REASONS, Speculator
from app.engine.types import RequestMetrics, SamplingParams
from app.server.spec_metrics import SpecCollector
from tests.unit.helpers import make, run_all

FLAT = StepTimeCurve({1: 1.0, 64: 1.01})
STEEP = StepTimeCurve({1: 1.0, 2: 5.0, 64: 320.0})  # no draft can pay
PROMPT = [10, 20, 30, 40]  # no n-gram repeats; the fake model answers 41, 42, ...


def run(curve, **params):
    """(no_draft by reason of the speculator, of the request, the output, the speculator):
    one greedy request of 6 tokens: the prefill's and 5 decode steps' (the last at the
    max_tokens limit)."""
    _, eng = make(budget=64)
    eng.speculator = spec = Speculator(SpecConfig(mode="auto"), curve, eng.context_length)
    p = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **params)
    eng.add_request("r", PROMPT, p)
    r = eng.scheduler.waiting[0]
    out = run_all(eng)["r"]
    counts = {k: v for k, v in spec.stats.snapshot()["no_draft"].items() if v}
    return counts, r.metrics.no_draft, out, spec


def test_a_steep_curve_is_the_step_cost(caplog):
    with caplog.at_level(logging.INFO, logger="tandem.spec"):
        counts, per_request, out, _ = run(STEEP)
    assert out == [41, 42, 43, 44, 45, 46]
    assert counts == per_request == {"step_cost": 4, "at_limit": 1}
    assert [r.getMessage().split(":")[1] for r in caplog.records] == [
        " no drafts (step_cost)", " no drafts (at_limit)"]  # once per change


def test_nothing_to_draft_from_is_no_proposal():
    counts, _, _, _ = run(FLAT)
    assert counts == {"no_proposal": 4, "at_limit": 1}


def test_a_prediction_used_up_is_prediction_exhausted():
    counts, _, out, spec = run(FLAT, prediction=[41, 42])
    # step 1 drafts 42 (accepted, bonus 43); steps 2 and 3 have nothing left to draft
    assert out == [41, 42, 43, 44, 45, 46]
    assert spec.stats.drafts == 1
    assert counts == {"prediction_exhausted": 2, "at_limit": 1}


def test_a_prediction_left_behind_is_prediction_lost():
    counts, _, _, spec = run(FLAT, prediction=[41, 99, 98, 97])
    # step 1 drafts 99, rejected (42); the reply never meets the prediction again
    assert spec.stats.drafts == 1
    assert counts == {"prediction_lost": 3, "at_limit": 1}


def test_opted_out():
    counts, _, _, _ = run(FLAT, speculative=False)
    assert counts == {"opted_out": 5}


class _Engine:
    def __init__(self, speculator):
        self.engine = type("E", (), {"speculator": speculator})()


def test_metrics_expose_every_reason():
    _, _, _, spec = run(STEEP)
    registry = CollectorRegistry()
    registry.register(SpecCollector(_Engine(spec)))
    lines = [line for line in generate_latest(registry).decode().splitlines()
             if line.startswith("tandem_spec_no_draft_total")]
    assert lines == [f'tandem_spec_no_draft_total{{reason="{r}"}} '
                     f'{ {"step_cost": 4, "at_limit": 1}.get(r, 0):.1f}' for r in REASONS]


def test_run_stats_line_says_why():
    m = RequestMetrics(prompt_tokens=4, completion_tokens=6,
                       no_draft={"at_limit": 1, "prediction_exhausted": 2})
    assert _summary(m, "length").endswith(
        "4 prompt + 6 generated tokens (length) · steps without drafts 3 "
        "(prediction exhausted 2, at limit 1)")
