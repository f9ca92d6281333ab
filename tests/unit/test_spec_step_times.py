"""The step-time curve refined online from the engine's steps: exact EWMA values for a
sequence of observed steps, per batch bucket, published only on a change, persisted."""

import pytest

import app.engine.spec_decode.step_times as st
from app.engine.spec_decode.step_times import OnlineStepTimes, batch_bucket, grid_point

BASE = {1: 0.010, 2: 0.020, 4: 0.040, 8: 0.080}


def test_batch_buckets_are_powers_of_two():
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


def test_ewma_of_clipped_observations_replaces_the_point_after_min_samples():
    online = OnlineStepTimes(BASE)
    assert online.curve(1)(2) == 0.020
    # 16 ms; 24 ms: +1/8 of the gap (17); 100 ms, clipped to 2 x 17 = 34: 19.125; 8 ms,
    # clipped to 19.125 / 2: 19.125 - 1/8 x 9.5625 = 17.9296875 (the 4th: it counts now)
    for seconds in (0.016, 0.024, 0.100):
        online.observe(2, 1, seconds)
    assert online.curve(1)(2) == 0.020  # three observations: still the profile's
    version = online.version
    online.observe(2, 1, 0.008)
    assert online.version == version + 1
    assert online.snapshot() == {1: {2: (pytest.approx(0.0179296875), 4)}}
    curve = online.curve(1)
    assert curve(2) == pytest.approx(0.0179296875)
    # the profile's other points scaled by 17.9296875 / 20: its shape at the engine's level
    assert (curve(1), curve(4), curve(3)) == (pytest.approx(0.00896484375),
                                              pytest.approx(0.0358593750),
                                              pytest.approx(0.02689453125))
    # a move under 5% publishes nothing: the same curve, the same version
    online.observe(2, 1, 0.0185)
    assert online.version == version + 1 and online.curve(1) is curve
    assert online.snapshot()[1][2] == (pytest.approx(0.0179296875 + (0.0185 - 0.0179296875) / 8), 5)


def test_a_busy_profiles_shape_is_kept_at_the_observed_level():
    """The Qwen2.5-Coder-1.5B profile found here: measured while another process loaded a
    model (t(1) 53 ms), then t(1) observed at 36.1 ms over 73 steps. Pairing that t(1) with
    the busy t(2..8) gave t(2)/t(1) 2.81 and t(8)/t(1) 12.1, and `auto` never drafted."""
    busy = {1: 0.0530, 2: 0.1016, 3: 0.1422, 4: 0.1882, 8: 0.4370}
    online = OnlineStepTimes(busy, {1: {1: (0.0361, 73), 2: (0.0700, 3)}})  # t(2): 3 only
    curve = online.curve(1)
    assert curve(1) == 0.0361
    assert {n: round(curve(n) / curve(1), 3) for n in (2, 3, 4, 8)} == {
        2: 1.917, 3: 2.683, 4: 3.551, 8: 8.245}  # the profile's own ratios
    # once t(2) counts, t(3) follows the nearer estimate: x 0.068 / 0.1016
    online.observe(2, 1, 0.068)
    curve = online.curve(1)
    assert (curve(1), curve(2)) == (0.0361, pytest.approx(0.06975))
    assert curve(3) == pytest.approx(0.1422 * 0.06975 / 0.1016)


def test_the_first_observation_is_clipped_against_the_profile():
    """A first step slowed 7x by another process (a cached t(2)/t(1) of 7.3 once came from
    one) starts the estimate at 2 x the profile's t(2), not at 7x."""
    online = OnlineStepTimes(BASE)
    online.observe(2, 1, 0.140)
    assert online.snapshot() == {1: {2: (pytest.approx(0.040), 1)}}
    online.observe(3, 1, 0.001)  # and a first one too fast: half the profile's t(3)
    assert online.snapshot()[1][3] == (pytest.approx(0.015), 1)


def test_each_batch_bucket_has_its_own_curve():
    online = OnlineStepTimes(BASE)
    for _ in range(4):
        online.observe(3, 2, 0.050)  # two sequences, three tokens
    two = online.curve(2)
    # 50 ms observed where the profile has 30 (interpolated): its points x 5/3
    assert (two(2), two(3), two(4)) == (pytest.approx(0.020 * 5 / 3), 0.050,
                                        pytest.approx(0.040 * 5 / 3))
    assert online.curve(1)(3) == 0.030 and online.curve(3)(3) == 0.030  # the profile's
    online.observe(0, 1, 0.01)  # nothing computed, or no time: ignored
    online.observe(1, 1, 0.0)
    assert online.snapshot() == {2: {3: (0.050, 4)}}


def test_long_steps_count_at_a_grid_point_so_many_sequences_learn_their_curve():
    assert [grid_point(n) for n in (8, 9, 11, 13, 14, 17, 18, 27, 28, 56, 100)] == [
        8, 10, 12, 12, 16, 16, 20, 24, 32, 64, 96]
    online = OnlineStepTimes(BASE)  # the profile's last point is 8: 80 ms
    for rows in (33, 31, 30, 34):  # 16 sequences' verify steps at 17.5 ms a row
        online.observe(rows, 16, 0.0175 * rows)
    online.observe(17, 16, 0.0175 * 17)  # a plain decode of 16, one draft
    assert online.snapshot() == {16: {32: (pytest.approx(0.0175 * 32), 4),
                                      16: (pytest.approx(0.0175 * 16), 1)}}
    curve = online.curve(16)
    assert curve(32) == pytest.approx(0.56)
    assert curve(8) == pytest.approx(0.080 * 0.56 / (0.080 * 32 / 8))  # scaled to t(32)
    # scaled by the profile's shape, not by tokens: past 8 this one is flat (2 ms a token)
    flat = OnlineStepTimes({1: 0.010, 8: 0.080, 16: 0.096})
    flat.observe(17, 16, 0.100)
    assert flat.snapshot() == {16: {16: (pytest.approx(0.100 * 0.096 / 0.098), 1)}}
    # estimates saved off the grid (before it) are dropped, not kept unchanged forever
    saved = OnlineStepTimes(BASE, {16: {17: (0.3, 9), 16: (0.28, 5)}, 1: {9: (0.09, 4)}})
    assert saved.snapshot() == {16: {16: (0.28, 5)}}


def test_estimates_persist_and_start_a_new_engine(monkeypatch):
    monkeypatch.setattr(st, "SAVE_EVERY", 2)
    saved = []
    online = OnlineStepTimes(BASE, persist=saved.append)
    online.observe(1, 1, 0.012)
    assert saved == []
    online.observe(1, 1, 0.012)
    assert saved == [{1: {1: (0.012, 2)}}]
    again = OnlineStepTimes(BASE, {1: {1: (0.012, 4)}})
    assert again.curve(1)(1) == 0.012


def test_the_engine_observes_its_decode_and_verify_steps():
    from app.engine.config import SpecConfig
    from app.engine.spec_decode.speculator import Speculator
    from tests.unit.helpers import greedy, make, run_all

    _, eng = make(budget=64)
    online = OnlineStepTimes({1: 1.0, 64: 1.01})  # flat: n-gram drafts everywhere they can
    eng.speculator = Speculator(SpecConfig(mode="auto"), None, eng.context_length,
                                online=online)
    eng.add_request("a", [10, 20, 30, 40], greedy(6))  # nothing to look up: 5 lone decodes
    eng.add_request("b", [1, 2, 3, 1, 2], greedy(3))  # answers 3: (2, 3) -> drafts 1
    run_all(eng)
    # the prefill step (9 tokens, 2 logits rows) is no point of the curve; then two steps of
    # both sequences: a's decode with b's verification of 1 + 1 draft (b's cap: one token
    # before its last), then a's and b's plain decodes (b at its limit); then a alone, 3 times
    assert {b: {n: c for n, (_, c) in pts.items()} for b, pts in online.snapshot().items()} == {
        1: {1: 3}, 2: {2: 1, 3: 1}}
