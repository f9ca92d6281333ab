"""`time_steps` / `measure_step_times` on a fake clock: the core points t(1..8) first, always,
then repeats and longer points within a budget that grows with t(1); the fastest repeat per
point, made monotone. `curve_problem` / `load_profile`: a one-point, contended or stale
profile is measured again, and an untrusted measurement is never cached."""

import json

import pytest

import app.engine.spec_decode.profile as profile
import app.spec_profile as spec_profile
from app.engine.spec_decode.profile import curve_problem
from tests.fakes.runner import FakeRunner

CORE = [1, 2, 3, 4, 5, 6, 7, 8]


class _ClockRunner(FakeRunner):
    """A step of n tokens takes `cost(n)` ms on the fake clock, plus scripted noise for
    the k-th timed step (k counts from 0, the two untimed warm-up steps excluded)."""

    def __init__(self, noise: dict[int, float] | None = None, cost=lambda n: 10 + 5 * n):
        super().__init__(num_blocks=512, block_size=1)
        self.now = 0.0
        self.noise = noise or {}
        self.cost = cost
        self.timed: list[int] = []  # n of each step after the warm-up

    def clock(self) -> float:
        return self.now

    def execute(self, items):
        n = len(items[0].tokens)
        if len(self.steps) >= 2:
            self.now += self.noise.get(len(self.timed), 0.0) / 1000
            self.timed.append(n)
        self.now += self.cost(n) / 1000
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


def test_the_core_pass_ignores_the_budget_which_ends_the_repeats(monkeypatch):
    # budget max(50 ms, 4 x t(1) = 60 ms) from the first timed step; the core pass takes
    # 15 + 20 + 25 + 30 = 90 ms whatever the budget, and nothing follows it
    runner = _ClockRunner()
    out = _measure(monkeypatch, runner, points=(1, 2, 3, 4, 10, 12), repeats=3,
                   budget_s=0.05, budget_steps=4)
    assert runner.timed == [1, 2, 3, 4]
    assert out == {1: 15.0, 2: 20.0, 3: 25.0, 4: 30.0}


def test_a_90_ms_step_still_measures_t1_to_t8(monkeypatch):
    # t(n) = 90 n ms: the core pass alone takes 3.24 s, over the 3 s budget; the budget is
    # 60 x t(1) = 5.4 s, so the second pass runs n = 1..7 (its n = 7 starts at 5.13 s)
    runner = _ClockRunner(cost=lambda n: 90 * n)
    out = _measure(monkeypatch, runner)
    assert runner.timed == CORE + CORE[:7]
    assert out == {n: 90.0 * n for n in CORE}


def test_longer_points_follow_the_core_repeats(monkeypatch):
    runner = _ClockRunner()
    out = _measure(monkeypatch, runner, points=(1, 2, 10, 12), repeats=2, budget_s=100.0)
    assert runner.timed == [1, 2, 1, 2, 10, 12, 10, 12]
    assert out == {1: 15.0, 2: 20.0, 10: 60.0, 12: 70.0}


def test_curve_problems():
    assert curve_problem({1: 0.218}, CORE) == "1 point(s), t(2, 3, 4, 5, 6, 7, 8) missing"
    ok = {n: 0.010 * (1 + 0.5 * (n - 1)) for n in CORE}
    assert curve_problem(ok, CORE) is None
    assert curve_problem({**ok, 2: 0.16}, CORE) == (
        "t(2)/t(1) = 16.0 > 4: measured while the machine was busy")
    # t(3) 47 ms over t(4) 30 ms: more than 1.5x; 44 ms is noise the curve lowers away
    assert curve_problem({**ok, 3: 0.047, 4: 0.030}, CORE) == (
        "t(3) = 47.0 ms > 1.5 x t(4) = 30.0 ms: measured while the machine was busy")
    assert curve_problem({**ok, 3: 0.044, 4: 0.030}, CORE) is None


def _setup(monkeypatch, tmp_path, runner):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    monkeypatch.setattr(profile.time, "perf_counter", runner.clock)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    return model, spec_profile.profile_path(runner, model, "fake")


def test_a_one_point_cache_is_measured_again_and_replaced(monkeypatch, tmp_path):
    runner = _ClockRunner()
    model, path = _setup(monkeypatch, tmp_path, runner)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"step_seconds": {"1": 0.218}}))
    p = spec_profile.load_profile(runner, model, "fake")
    assert not p.cached and p.trusted
    assert sorted(p.points)[:8] == CORE and p.points[1] == pytest.approx(0.015)
    assert json.loads(path.read_text())["step_seconds"]["8"] == pytest.approx(0.05)
    # read back as it was written: from the cache, no step run
    runner.timed.clear()
    again = spec_profile.load_profile(runner, model, "fake")
    assert again.cached and again.points == p.points and runner.timed == []


def test_a_stale_cache_is_measured_again(monkeypatch, tmp_path):
    runner = _ClockRunner()
    model, path = _setup(monkeypatch, tmp_path, runner)
    spec_profile.load_profile(runner, model, "fake")
    body = json.loads(path.read_text())
    body["online"] = {"1": {"1": [0.045, 4]}}  # the engine saw t(1) = 45 ms, measured 15
    path.write_text(json.dumps(body))
    assert spec_profile.stale({1: 0.015}, {1: {1: (0.045, 4)}}) == (
        "the engine's steps took 45.0 ms for t(1), measured 15.0 ms")
    assert spec_profile.stale({1: 0.015}, {1: {1: (0.045, 3)}}) is None  # too few yet
    p = spec_profile.load_profile(runner, model, "fake")
    assert not p.cached and p.online == {}


def test_a_cache_whose_observations_make_a_contended_curve_is_measured_again(monkeypatch,
                                                                             tmp_path):
    runner = _ClockRunner()
    model, path = _setup(monkeypatch, tmp_path, runner)
    spec_profile.load_profile(runner, model, "fake")
    body = json.loads(path.read_text())
    # as found in a user's store: t(1) as measured, t(2) observed at 7.3 x that
    body["online"] = {"1": {"1": [0.0150, 4114], "2": [0.1095, 73]}}
    path.write_text(json.dumps(body))
    assert spec_profile.stale({1: 0.015, 2: 0.025}, {1: {1: (0.015, 4114), 2: (0.1095, 73)}}) \
        == ("with the engine's observations, t(2)/t(1) = 7.3 > 4: measured while the machine "
            "was busy")
    assert spec_profile.stale({1: 0.015, 2: 0.025}, {1: {2: (0.1095, 3)}}) is None  # too few
    assert spec_profile.stale({1: 0.015, 2: 0.025}, {1: {2: (0.030, 9)}}) is None
    p = spec_profile.load_profile(runner, model, "fake")
    assert not p.cached and p.online == {}


def test_a_contended_measurement_is_used_but_never_cached(monkeypatch, tmp_path):
    runner = _ClockRunner(cost=lambda n: 10 if n == 1 else 50 * n)  # t(2)/t(1) = 10
    model, path = _setup(monkeypatch, tmp_path, runner)
    p = spec_profile.load_profile(runner, model, "fake")
    assert not p.trusted and p.points[2] == pytest.approx(0.1)
    assert [len(step[0].tokens) for step in runner.steps].count(128) == 2  # measured twice
    assert not path.exists()
    assert p.online_times().persist is None  # nor do its online estimates get saved


def test_exact_mode_has_a_curve_of_its_own(tmp_path):
    """Exact mode runs another llama.cpp library without flash attention: its steps take
    other times, so its curve is cached under another key; the default key is unchanged."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    runner = FakeRunner(num_blocks=8, block_size=1)
    default = spec_profile.profile_key(model, "llamacpp", runner)
    runner.exact = False
    assert spec_profile.profile_key(model, "llamacpp", runner) == default
    runner.exact = True
    assert spec_profile.profile_key(model, "llamacpp", runner) != default


def test_flash_attention_off_has_a_curve_of_its_own(tmp_path):
    """Without flash attention a multi-token step costs another share of one (README,
    "Predicted Outputs on a whole file"); auto and on keep the key profiles had."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    runner = FakeRunner(num_blocks=8, block_size=1)
    default = spec_profile.profile_key(model, "llamacpp", runner)
    keys = {}
    for fa in ("auto", "on", "off"):
        runner.flash_attn = fa
        keys[fa] = spec_profile.profile_key(model, "llamacpp", runner)
    assert keys["auto"] == keys["on"] == default != keys["off"]


def _write_profile(directory, name, model, backend, points, online=None, mtime=0.0):
    import os

    path = directory / name
    path.write_text(json.dumps({"model": model, "backend": backend,
                                "step_seconds": {str(n): t for n, t in points.items()},
                                "online": online or {}}))
    os.utime(path, (mtime, mtime))
    return path


def test_the_cached_curve_doctor_shows_is_the_models_newest(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    profiles = tmp_path / "models" / "profiles"
    profiles.mkdir(parents=True)
    assert spec_profile.store_dir() == tmp_path / "models"
    linear = {n: (10 + 5 * n) / 1000 for n in CORE}  # t(n) = 10 + 5n ms
    _write_profile(profiles, "a.json", "m.gguf", "llamacpp", {1: 0.01, 2: 0.02}, mtime=100)
    newest = _write_profile(profiles, "b.json", "m.gguf", "llamacpp", linear, mtime=200)
    _write_profile(profiles, "c.json", "other.gguf", "llamacpp", linear, mtime=300)
    _write_profile(profiles, "d.json", "m.gguf", "mlx", linear, mtime=400)
    (profiles / "e.json").write_text("{")  # unreadable: skipped
    c = spec_profile.cached_curve("m.gguf", "llamacpp")
    assert (c.path, c.profiles, c.problem) == (newest, 2, None)
    assert c.ratios == {2: 1.333, 3: 1.667, 4: 2.0, 5: 2.333, 6: 2.667, 7: 3.0, 8: 3.333}
    # k = 1 pays above 1/3 (1 + a > 4/3); k = 2 needs 1 + a + a^2 > 5/3, a > 0.457
    assert c.break_even() == (0.333, 1)
    assert spec_profile.cached_curve("m.gguf", "fake") is None
    # the engine has seen t(1) at 45 ms against 15 measured: doctor says it is stale
    _write_profile(profiles, "f.json", "m.gguf", "llamacpp", linear, mtime=500,
                   online={"1": {"1": [0.045, 50]}})
    assert spec_profile.cached_curve("m.gguf", "llamacpp").problem == (
        "the engine's steps took 45.0 ms for t(1), measured 15.0 ms")


def test_break_even_takes_the_cheapest_draft_length():
    def curve(**ratios):
        full = {n: float(n) for n in range(2, 9)}  # t(n) = n t(1): nothing pays
        full.update({int(k[1:]): r for k, r in ratios.items()})
        return spec_profile.CachedCurve(None, 1, full, None)

    assert curve().break_even() is None
    assert curve(n2=1.5).break_even() == (0.5, 1)
    assert curve(n2=2.0, n3=1.75).break_even() == (0.5, 2)  # 1 + a + a^2 = 1.75
    assert curve(n2=1.9, n3=1.75).break_even() == (0.5, 2)  # k = 1 needs 90%


def test_doctor_says_a_one_point_profile_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    profiles = tmp_path / "models" / "profiles"
    profiles.mkdir(parents=True)
    _write_profile(profiles, "a.json", "m.gguf", "llamacpp", {1: 0.218})
    c = spec_profile.cached_curve("m.gguf", "llamacpp")
    assert c.problem == "1 point(s), t(2, 3, 4, 5, 6, 7, 8) missing"
    assert c.ratios[2] == 2.0 and c.break_even() is None  # extrapolated: t(n) = n t(1)
