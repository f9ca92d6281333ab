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
