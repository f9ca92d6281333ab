"""`tandem doctor`'s fact collection on this machine."""

from __future__ import annotations

from backends import select


def test_doctor_collects_without_failing():
    from app.commands.doctor import collect

    facts = collect()
    assert facts["backend"] in select.BACKENDS
    assert facts["reason"]


def test_doctor_says_where_the_exact_library_is(tmp_path, monkeypatch):
    from app.commands.doctor import llamacpp_facts
    from backends.llamacpp.exact import LIB_ENV

    monkeypatch.setenv(LIB_ENV, str(tmp_path))
    assert llamacpp_facts()["exact_library"] is None
    (tmp_path / "libllama.so").write_bytes(b"")
    assert llamacpp_facts()["exact_library"] == str(tmp_path)


def test_doctor_line_for_the_step_time_curve():
    from app.commands.doctor import _curve_advice

    ratios = {"2": 1.92, "3": 2.35, "4": 2.89, "5": 3.5, "6": 4.1, "7": 4.7, "8": 5.29}
    assert _curve_advice({"path": "/p.json", "profiles": 2, "ratios": ratios,
                          "break_even": (0.764, 2), "problem": None}) == (
        "t(2)/t(1) 1.92 · t(4)/t(1) 2.89 · t(8)/t(1) 5.29, newest of 2 cached: drafts pay "
        "above 76% acceptance per token (2 at a time), so `--spec auto` drafts only where its "
        "estimate beats that")
    assert _curve_advice({"path": "/p.json", "profiles": 1, "ratios": ratios,
                          "break_even": None, "problem": "t(2) missing"}) == (
        "t(2)/t(1) 1.92 · t(4)/t(1) 2.89 · t(8)/t(1) 5.29: no draft pays on it; measured "
        "again on next use: t(2) missing")
    assert _curve_advice(None).startswith("not measured yet")
