"""`measure_step_times` on a fake clock: the fastest repeat per point, points taken in turn,
then lowered to be monotone; the budget cuts the first pass and the repeats."""

import app.engine.spec_decode.profile as profile
from tests.fakes.runner import FakeRunner


class _ClockRunner(FakeRunner):
    """A step of n tokens takes `cost(n)` ms on the fake clock, plus scripted noise for
    the k-th timed step (k counts from 0, the two untimed warm-up steps excluded)."""

    def __init__(self, noise: dict[int, float]):
        super().__init__(num_blocks=512, block_size=1)
        self.now = 0.0
        self.noise = noise
        self.timed: list[int] = []  # n of each step after the warm-up

    def clock(self) -> float:
        return self.now

    def execute(self, items):
        n = len(items[0].tokens)
        if len(self.steps) >= 2:
            self.now += self.noise.get(len(self.timed), 0.0) / 1000
            self.timed.append(n)
        self.now += (10 + 5 * n) / 1000
        return super().execute(items)

    def truncate(self, slot, n_tokens):
        pass


def _measure(monkeypatch, runner, **kw):
    monkeypatch.setattr(profile.time, "perf_counter", runner.clock)
    out = profile.measure_step_times(runner, **kw)
    return {n: round(t * 1000, 6) for n, t in out.items()}


def test_the_fastest_pass_counts_and_the_curve_is_monotone(monkeypatch):
    # pass 1 (steps 0-3: n = 1, 2, 3, 4): a burst slows n = 3; pass 2 (steps 4-7) slows
    # every point, pass 3 n = 3 and n = 4; each point's fastest pass is clean except
    # n = 3's, all slowed (by 20, 15 and 30 ms): 25 + 15 = 40 > t(4) = 30, lowered to 30.
    # (Medians would give 35 for both: n = 4 took 30, 35 and 70.)
    noise = {2: 20.0, 4: 50.0, 5: 50.0, 6: 15.0, 7: 5.0, 10: 30.0, 11: 40.0}
    runner = _ClockRunner(noise)
    out = _measure(monkeypatch, runner, points=(1, 2, 3, 4), repeats=3, budget_s=100.0)
    assert runner.timed == [1, 2, 3, 4] * 3  # in turn, not point by point
    assert out == {1: 15.0, 2: 20.0, 3: 30.0, 4: 30.0}
    assert runner.calls == [("release", 0, 0)]


def test_the_budget_ends_the_first_pass_and_the_repeats(monkeypatch):
    runner = _ClockRunner({})
    # budget 710 ms from before the warm-up (the 128-token prefill 650 ms, a decode 15):
    # pass 1 takes n = 1 (15 ms), 2 (20 ms), 3 (25 ms: now at 725 ms) and stops; pass 2
    # finds the deadline passed at once
    out = _measure(monkeypatch, runner, points=(1, 2, 3, 4, 5), repeats=3, budget_s=0.71)
    assert runner.timed == [1, 2, 3]
    assert out == {1: 15.0, 2: 20.0, 3: 25.0}
