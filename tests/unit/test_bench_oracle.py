"""The speculative bench's `oracle` mode (`app.bench.spec.run_cell`): `auto` drafting the
tokens `off` gave each request, turn by turn, and `prefill_step_s`."""

from __future__ import annotations

import time

import pytest

from app.bench.spec import ORACLE, run_cell
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.types import SamplingParams
from tests.fakes.runner import FakeRunner

FLAT = StepTimeCurve({1: 1.0, 64: 1.01})
STEP_S = 0.02


class SlowRunner(FakeRunner):
    """A FakeRunner whose every step takes at least STEP_S."""

    def execute(self, items):
        time.sleep(STEP_S)
        return super().execute(items)


def params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def two_turns(i: int, replies: list[list[int]]):
    """One more turn after the first: the prompt goes on from the reply."""
    return ([5, 6] + replies[0], params(6)) if len(replies) == 1 else None


def test_the_oracle_drafts_what_off_said_in_every_turn():
    runner = SlowRunner(num_blocks=64, block_size=4, max_seqs=2)
    requests = [([10, 11], params(8))]  # the fake model counts up: 12, 13, ...
    off = run_cell(runner, requests, "off", FLAT, 128, follow=two_turns)
    assert off["tokens"] == {"0:0": list(range(12, 20)), "0:1": list(range(20, 26))}
    oracle = run_cell(runner, requests, ORACLE, FLAT, 128, follow=two_turns,
                      oracle=off["tokens"])
    assert oracle["tokens"] == off["tokens"]
    # every draft accepted, one verify step a turn: 6 and 4 drafts (a reply's last token is
    # its verify step's own)
    assert (oracle["draft_tokens"], oracle["acceptance"]) == (10, 1.0)
    assert oracle["steps"] == 4 < off["steps"] == 14
    assert off["prefill_step_s"] >= STEP_S  # the second turn's prefill


def test_one_turn_has_no_prefill_steps_and_the_oracle_needs_off():
    runner = SlowRunner(num_blocks=64, block_size=4, max_seqs=2)
    off = run_cell(runner, [([10, 11], params(4))], "off", FLAT, 128)
    assert off["prefill_step_s"] == 0.0
    with pytest.raises(ValueError, match="mode oracle needs the off cell's tokens"):
        run_cell(runner, [([10, 11], params(4))], ORACLE, FLAT, 128)


def test_a_cell_refines_the_curve_from_its_own_steps_as_the_server_does():
    from app.engine.spec_decode.step_times import OnlineStepTimes

    runner = FakeRunner(num_blocks=64, block_size=4, max_seqs=2)
    requests = [([10, 11], params(8))]
    off = run_cell(runner, requests, "off", FLAT, 128)
    online = OnlineStepTimes({1: 1.0, 64: 1.01})
    run_cell(runner, requests, ORACLE, FLAT, 128, oracle=off["tokens"], online=online)
    # the prefill step (no point: its prompt tokens have no logits) gives the first token;
    # then one verify step of 1 + 6 drafts gives the other 7: the point t(7)
    assert {b: {n: c for n, (_, c) in pts.items()} for b, pts in online.snapshot().items()
            } == {1: {7: 1}}
