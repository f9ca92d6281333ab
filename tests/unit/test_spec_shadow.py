"""Shadow drafts: drafts the controller declines are scored against the tokens the
sequence then emits, so a kind of draft whose prior does not pay on a steep curve can still
be found to pay (`Speculator._score_shadow`)."""

from app.engine.config import SpecConfig
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from tests.unit.helpers import MEASURED_CPU, make, run_all

# Qwen2.5-Coder-1.5B Q4_K_M's profile on this project's CPU (repacked weights): drafts at the
# prediction prior (0.9 a token) gain under the 5% margin; at 0.95 three of them pay (1.10x)
QWEN_Q4_K_M = StepTimeCurve({1: 1.0, 2: 1.937, 3: 2.677, 4: 3.378, 5: 4.128, 6: 4.862,
                             7: 5.61, 8: 7.747})
PROMPT = [10, 20, 30, 40]  # the fake model answers 41, 42, ...


def run(prediction, max_tokens=24, mode="auto"):
    """(output, the speculator, the runner's steps' token counts after the prefill)."""
    runner, eng = make(budget=64)
    eng.speculator = spec = Speculator(SpecConfig(mode=mode), QWEN_Q4_K_M,
                                       eng.context_length)
    eng.add_request("r", PROMPT, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                ignore_eos=True, prediction=prediction))
    out = run_all(eng)["r"]
    return out, spec, [sum(len(i.tokens) for i in step) for step in runner.steps[1:]]


def test_a_prediction_that_holds_is_drafted_once_its_shadow_shows_it():
    out, spec, steps = run(list(range(41, 81)))
    assert out == list(range(41, 65))
    # 8 plain steps while the shadow (8 drafts) is matched token by token; its observation
    # takes each position's estimate from the prior 0.9 to (1 + 0.9) / 2 = 0.95, where 3
    # drafts pay; each verification then raises the estimates, and k with them
    assert steps == [1] * 8 + [4, 5, 6]
    snapshot = spec.stats.snapshot()
    assert snapshot["chosen_k"] == {0: 8, 3: 1, 4: 1, 5: 1}
    # only real drafts are counted as drafted; the shadow taught the estimates
    assert snapshot["draft_tokens"] == snapshot["accepted_tokens"] == 12
    assert snapshot["no_draft"]["no_gain"] == 8


def test_without_shadows_the_prior_never_pays(monkeypatch):
    monkeypatch.setattr(Speculator, "_shadow", lambda *args: None)
    out, spec, steps = run(list(range(41, 81)))
    assert out == list(range(41, 65))
    assert steps == [1] * 23 and spec.stats.drafts == 0


def test_a_shadow_scores_the_tokens_up_to_the_first_miss():
    out, spec, steps = run([41, 42, 43, 44, 99, 98, 97, 96, 95, 94], max_tokens=8)
    assert out == list(range(41, 49))
    assert steps == [1] * 7  # never drafted
    est = spec.global_estimates["prediction"]
    # the first decode step's shadow is [42, 43, 44, 99, 98, 97] (6 drafts: max_tokens
    # leaves no more); the reply goes 42, 43, 44, 45: one observation, as a verification
    # of those 6 with 3 accepted would give; then the prediction is lost, no more shadows
    assert est.accepted == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert est.reached == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert spec.stats.draft_tokens == 0


def test_ngram_drafts_below_what_pays_are_drafted_once_shadows_show_them(monkeypatch):
    # a prompt that the reply repeats: n-gram drafts start at the 0.6 prior, where no draft
    # pays on the measured CPU curve, so the controller would never verify one; their
    # shadows (kept while the acceptance bound skips the controller too) show them right,
    # and drafting starts
    prompt = list(range(1, 41)) + [1, 2]

    def steps_and_k():
        runner, eng = make(budget=64)
        eng.speculator = spec = Speculator(SpecConfig(mode="auto"), MEASURED_CPU,
                                           eng.context_length)
        eng.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=36,
                                                    ignore_eos=True))
        assert run_all(eng)["r"] == list(range(3, 39))
        return ([sum(len(i.tokens) for i in step) for step in runner.steps[1:]],
                spec.stats.snapshot()["chosen_k"])

    assert steps_and_k() == ([1] * 24 + [4, 4, 3], {0: 16, 2: 1, 3: 2})
    monkeypatch.setattr(Speculator, "_shadow", lambda *args: None)
    assert steps_and_k() == ([1] * 35, {})
